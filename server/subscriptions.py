"""Subscriptions to the run resources: who is told when a run changes, and how much a client may ask for.

Subscribers are told when a run changes state or logs an evaluation: `RunWatch` polls the read model of runs
every `POLL_S` seconds, only while someone is subscribed — over `subscriptions/listen` (2026-07-28: the SDK's
bus, counted here) or `resources/subscribe` (2025-11-25 and earlier) — and sends `notifications/resources/updated`
for the list and the run's status, metrics, log and plot.

What a client may subscribe to is bounded (docs/security.md "Bounds"): a URI is `vapo://runs` or one of a run's
notified URIs (`vapo://runs/<id>`, `/metrics`, `/log`, `/plot.png`) of a run that exists (and, over HTTP, whose
folder is inside the allowed roots: the run resources' own check), at most `MAX_URI` characters; a connection
holds at most `PER_CLIENT` of them and the server `IN_ALL`; a `subscriptions/listen` stream names at most
`PER_CLIENT` and at most `MAX_STREAMS` streams are open. A connection's subscriptions end with it (an HTTP
session deleted or expired, a stdio client gone). Imports no torch.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import anyio
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    UnsubscribeRequestParams,
)

from tools import run_resources as contents
from tools import training
from tools.paths import files, known_secrets
from vapo_engine.providers.redaction import public_message

from . import arguments as arguments_text
from . import sdk
from .resources import PARTS, RUNS, read_under, run_id_of, run_uris

log = logging.getLogger("vapo_mcp.server.subscriptions")
POLL_S = 2.0
MAX_URI = 200
"""Characters of a subscribed URI (a run id is at most 80)."""
PER_CLIENT, IN_ALL, MAX_STREAMS = 64, 4096, 256
"""URIs one connection (or one listen stream) may subscribe to; URIs of all connections; open listen streams."""


class CountingBus(InMemorySubscriptionBus):
    """The SDK's in-process bus of `subscriptions/listen` streams, which also counts them (the watcher polls only
    while there are some) and calls `on_change` when one opens."""

    def __init__(self, on_change: Callable[[], None]):
        super().__init__()
        self.listeners, self._on_change = 0, on_change

    def subscribe(self, listener):
        unsubscribe = super().subscribe(listener)
        self.listeners += 1
        self._on_change()
        done = False

        def counted():
            nonlocal done
            unsubscribe()
            if not done:
                done = True
                self.listeners -= 1
        return counted


def _refused(message: str) -> MCPError:
    return MCPError(INVALID_PARAMS, message)


class RunWatch:
    """Tells subscribers when a run changes state or logs an evaluation, by polling the read model of runs every
    `interval` seconds on the server's event loop while anyone is subscribed (and not at all otherwise). How the
    runs are is recorded before a subscription is acknowledged, so every change after that is announced."""

    def __init__(self, interval: float = POLL_S):
        self.interval = interval
        self.bus = CountingBus(self._wake)
        self._legacy: dict[object, tuple[object, set[str]]] = {}
        """connection → (its latest session, the URIs it subscribed to with resources/subscribe)."""
        self._task: asyncio.Task | None = None
        self._seen: dict[str, tuple] = {}
        self._recorded = False
        """`_seen` was just recorded by `_record` (the poller's first poll then announces what changed since)."""
        self._failed: str | None = None

    @property
    def subscribed(self) -> bool:
        return self.bus.listeners > 0 or any(uris for _, uris in self._legacy.values())

    @property
    def held(self) -> int:
        """URIs held by resources/subscribe, over all connections."""
        return sum(len(uris) for _, uris in self._legacy.values())

    async def _record(self) -> None:
        """Before a subscription is acknowledged, when no poller runs: record how the runs are now."""
        if self._task is None:
            try:
                await anyio.to_thread.run_sync(self._changes, True)
                self._recorded = True
            except Exception as e:  # noqa: BLE001 - the poller's first poll records it instead (and says why not)
                log.debug("run watch: not recorded before the subscription: %s", public_message(e))

    def _wake(self) -> None:
        """Start the poller if someone is subscribed and it is not running (called on the event loop)."""
        if self._task is None and self.subscribed:
            first, self._recorded = not self._recorded, False
            self._task = asyncio.get_running_loop().create_task(self._poll_loop(first))

    async def _poll_loop(self, first: bool) -> None:
        while True:
            if not self.subscribed:  # checked and cleared with no await in between: _wake sees None after
                self._task = None
                return
            try:
                changed, failed = await anyio.to_thread.run_sync(self._changes, first), None
            except Exception as e:  # noqa: BLE001 - a bad settings file or registry must not kill the poller
                changed, failed = [], public_message(e, known_secrets())
                if failed != self._failed:  # said once, not every poll
                    log.warning("run watch: %s", failed)
            self._failed = failed
            first = first and failed is not None  # until a poll succeeds, the next one only records
            for uri in changed:
                await self._publish(uri)
            await anyio.sleep(self.interval)

    def _changes(self, baseline: bool) -> list[str]:
        """The URIs to announce since the last poll ([] on the first poll, which only records what is). Advances
        the queue first, as every run tool does (a run whose supervisor died is marked failed: a state change)."""
        views = training.views_for(files(), tick=True)
        seen, out = {}, []
        for rec in views.manager.registry.list(limit=contents.LIST_LIMIT):
            old = self._seen.get(rec.run_id)
            if old is not None and old[0] == rec.state.value and rec.state.terminal:
                seen[rec.run_id] = old  # a finished run logs no new evaluation: no file read
                continue
            snap = views.of(rec)
            seen[rec.run_id] = (rec.state.value, snap.latest.get("eval", {}).get("step"))
            if seen[rec.run_id] != old:
                out += run_uris(rec.run_id)
        self._seen = seen
        if baseline:
            return []
        return [RUNS, *out] if out else []

    async def _publish(self, uri: str) -> None:
        await self.bus.publish(ResourceUpdated(uri=uri))
        for key, (session, uris) in list(self._legacy.items()):
            if uri in uris:
                try:
                    await session.send_resource_updated(uri)
                except Exception:  # noqa: BLE001 - the client is gone: forget its subscriptions
                    self._legacy.pop(key, None)

    # -- what may be subscribed -------------------------------------------------------------------------------
    async def checked(self, policy, uri: str) -> str:
        """`uri` if a client may subscribe to it (see the module docstring); else an invalid-params error."""
        shown = arguments_text.show(uri)
        if len(uri) > MAX_URI:
            raise _refused(f"the URI is too long ({len(uri)} characters; at most {MAX_URI}): subscribe to "
                           f"{RUNS} or a run's URI, vapo://runs/RUN_ID[/metrics|/log|/plot.png]")
        if uri == RUNS:
            return uri
        run_id, part = (uri.removeprefix(RUNS + "/") + "/").split("/", 1) if uri.startswith(RUNS + "/") else ("", "")
        part = "/" + part.rstrip("/") if part.rstrip("/") else ""
        if not run_id or part not in PARTS:
            raise _refused(f"cannot subscribe to {shown}: this server notifies {RUNS} and a run's "
                           "vapo://runs/RUN_ID, /metrics, /log and /plot.png (list_runs shows the run ids)")
        run_id = run_id_of(run_id)
        await read_under(policy, contents.run_known, run_id, uri)
        return uri

    def serve_subscriptions(self, mcp) -> None:
        """Answer `resources/subscribe` / `resources/unsubscribe` (the 2025-11-25 form), and check and record the
        runs before the SDK's `subscriptions/listen` (the 2026-07-28 form, on `self.bus`) acknowledges a stream."""
        async def subscribe(ctx, params: SubscribeRequestParams) -> EmptyResult:
            uri = await self.checked(mcp.policy, str(params.uri))
            key = sdk.connection_of(ctx)  # one entry per client connection
            uris = self._legacy.get(key, (None, set()))[1]
            if uri not in uris:
                if len(uris) >= PER_CLIENT:
                    raise _refused(f"this connection holds {PER_CLIENT} subscriptions, the most it may: unsubscribe "
                                   "from some (resources/unsubscribe) first")
                if self.held >= IN_ALL:
                    raise _refused(f"the server holds {IN_ALL} subscriptions, the most it keeps: try again later")
                if key not in self._legacy:
                    sdk.on_connection_closed(ctx, lambda: self._legacy.pop(key, None))
            await self._record()
            uris.add(uri)
            self._legacy[key] = (ctx.session, uris)
            self._wake()
            return EmptyResult()

        async def unsubscribe(ctx, params: UnsubscribeRequestParams) -> EmptyResult:
            key = sdk.connection_of(ctx)
            self._legacy.get(key, (None, set()))[1].discard(str(params.uri))
            return EmptyResult()

        sdk.add_request_handler(mcp, "resources/subscribe", SubscribeRequestParams, subscribe)
        sdk.add_request_handler(mcp, "resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
        if sdk.has_request_handler(mcp, "subscriptions/listen"):
            sdk.wrap_request_handler(mcp, "subscriptions/listen", lambda listen: self._listen(mcp, listen))

    def _listen(self, mcp, sdk_listen):
        async def listen(ctx, params: SubscriptionsListenRequestParams):
            wanted = params.notifications.resource_subscriptions or []
            if len(wanted) > PER_CLIENT:
                raise _refused(f"a stream may name at most {PER_CLIENT} resource subscriptions ({len(wanted)} "
                               "given): open it with fewer")
            if self.bus.listeners >= MAX_STREAMS:
                raise _refused(f"the server has {MAX_STREAMS} subscription streams open, the most it keeps: try "
                               "again later")
            for uri in wanted:
                await self.checked(mcp.policy, uri)
            await self._record()
            return await sdk_listen(ctx, params)
        return listen
