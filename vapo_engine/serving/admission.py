"""Who gets a connection slot on both HTTP servers (`vapo-mcp serve --http` and `serve-model`): a peer that has not
authenticated cannot hold the server shut.

uvicorn's own limit (`limit_concurrency`) counts every open connection, so 256 connections that never send a
request head — or never send the token — kept every request, `/health` too, at 503. Here a connection is
*pending* from connect until its first request head carrying the right token arrives; then it is *admitted*:

- pending connections have a budget of their own, `pending` in all and `per_peer` per client address; one more
  closes the oldest pending connection (of that address first). A real client sends its head within
  milliseconds of connecting, so it is never the oldest for long; a half-open connection is the one that goes;
- admitted connections — the token's holders — may be `admitted` at once; beyond that a request gets 503 with
  `Retry-After: 1`;
- `GET /health` is answered on any connection, admitted or not (monitoring sees a crowded server as up).

`Admission` is the shared state; the connection protocol (header_timeout.protocol) reports opens and closes,
`Admitted` (ASGI middleware, inside the token check) admits on a request's head. A connection the protocol did not
register (another server class) is not limited here. Torch-free.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable

ADMITTED, PENDING, PER_PEER = 256, 64, 16
"""Defaults: connections of clients that sent the token; connections that have not (yet); of those, per address."""


class Admission:
    def __init__(self, admitted: int = ADMITTED, pending: int = PENDING, per_peer: int = PER_PEER):
        self.max_admitted, self.max_pending, self.per_peer = max(1, admitted), max(1, pending), max(1, per_peer)
        self._pending: OrderedDict[tuple, Callable[[], None]] = OrderedDict()
        self._admitted: set[tuple] = set()
        self.evicted = 0
        """Pending connections closed to make room (a count for /health and the bench)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def admitted(self) -> int:
        return len(self._admitted)

    def opened(self, key, close: Callable[[], None]) -> None:
        """A connection from `key` = (address, port) opened; `close()` closes it."""
        if key is None:
            return
        self._pending[key] = close
        same = [k for k in self._pending if k[0] == key[0]]
        if len(same) > self.per_peer:
            self._evict(same[0])
        if len(self._pending) > self.max_pending:
            self._evict(next(iter(self._pending)))

    def closed(self, key) -> None:
        self._pending.pop(key, None)
        self._admitted.discard(key)

    def admit(self, key) -> bool:
        """Whether the connection `key`, whose request head carries the token, may be served."""
        if key is None or key in self._admitted or key not in self._pending:
            return True
        if len(self._admitted) >= self.max_admitted:
            return False
        del self._pending[key]
        self._admitted.add(key)
        return True

    def _evict(self, key) -> None:
        close = self._pending.pop(key)
        self.evicted += 1
        close()


def _key(scope) -> tuple | None:
    client = scope.get("client")
    return tuple(client) if client else None


class Admitted:
    """ASGI middleware: admit the connection of each request (except `open_paths`) or answer 503. Put it inside the
    token check, so only requests with the token are admitted. `error(message, code)` makes the JSON body."""

    def __init__(self, app, admission: Admission, open_paths: tuple[str, ...] = ("/health",),
                 error: Callable[[str, str], bytes] | None = None):
        self.app, self.admission, self.open_paths = app, admission, open_paths
        self.error = error or (lambda message, code: json.dumps({"error": message, "code": code}).encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.open_paths or self.admission.admit(_key(scope)):
            return await self.app(scope, receive, send)
        body = self.error(f"the server is serving {self.admission.max_admitted} authenticated connections, its "
                          "limit; retry in a moment or close idle connections", "server_busy")
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
