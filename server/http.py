"""Streamable-HTTP mode for headless servers: bearer token (of at least `MIN_TOKEN_CHARS` characters),
loopback-only without one, DNS-rebinding protection, and an unauthenticated /health route.

Slow clients are bounded at every stage: the request head by the header timeout (header_timeout.py), the body
by `--body-timeout` (default `BODY_TIMEOUT_S`; 408 and the connection closed) and `MAX_BODY` (413), an idle
keep-alive connection by `KEEP_ALIVE_S`, the crowd by the admission (admission.py: `MAX_CONNECTIONS` connections
that sent the token, a smaller budget per address and in all for those that have not, so they cannot hold the
server shut; /health is always answered). The Host (and Origin) header must be well-formed and name this server;
the bearer token is checked on the headers, before any of the body is read."""
from __future__ import annotations

import hmac

from mcp.server.transport_security import TransportSecuritySettings

from vapo_engine.serving.admission import Admission, Admitted
from vapo_engine.serving.limits import BODY_TIMEOUT_S, BodyTimeout
from vapo_engine.serving.security import (
    MIN_TOKEN_CHARS,
    TOKEN_ENV,
    allowed_host_names,
    check_bind,
    host_allowed,
)

__all__ = ["BODY_TIMEOUT_S", "MAX_BODY", "MIN_TOKEN_CHARS", "TOKEN_ENV", "check_token", "http_app", "serve_http"]
check_token = check_bind
"""One set of bind rules for both servers (this MCP server and serve-model): vapo_engine.serving.security."""
SESSION_IDLE_S, MAX_SESSIONS = 600.0, 256
"""An MCP session nobody used for 10 minutes is closed; at most this many live at once (the SDK answers the
next one with an error until one expires)."""
MAX_CONNECTIONS, KEEP_ALIVE_S = 256, 5
"""Connections of clients with the token at once (beyond: 503), and how long an idle keep-alive connection is
held. A connection that does not finish its request headers in time is closed too (header_timeout.py)."""
MAX_BODY = 16 * 1024 * 1024
"""The largest request body (an MCP message) accepted; a larger one gets 413."""
UNAUTHORIZED = b'{"error": "missing or wrong bearer token (Authorization: Bearer $VAPO_MCP_TOKEN)"}'
FOREIGN_HOST = (b'{"error": "the Host or Origin header does not name this server (DNS-rebinding protection); connect '
                b'to 127.0.0.1, or restart the server with --allowed-host <the name clients use>"}')


class HostCheck:
    """Pure ASGI middleware: the Host header (and the Origin header, when sent) must be well-formed — no userinfo,
    a numeric port — and name this server (421 otherwise); /health answers any Host (a monitor may use the
    address). The SDK's own check matches `name:*` by prefix, so it took `Host: 127.0.0.1:1@evil.com`."""

    def __init__(self, app, allowed: frozenset[str] | None, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.allowed, self.open_paths = app, allowed, open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.open_paths \
                or host_allowed(scope, self.allowed, origin=True):
            return await self.app(scope, receive, send)
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": FOREIGN_HOST})


class BearerAuth:
    """Pure ASGI middleware: every HTTP request except /health needs `Authorization: Bearer <token>`.
    The comparison is on bytes and constant-time, so any header (non-ASCII too) gets 401, never a crash."""

    def __init__(self, app, token: str | None, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.open_paths = app, open_paths
        self.token = token.encode("utf-8") if token else None

    def authorized(self, scope) -> bool:
        given = b""
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                given = value
                break
        scheme, _, credential = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self.token)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.token or scope.get("path") in self.open_paths \
                or self.authorized(scope):
            return await self.app(scope, receive, send)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": UNAUTHORIZED})


def security_settings(host: str, allowed_hosts: list[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection: the Host (and Origin) must name this server — a loopback name, the bind
    address or an `--allowed-host` — with any port or none (a reverse proxy on port 80/443 sends the bare
    name)."""
    names = ["127.0.0.1", "localhost", "[::1]", *(h for h in [host, *allowed_hosts] if h not in ("0.0.0.0", "::"))]
    hosts = [form for h in dict.fromkeys(names) for form in (f"{h}:*", h)]
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


def http_app(server, *, host: str, token: str | None, allowed_hosts: list[str] = (), path: str = "/mcp",
             body_timeout_s: float = BODY_TIMEOUT_S, admission: Admission | None = None):
    """The ASGI app: MCP at `path`, /health open, everything else behind the Host check and the bearer token
    (checked first, on the headers); then the connection is admitted (`admission`, shared with the connection
    protocol) and the request body must arrive within `body_timeout_s` (else 408, connection closed)."""
    check_token(host, token)
    app = server.streamable_http_app(streamable_http_path=path, host=host,
                                     transport_security=security_settings(host, list(allowed_hosts)),
                                     session_idle_timeout=SESSION_IDLE_S, max_sessions=MAX_SESSIONS)
    inner = Admitted(BodyTimeout(app, body_timeout_s, limit=MAX_BODY), admission or Admission(MAX_CONNECTIONS))
    return HostCheck(BearerAuth(inner, token), allowed_host_names(host, list(allowed_hosts)))


def serve_http(server, *, host: str, port: int, token: str | None, allowed_hosts: list[str] = (),
               log_level: str = "info", body_timeout_s: float = BODY_TIMEOUT_S) -> None:
    import uvicorn

    from vapo_engine.serving.header_timeout import protocol
    from vapo_engine.serving.listen import bind_listen_socket
    sock = bind_listen_socket(host, port)  # a port in use or out of range: one error naming it, exit 2
    admission = Admission(MAX_CONNECTIONS)
    app = http_app(server, host=host, token=token, allowed_hosts=allowed_hosts, body_timeout_s=body_timeout_s,
                   admission=admission)
    config = uvicorn.Config(app, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S,
                            http=protocol(admission=admission))
    uvicorn.Server(config).run(sockets=[sock])
