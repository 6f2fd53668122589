"""The HTTP routes of the rollout protocol (`rollout_protocol.py`) over a `RolloutService`: validate, run the
operation in a worker thread (never on the event loop), answer JSON. Errors are the same OpenAI-shaped `ApiError`s
as the chat routes; the Guard in front of the app checks the token and the Host header. `read_json` is the app's
bounded, validating body reader (app._read_json)."""
from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .rollout_protocol import parse_abort, parse_generate, parse_load_weights


class RolloutRoutes:
    def __init__(self, service, read_json):
        self.s, self._read_json = service, read_json

    async def generate(self, request: Request) -> JSONResponse:
        m = self.s.m
        req = parse_generate(await self._read_json(request), served=m.name, vocab=self.s.vocab, context=m.context)
        return JSONResponse(await asyncio.to_thread(self.s.generate, req))

    async def abort(self, request: Request) -> JSONResponse:
        rid = parse_abort(await self._read_json(request) if await request.body() else {})
        return JSONResponse({"aborted": self.s.abort(rid)})

    async def pause(self, request: Request) -> JSONResponse:
        self.s.pause()
        return JSONResponse({"paused": True})

    async def resume(self, request: Request) -> JSONResponse:
        self.s.resume()
        return JSONResponse({"paused": False})

    async def load_weights(self, request: Request) -> JSONResponse:
        path, version = parse_load_weights(await self._read_json(request))
        return JSONResponse({"weight_version": await asyncio.to_thread(self.s.load_weights, path, version)})

    async def info(self, request: Request) -> JSONResponse:
        return JSONResponse(self.s.info())

    def routes(self) -> list[Route]:
        return [Route("/rollout/generate", self.generate, methods=["POST"]),
                Route("/rollout/abort", self.abort, methods=["POST"]),
                Route("/rollout/pause", self.pause, methods=["POST"]),
                Route("/rollout/resume", self.resume, methods=["POST"]),
                Route("/rollout/load_weights", self.load_weights, methods=["POST"]),
                Route("/rollout/info", self.info, methods=["GET"])]
