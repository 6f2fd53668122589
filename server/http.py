"""Streamable-HTTP mode for headless servers: bearer token (of at least `MIN_TOKEN_CHARS` characters),
loopback-only without one, DNS-rebinding protection, and an unauthenticated /health route."""
from __future__ import annotations

import hmac
import ipaddress

from mcp.server.transport_security import TransportSecuritySettings

from vapo_engine.errors import UserError

TOKEN_ENV = "VAPO_MCP_TOKEN"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
MAKE_TOKEN = f"export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
UNAUTHORIZED = b'{"error": "missing or wrong bearer token (Authorization: Bearer $VAPO_MCP_TOKEN)"}'


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(host: str, token: str | None) -> None:
    """Refuse a public bind without a token, and any bind with a token too short to resist guessing."""
    if not token and not is_loopback(host):
        raise UserError(f"refusing to bind {host} without a bearer token: {MAKE_TOKEN} (clients send "
                        "Authorization: Bearer <it>), or bind 127.0.0.1")
    if token and len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"{TOKEN_ENV} is too short ({len(token)} characters; at least {MIN_TOKEN_CHARS} needed): "
                        f"generate a random one with {MAKE_TOKEN}")


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
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", *(f"{h}:*" for h in [host, *allowed_hosts]
                                                         if h not in ("0.0.0.0", "::"))]
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


def http_app(server, *, host: str, token: str | None, allowed_hosts: list[str] = (), path: str = "/mcp"):
    """The ASGI app: MCP at `path`, /health open, everything else behind the bearer token."""
    check_token(host, token)
    app = server.streamable_http_app(streamable_http_path=path, host=host,
                                     transport_security=security_settings(host, list(allowed_hosts)))
    return BearerAuth(app, token)


def serve_http(server, *, host: str, port: int, token: str | None, allowed_hosts: list[str] = (),
               log_level: str = "info") -> None:
    import uvicorn
    app = http_app(server, host=host, token=token, allowed_hosts=allowed_hosts)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
