"""Who may talk to a served model: loopback by default, a bearer token for any other bind, and a Host-header
check against DNS rebinding. `vapo-mcp serve --http` (server/http.py) uses these same bind rules, with errors in the OpenAI shape so that OpenAI clients show them.

- `check_bind(host, token)`: refuse a non-loopback bind without `VAPO_MCP_TOKEN`, and a token too short.
- `Guard`: pure ASGI middleware. Every request except `GET /health` needs `Authorization: Bearer <token>`
  when a token is set (constant-time comparison on bytes), and every request's Host header must name the
  server (loopback names, the bind address, `--allowed-host` names; `*` accepts any).
Torch-free.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import re
from urllib.parse import urlsplit

from vapo_engine.childenv import TOKEN_ENV
from vapo_engine.errors import UserError

MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MAKE_TOKEN = f"export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"


def is_loopback(host: str) -> bool:
    """True for a loopback bind address (0.0.0.0 and :: are every interface, not loopback)."""
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    if not token and not is_loopback(host):
        raise UserError(f"refusing to listen on {host} without a bearer token: {MAKE_TOKEN} (clients send it as "
                        "their API key: Authorization: Bearer <it>), or bind 127.0.0.1")
    if token and len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"{TOKEN_ENV} is too short ({len(token)} characters; at least {MIN_TOKEN_CHARS} needed): "
                        f"generate a random one with {MAKE_TOKEN}")


def allowed_host_names(bind: str, extra: list[str] | tuple[str, ...] = ()) -> frozenset[str] | None:
    """Host names (without port) the Host header may carry; None = any (`*` among `extra`)."""
    if "*" in extra:
        return None
    names = {*LOOPBACK_NAMES, *(h.lower().strip("[]") for h in extra)}
    if bind not in ("0.0.0.0", "::", ""):
        names.add(bind.lower().strip("[]"))
    return frozenset(names)


_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?")


def host_name(value: bytes | str | None) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]:port`), lower-cased; None for anything else — a
    userinfo part (`127.0.0.1:1@evil.com`), a port that is not a number in 1–65535, stray characters."""
    if value is None:
        return None
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip().lower()
    m = _HOST.fullmatch(text)
    if m is None or (m["port"] is not None and not 0 < int(m["port"]) < 65536):
        return None
    return m["v6"] or m["name"]


def origin_host(value: bytes | str) -> str | None:
    """The host of an Origin header (`scheme://host[:port]`), or None when it is not exactly that."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    try:
        parts = urlsplit(text.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return None
    return host_name(parts.netloc)


def header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value
    return None


def host_allowed(scope, allowed: frozenset[str] | None, *, origin: bool = False) -> bool:
    """Whether the request's Host header (and with `origin`, its Origin header when sent) is well-formed and names
    an allowed host (`allowed` None: any well-formed one)."""
    names = [host_name(header(scope, b"host"))]
    if origin and (given := header(scope, b"origin")) is not None:
        names.append(origin_host(given))
    return all(n is not None and (allowed is None or n in allowed) for n in names)


def error_body(message: str, code: str, type_: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


class Guard:
    """ASGI middleware: Host check, then the bearer token (see the module docstring)."""

    def __init__(self, app, *, token: str | None, allowed_hosts: frozenset[str] | None,
                 open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.allowed, self.open_paths = app, allowed_hosts, open_paths
        self.token = token.encode("utf-8") if token else None

    def _authorized(self, scope) -> bool:
        scheme, _, credential = (header(scope, b"authorization") or b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self.token)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not host_allowed(scope, self.allowed):
            return await _refuse(send, 421, error_body(
                "the Host header does not name this server (DNS-rebinding protection); connect to 127.0.0.1, or "
                "restart serve-model with --allowed-host <the name clients use>", "invalid_host"))
        if self.token and scope.get("path") not in self.open_paths and not self._authorized(scope):
            return await _refuse(send, 401, error_body(
                f"missing or wrong bearer token: send Authorization: Bearer ${TOKEN_ENV} (set it as the client's "
                "API key)", "invalid_api_key", "authentication_error"), auth=True)
        return await self.app(scope, receive, send)


async def _refuse(send, status: int, body: bytes, auth: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if auth:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
