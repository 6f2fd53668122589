"""MCP resources: the runs as read-only documents an agent reads and subscribes to, next to the tools.

    vapo://runs                      the run list (list_runs' result, JSON)
    vapo://runs/{run_id}             the run's status (run_status' result, JSON)
    vapo://runs/{run_id}/metrics     its recent metrics records (JSON)
    vapo://runs/{run_id}/log         the worker log tail, scrubbed (text)
    vapo://runs/{run_id}/plot.png    the report_metrics plot (PNG)
    vapo://runs/{run_id}/config      its effective config, redacted (JSON)

The contents come from tools.run_resources. Each read runs under the server's access policy like a tool call: a
run id is checked exactly like the tools' `run_id` argument (same message), and for HTTP clients every file read
must resolve inside the allowed roots (same refusal as the tools). Such errors reach the client as an
invalid-params error carrying the tools' message.

Subscribers are told when a run changes state or logs an evaluation: `RunWatch` polls the read model of runs
every `POLL_S` seconds, only while someone is subscribed — over `subscriptions/listen` (2026-07-28: the SDK's
bus, counted here) or `resources/subscribe` (2025-11-25 and earlier) — and sends `notifications/resources/updated`
for the list and the run's status, metrics, log and plot. Imports no torch.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel, ValidationError

from tools import access, training
from tools import run_resources as contents
from tools.paths import files, known_secrets
from vapo_engine.errors import is_user_error
from vapo_engine.providers.redaction import public_message

from . import arguments as arguments_text

log = logging.getLogger("vapo_mcp.server.resources")
RUNS = "vapo://runs"
PARTS = ("", "/metrics", "/log", "/plot.png")
"""The URIs of a run (after vapo://runs/<id>) whose content changes with its state and evaluations."""
POLL_S = 2.0
MAX_LEGACY_CLIENTS = 256
"""Connections remembered for resources/subscribe (a client that left is forgotten at its next notification, or
when this many newer ones have subscribed)."""
JSON, TEXT, PNG = "application/json", "text/plain", "image/png"
OWN_CHECKS = ResourceSecurity(reject_path_traversal=False, reject_absolute_paths=False, reject_null_bytes=False)
"""The run id is checked by `_run_id` (the tools' RunId: no '/', no leading '.', no NUL), so the SDK's generic
check would only replace the tools' message by 'Unknown resource'."""


class _RunRef(BaseModel):
    run_id: arguments_text.RunId


def run_uris(run_id: str) -> list[str]:
    return [f"{RUNS}/{run_id}{part}" for part in PARTS]


def _run_id(value: str) -> str:
    """`value` if it is a run id; else the message the tools give for such a `run_id` argument."""
    try:
        return _RunRef(run_id=value).run_id
    except ValidationError as e:
        raise MCPError(INVALID_PARAMS, arguments_text.describe_validation(
            "resources/read", e, _RunRef.model_json_schema())) from None


def register_resources(mcp: MCPServer, watch: RunWatch) -> None:
    """Add the run resources to `mcp` (reads under `mcp.policy`) and serve `resources/subscribe`."""
    async def read(fn: Callable, *args):
        """`fn(files, *args)` in a worker thread under the server's policy; a user error becomes the client's
        invalid-params error with the tools' (scrubbed) message, anything else stays a crash."""
        try:
            with access.applied(mcp.policy):
                return await anyio.to_thread.run_sync(functools.partial(fn, files(), *args))
        except Exception as e:
            if is_user_error(e):
                raise MCPError(INVALID_PARAMS, public_message(e, known_secrets())) from None
            raise

    def per_run(part: str, fn: Callable, mime: str, name: str, title: str, describe: str, encode=json.dumps):
        uri = f"{RUNS}/{{run_id}}{part}"

        async def resource(run_id: str):
            run_id = _run_id(run_id)
            return encode(await read(fn, run_id, uri.replace("{run_id}", run_id)))
        mcp.resource(uri, name=name, title=title, description=describe, mime_type=mime, security=OWN_CHECKS)(resource)

    @mcp.resource(RUNS, name="runs", title="Runs", mime_type=JSON)
    async def runs() -> str:
        """Runs newest first (the list_runs result): state, progress, latest held-out accuracy."""
        return json.dumps(await read(contents.run_list))

    per_run("", contents.run_status, JSON, "run_status", "Run status",
            "A run's state with its message, step/total, latest evaluation, log tail and next steps (run_status).")
    per_run("/metrics", contents.run_metrics, JSON, "run_metrics", "Run metrics",
            f"A run's progress and its last {contents.RECENT_RECORDS} metrics records (train and eval).")
    per_run("/log", contents.run_log, TEXT, "run_log", "Run log",
            f"The last {contents.LOG_LINES} lines of a run's worker log (secrets redacted).", encode=str)
    per_run("/plot.png", contents.run_plot, PNG, "run_plot", "Run plot",
            "A run's curves (reward, length, held-out accuracy, explained variance, λ, entropy) as a PNG.",
            encode=bytes)
    per_run("/config", contents.run_config, JSON, "run_config", "Run config",
            "A run's effective config: the frozen config.json and its settings snapshot (key redacted).")
    watch.serve_subscriptions(mcp)


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

    def serve_subscriptions(self, mcp: MCPServer) -> None:
        """Answer `resources/subscribe` / `resources/unsubscribe` (the 2025-11-25 form), and record the runs
        before the SDK's `subscriptions/listen` (the 2026-07-28 form, on `self.bus`) acknowledges a stream."""
        async def subscribe(ctx, params: SubscribeRequestParams) -> EmptyResult:
            key = getattr(ctx.session, "_connection", ctx.session)  # one entry per client connection
            uris = self._legacy.get(key, (None, set()))[1]
            uris.add(str(params.uri))
            self._legacy.pop(key, None)
            await self._record()
            self._legacy[key] = (ctx.session, uris)  # newest last; the oldest go beyond MAX_LEGACY_CLIENTS
            while len(self._legacy) > MAX_LEGACY_CLIENTS:
                self._legacy.pop(next(iter(self._legacy)))
            self._wake()
            return EmptyResult()

        async def unsubscribe(ctx, params: UnsubscribeRequestParams) -> EmptyResult:
            key = getattr(ctx.session, "_connection", ctx.session)
            self._legacy.get(key, (None, set()))[1].discard(str(params.uri))
            return EmptyResult()

        server = mcp._lowlevel_server  # the SDK's MCPServer serves neither resources/(un)subscribe itself
        server.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
        server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
        sdk_listen = server.get_request_handler("subscriptions/listen")
        if sdk_listen is not None:
            async def listen(ctx, params: SubscriptionsListenRequestParams):
                await self._record()
                return await sdk_listen.handler(ctx, params)
            server.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, listen)
