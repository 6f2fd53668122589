"""The OpenAI-compatible HTTP API of `serve-model` (Starlette; served by uvicorn):

    GET  /v1/models                 the one served model
    GET  /v1/models/{id}            it, or 404 model_not_found
    POST /v1/chat/completions       plain JSON (always with `usage`) or SSE with `"stream": true`
    GET  /health                    status, weight version + batching counters (open without a token; no paths,
                                    no secrets)
    /rollout/...                    the rollout protocol (rollout_protocol.py: generate from token ids with
                                    log-probs, abort, pause / resume, load_weights, info)

Every error is an OpenAI error object with the right status: 400 bad request or a prompt that does not fit the
context (`context_length_exceeded`), 401 missing/wrong token (security.Guard), 404 unknown model or route, 405
wrong method, 408 a body slower than `--body-timeout`, 413 body over `MAX_BODY`, 421 foreign Host header,
503 more requests in progress than `--max-concurrent` (limits.py), 500 a failure on the server — whose details
go to the server log, never into the response. The generation itself runs in the engine's worker thread;
this module only validates, queues, and relays the engine's events.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .admission import Admission, Admitted
from .limits import BODY_TIMEOUT_S, MAX_CONCURRENT, InFlightLimit, read_body
from .protocol import (
    ApiError,
    ChatRequest,
    bad_request,
    chunk,
    completion,
    completion_id,
    model_card,
    now,
    parse_chat_request,
    sse,
    usage,
    usage_chunk,
)
from .rollout_routes import RolloutRoutes
from .security import Guard, error_body

log = logging.getLogger("vapo_engine.serving")
MAX_BODY = 4 * 1024 * 1024
ROUTES_TEXT = "GET /v1/models, POST /v1/chat/completions, GET /health, /rollout/* (the rollout protocol)"


async def _read_json(request: Request) -> Any:
    too_big = ApiError(413, f"the request body is larger than {MAX_BODY // (1024 * 1024)} MiB; send a shorter "
                            "conversation", code="request_too_large")
    timeout_s = getattr(request.app.state, "body_timeout_s", BODY_TIMEOUT_S)
    slow = ApiError(408, f"the request body did not arrive within {timeout_s:g} s of the request head; send it "
                         "at once (the connection is closed)", code="request_timeout")
    body = await read_body(request, MAX_BODY, too_big, slow, timeout_s)
    try:
        data = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise bad_request("the request body is nested too deeply to be a chat request; send a JSON object "
                          "with messages") from None
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON ({str(e)[:120]}); send a JSON object") from None
    _check_strings(data)
    return data


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number; send finite numbers")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range; send finite numbers")
    return value


def _check_strings(data: Any) -> None:
    """400 for a string that is not Unicode text (a lone surrogate such as "\\ud800" parses, then fails the
    tokenizer); walked with a stack, so any depth the parser accepted costs no recursion."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                raise bad_request(f"the request body holds a string that is not valid Unicode ({e.reason} at "
                                  f"position {e.start}: a lone surrogate); send UTF-8 text") from None


class Api:
    """The routes over one served model (`ServedModel`) and its batching `Engine`."""

    def __init__(self, served, engine, *, default_max_tokens: int = 512, rollout=None):
        self.served, self.engine, self.default_max_tokens = served, engine, default_max_tokens
        self.rollout = rollout
        self.created = now()

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card(self.served.name, self.created)]})

    async def model(self, request: Request) -> JSONResponse:
        given = request.path_params["model_id"]
        if given != self.served.name:
            raise ApiError(404, f"The model `{given[:200]}` does not exist; this server serves "
                                f"`{self.served.name}`", param="model", code="model_not_found")
        return JSONResponse(model_card(self.served.name, self.created))

    async def health(self, request: Request) -> JSONResponse:
        version = self.rollout.version if self.rollout is not None else 0
        return JSONResponse({"status": "ok", "model": self.served.name, "weight_version": version,
                             "engine": self.engine.snapshot()})

    async def chat(self, request: Request):
        from .engine import Job  # the engine module imports torch; this module stays importable without it

        req = parse_chat_request(await _read_json(request), served=self.served.name, max_n=self.engine.max_batch,
                                 max_tokens_cap=self.served.context)
        ids = self.served.prompt_ids(req.messages)
        budget = self.served.budget(len(ids), req.max_tokens, self.default_max_tokens)
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        job = Job(ids, budget, req.temperature, req.top_p, req.n, req.stop,
                  emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        self.engine.submit(job)
        meta = (completion_id(), self.served.name, now())
        if req.stream:
            return StreamingResponse(self._stream(job, events, req, len(ids), meta),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return JSONResponse(await self._collect(events, req, len(ids), meta))
        finally:
            job.cancelled = True  # a no-op when finished; frees the rows of a client that went away

    async def _collect(self, events: asyncio.Queue, req: ChatRequest, prompt_len: int, meta: tuple) -> dict:
        texts, reasons = [""] * req.n, ["length"] * req.n
        while True:
            kind, *rest = await events.get()
            if kind == "delta":
                texts[rest[0]] += rest[1]
            elif kind == "finish":
                reasons[rest[0]] = rest[1]
            elif kind == "error":
                raise ApiError(500, rest[0], type_="server_error", code="generation_failed")
            elif kind == "done":
                return completion(*meta, list(zip(texts, reasons)), usage(prompt_len, rest[0]))

    async def _stream(self, job, events: asyncio.Queue, req: ChatRequest, prompt_len: int, meta: tuple):
        """Role chunk per choice, content deltas, a finish chunk per choice, the usage chunk when asked for,
        then `[DONE]`. A failure after the headers went out is an `error` event (no `[DONE]`)."""
        u = req.include_usage
        try:
            for i in range(req.n):
                yield sse(chunk(*meta, i, {"role": "assistant", "content": ""}, with_usage=u))
            while True:
                kind, *rest = await events.get()
                if kind == "delta":
                    yield sse(chunk(*meta, rest[0], {"content": rest[1]}, with_usage=u))
                elif kind == "finish":
                    yield sse(chunk(*meta, rest[0], {}, rest[1], with_usage=u))
                elif kind == "error":
                    yield sse(ApiError(500, rest[0], type_="server_error", code="generation_failed").body())
                    return
                elif kind == "done":
                    if u:
                        yield sse(usage_chunk(*meta, usage(prompt_len, rest[0])))
                    break
            yield sse("[DONE]")
        finally:
            job.cancelled = True  # the client disconnected, or the stream ended: its rows stop


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    closing = {"connection": "close"} if exc.status == 408 else None  # the rest of a slow body is never read
    return JSONResponse(exc.body(), status_code=exc.status, headers=closing)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 404:
        err = ApiError(404, f"unknown route {request.method} {request.url.path[:200]}: this server has "
                            f"{ROUTES_TEXT} (base URL http://<host>:<port>/v1)", code="unknown_route")
    elif exc.status_code == 405:
        err = ApiError(405, f"{request.method} is not allowed on {request.url.path[:200]}: this server has "
                            f"{ROUTES_TEXT}", code="method_not_allowed")
    else:
        err = ApiError(exc.status_code, str(exc.detail)[:300])
    return JSONResponse(err.body(), status_code=err.status, headers=getattr(exc, "headers", None))


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    err = ApiError(500, "internal server error; the server log says why", type_="server_error",
                   code="internal_error")
    return JSONResponse(err.body(), status_code=500)


def build_app(served, engine, *, token: str | None = None, allowed_hosts: frozenset[str] | None = None,
              default_max_tokens: int = 512, rollout=None, max_concurrent: int = MAX_CONCURRENT,
              body_timeout_s: float = BODY_TIMEOUT_S, admission: Admission | None = None):
    """The ASGI app: routes, OpenAI-shaped errors, the engine started/stopped with the app, the Guard, the
    connection admission (admission.py, shared with the connection protocol) and the limits (limits.py: requests
    in progress, body read time). `rollout` (a `rollout_service.RolloutService`) adds the rollout protocol's
    routes."""
    api = Api(served, engine, default_max_tokens=default_max_tokens, rollout=rollout)
    extra = RolloutRoutes(rollout, _read_json).routes() if rollout is not None else []

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop)

    app = Starlette(routes=[Route("/v1/models", api.models, methods=["GET"]),
                            Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
                            Route("/v1/chat/completions", api.chat, methods=["POST"]),
                            Route("/health", api.health, methods=["GET"]), *extra],
                    exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                        Exception: _server_error},
                    lifespan=lifespan)
    app.state.body_timeout_s = body_timeout_s
    admitted = Admitted(app, admission or Admission(), error=lambda message, code: error_body(message, code,
                                                                                                "server_error"))
    return InFlightLimit(Guard(admitted, token=token, allowed_hosts=allowed_hosts), max_concurrent)
