"""Streamable-HTTP mode for headless servers: bearer token, loopback-only without one, DNS-rebinding
protection, and an unauthenticated /health route."""
from __future__ import annotations

import hmac
import ipaddress

from mcp.server.transport_security import TransportSecuritySettings

TOKEN_ENV = "VAPO_MCP_TOKEN"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """Pure ASGI middleware: every HTTP request except /health needs `Authorization: Bearer <token>`."""

    def __init__(self, app, token: str | None, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.token, self.open_paths = app, token, open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.token or scope.get("path") in self.open_paths:
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), self.token):
            return await self.app(scope, receive, send)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body",
                    "body": b'{"error": "missing or wrong bearer token (Authorization: Bearer $VAPO_MCP_TOKEN)"}'})


def security_settings(host: str, allowed_hosts: list[str]) -> TransportSecuritySettings:
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*", *(f"{h}:*" for h in [host, *allowed_hosts]
                                                         if h not in ("0.0.0.0", "::"))]
    origins = [f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


def http_app(server, *, host: str, token: str | None, allowed_hosts: list[str] = (), path: str = "/mcp"):
    """The ASGI app: MCP at `path`, /health open, everything else behind the bearer token."""
    if not token and not is_loopback(host):
        raise PermissionError(f"refusing to bind {host} without a bearer token: export {TOKEN_ENV}=<a long "
                              "random secret> (clients send Authorization: Bearer <it>), or bind 127.0.0.1")
    app = server.streamable_http_app(streamable_http_path=path, host=host,
                                     transport_security=security_settings(host, list(allowed_hosts)))
    return BearerAuth(app, token)


def serve_http(server, *, host: str, port: int, token: str | None, allowed_hosts: list[str] = (),
               log_level: str = "info") -> None:
    import uvicorn
    app = http_app(server, host=host, token=token, allowed_hosts=allowed_hosts)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
