"""How much evaluation one server runs at once and sends on the API key (docs/security.md "Bounds").

An `evaluate` call holds a worker process (local backend, ~400 MB) or sends up to problems × (1 + samples)
chat requests on the channel's key (up to 17,000 for one call at the tool's caps). A client — plain calls or
tasks, one session or many — must not be able to multiply that without limit, so every evaluate call of a server
passes its `EvalGate`:

- at most `running` evaluations run at once; up to `queued` more wait for a turn; one more is refused at once with
  a message that says so (`EvalBusy`);
- a call's planned channel requests are reserved against `requests_per_hour`, a rolling hour of this server's
  budget; a call that would exceed what is left is refused before it sends anything (`EvalBudget`). When it
  ends — finished, failed or cancelled — only the requests it actually sent stay counted.

Plain asyncio/anyio state of one server process; no mcp, no torch.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from .paths import ToolInputError

RUNNING, QUEUED = 2, 8
"""Evaluations of one server that run at once, and that may wait for a turn."""
REQUESTS_PER_HOUR = 20_000
"""Default channel requests evaluate calls of one server may send in any rolling hour (`vapo-mcp serve
--eval-requests-per-hour`)."""
HOUR = 3600.0


class EvalBusy(ToolInputError):
    """Too many evaluations running and waiting."""


class EvalBudget(ToolInputError):
    """The call would send more channel requests than the server's budget has left."""


@dataclass(eq=False)
class Reservation:
    planned: int
    sent: int = 0

    def count_request(self) -> None:
        self.sent += 1


class EvalGate:
    def __init__(self, running: int = RUNNING, queued: int = QUEUED, requests_per_hour: int = REQUESTS_PER_HOUR,
                 clock=time.monotonic):
        self.running, self.queued, self.budget = max(1, running), max(0, queued), max(0, requests_per_hour)
        self._limiter = anyio.CapacityLimiter(self.running)
        self._clock = clock
        self._inside = 0
        self._spent: deque[tuple[float, int]] = deque()
        self._reserved: list[Reservation] = []

    @property
    def capacity(self) -> int:
        """Evaluations that may be running or waiting at once."""
        return self.running + self.queued

    @property
    def inside(self) -> int:
        return self._inside

    def left(self) -> int:
        """Requests the budget has left now: the rolling hour's sent requests and current reservations off."""
        now = self._clock()
        while self._spent and self._spent[0][0] <= now - HOUR:
            self._spent.popleft()
        used = sum(n for _, n in self._spent) + sum(max(r.planned, r.sent) for r in self._reserved)
        return max(0, self.budget - used)

    def busy_message(self) -> str:
        return (f"too many evaluations: {self.running} are running and {self.queued} waiting, this server's bound; "
                "wait for one to finish (tasks/get or the call's answer) or cancel one (tasks/cancel), then call "
                "again")

    @asynccontextmanager
    async def admitted(self, requests: int):
        """Hold a turn for one evaluation planning `requests` channel requests (0 for the local backend); yields
        its `Reservation` (count each request sent with `count_request`)."""
        if self._inside >= self.capacity:
            raise EvalBusy(self.busy_message())
        if requests > (left := self.left()):
            raise EvalBudget(f"this evaluation would send up to {requests} requests on the API key, but this "
                             f"server's budget has {left} of {self.budget} left for the next hour; ask for fewer "
                             "problems (num_problems) or samples (samples_per_problem), wait, or restart the server "
                             "with a larger --eval-requests-per-hour")
        mine = Reservation(requests)
        self._inside += 1
        self._reserved.append(mine)
        try:
            async with self._limiter:
                yield mine
        finally:
            self._inside -= 1
            self._reserved.remove(mine)
            if mine.sent:
                self._spent.append((self._clock(), mine.sent))
