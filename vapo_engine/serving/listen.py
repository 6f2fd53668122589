"""The listening socket of a server (serve-model, the MCP server over HTTP), bound before uvicorn starts so
that a port in use, a privileged port or an address this host does not have is one user error naming the
address and the fix, not uvicorn's log lines and exit 1 (or a traceback for an out-of-range port)."""
from __future__ import annotations

import errno
import socket

from vapo_engine.errors import UserError

MAX_PORT = 65535


def bind_listen_socket(host: str, port: int, *, flag: str = "--port") -> socket.socket:
    """A socket bound to (host, port), SO_REUSEADDR like uvicorn's own; `UserError` when that is not possible."""
    if not 0 <= port <= MAX_PORT:
        raise UserError(f"{flag} {port}: not a port number; pass one in 1..{MAX_PORT} (0 = any free one)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        code = getattr(e, "errno", None)
        why = {errno.EADDRINUSE: "the port is already in use (another server is listening there)",
               errno.EACCES: "permission denied (ports below 1024 need root)",
               errno.EADDRNOTAVAIL: "this machine has no such address"}.get(code, getattr(e, "strerror", None)
                                                                            or str(e))
        fix = "pass --host with an address of this machine" if code == errno.EADDRNOTAVAIL else \
            f"stop what listens there or pick another {flag} (0 = any free one)"
        raise UserError(f"cannot listen on {host}:{port}: {why}. Fix: {fix}") from None
    return sock
