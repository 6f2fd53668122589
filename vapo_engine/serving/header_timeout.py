"""A header timeout for both HTTP servers (the MCP server's `--http` mode and `serve-model`).

uvicorn's h11 protocol closes a keep-alive connection that stays idle between requests, but not one that has
started a request and then trickles its headers (or sends nothing at all after connecting): each such
connection is held until the client goes away, so a few hundred of them use up the connection limit. The
protocol class returned here closes a connection whose request headers are not complete `seconds` after the
connection opened or after the previous response finished. A request in progress (a long tool call, a
streamed answer) is never cut: the timer only runs while the server waits for a new request's headers.

With an `Admission` (admission.py) the protocol also reports each connection's open and close to it, so a peer
that has not authenticated cannot take the slots of those who have.
"""
from __future__ import annotations

HEADER_TIMEOUT_S = 15.0
"""Seconds a client has to send a complete request head, from connect or from the end of the last response."""


def protocol(seconds: float = HEADER_TIMEOUT_S, admission=None) -> type:
    """uvicorn's h11 protocol with the header timeout (and `admission`'s bookkeeping); pass it as
    `uvicorn.Config(..., http=protocol(), limit_concurrency=None)` — the admission replaces uvicorn's limit."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()
            if admission is not None:
                admission.opened(self.client, transport.close)

        def _waiting(self) -> bool:
            """True while no request is in progress: before the first one, or after a response finished."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._head_of = self.cycle  # a new request replaces this cycle once its headers are parsed
            self._head_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            timer, self._head_timer = getattr(self, "_head_timer", None), None
            if timer is not None:
                timer.cancel()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._head_of:  # the headers of a new request are complete
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request already buffered
            if not self.transport.is_closing() and self._waiting():
                self._disarm()
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if admission is not None:
                admission.closed(self.client)
            super().connection_lost(exc)

        def _expire(self) -> None:
            self._head_timer = None
            if self._waiting() and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
