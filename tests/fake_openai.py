"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests, scriptable per route.

    with FakeOpenAI(key="sk-canary-…", models=["qwen-32b", "qwen-14b"]) as srv:
        srv.script("POST /v1/chat/completions", Reply(429, headers={"retry-after-ms": "200"}), Reply.ok("80"))
        ... call srv.base_url ...
        assert srv.count("POST /v1/chat/completions") == 2

Default behaviour (when a route's script queue is empty): `GET /v1/models` lists `models`;
`POST /v1/chat/completions` answers with `answers[model]` (plain JSON or SSE when `"stream": true`), returns
401 (OpenAI shape, echoing the key it got, as some servers do) when `key` is set and the Bearer token differs,
and 404 `model_not_found` for unknown models; any other path is a route 404 (`{"detail": "Not Found"}`).
Scripted `Reply`s can set status, headers, a JSON or raw body, a delay before the response, SSE events
(optionally cut off mid-stream: `break_after`), and are served in order. Every request is recorded.

`answer_fn(body)` makes the default answer depend on the request (a provider that solves the prompt).
`delay` holds every default reply that long (latency tests); `redirect=(307, "http://other:port")` answers
every request with that redirect to the same path on the other server (a base URL that moved, or a hostile
one); each recorded request notes how many requests were in flight when it arrived (`in_flight`).

`echo=True` makes it a hostile server (or proxy) that echoes the key it was sent everywhere it can: in
response headers (values, a header *name*, a base64 `Basic` value, the reason phrase), as a model id in
`GET /models`, as the `model` of completions, inside the answer and the reasoning text (whole, partly,
upper-cased, split across SSE chunks). Error bodies that echo it are scripted by the test (`Reply.error`).
"""
from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from typing_extensions import Self

DEFAULT_ANSWER = "Distance 240 km over 3 hours: 240 / 3 = 80. The average speed is 80 km/h."


@dataclass
class Reply:
    """One scripted response."""

    status: int = 200
    json: Any = None
    body: str | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    sse: list[Any] | None = None
    """SSE events: dicts are sent as JSON, strings as-is (e.g. "[DONE]")."""
    sse_delay: float = 0.0
    break_after: int | None = None
    """Close the connection after this many SSE events, without ending the chunked body."""
    reason: str | None = None
    """Reason phrase of the status line (default: the standard one)."""

    @staticmethod
    def ok(content: str = DEFAULT_ANSWER, model: str = "qwen-32b", finish_reason: str = "stop") -> Reply:
        return Reply(json=completion(content, model, finish_reason))

    @staticmethod
    def error(status: int, message: str, code: Any = None, type_: str = "invalid_request_error",
              headers: dict | None = None) -> Reply:
        return Reply(status, json={"error": {"message": message, "type": type_, "param": None, "code": code}},
                     headers=headers or {})

    @staticmethod
    def stream(content: str = DEFAULT_ANSWER, model: str = "qwen-32b", *, pieces: int = 4,
               break_after: int | None = None, done: bool = True, finish_reason: str = "stop") -> Reply:
        return Reply(sse=sse_events(content, model, pieces=pieces, done=done, finish_reason=finish_reason),
                     break_after=break_after)


def completion(content: str, model: str, finish_reason: str = "stop", reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": content, **({"reasoning_content": reasoning} if reasoning else {})}
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}}


def sse_events(content: str, model: str, *, pieces: int = 4, done: bool = True,
               finish_reason: str = "stop", reasoning: str | None = None) -> list[Any]:
    step = max(1, -(-len(content) // pieces))
    parts = [content[i:i + step] for i in range(0, len(content), step)] or [""]
    thoughts = [reasoning[i:i + step] for i in range(0, len(reasoning), step)] if reasoning else []
    events: list[Any] = [{"id": "c", "object": "chat.completion.chunk", "model": model,
                          "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": t},
                                       "finish_reason": None}]} for t in thoughts]
    events += [{"id": "c", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": p},
                             "finish_reason": None}]} for p in parts]
    events.append({"id": "c", "object": "chat.completion.chunk", "model": model,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}],
                   "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}})
    if done:
        events.append("[DONE]")
    return events


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    json: Any
    t: float
    in_flight: int = 0
    """Requests being served when this one arrived (itself included)."""


class FakeOpenAI:
    """The server; use as a context manager. `base_url` ends with /v1."""

    def __init__(self, *, key: str | None = None, models=("qwen-32b", "qwen-14b"),
                 answers: dict[str, str] | None = None, prefix: str = "/v1", echo: bool = False,
                 delay: float = 0.0, redirect: tuple[int, str] | None = None, answer_fn=None):
        self.key, self.models, self.prefix, self.echo = key, list(models), prefix, echo
        self.delay, self.redirect = delay, redirect
        self.answers = answers or {}
        self.answer_fn = answer_fn
        """Optional `fn(request body) -> answer text`: a provider that actually answers the prompt."""
        self.requests: list[Recorded] = []
        self.in_flight = self.max_in_flight = 0
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        return self.url + self.prefix

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, route: str, *replies: Reply) -> None:
        """Queue replies for "METHOD /path" (or "/path" for any method)."""
        with self._lock:
            self._scripts[route].extend(replies)

    def count(self, route: str) -> int:
        method, _, path = route.rpartition(" ")
        return sum(1 for r in self.requests if r.path == path and (not method or r.method == method))

    def times(self, route: str) -> list[float]:
        method, _, path = route.rpartition(" ")
        return [r.t for r in self.requests if r.path == path and (not method or r.method == method)]

    def next_scripted(self, method: str, path: str) -> Reply | None:
        with self._lock:
            for route in (f"{method} {path}", path):
                if self._scripts.get(route):
                    return self._scripts[route].popleft()
        return None

    def default_reply(self, method: str, path: str, headers: dict, body: Any) -> Reply:
        if self.redirect is not None:
            status, target = self.redirect
            return Reply(status, body=f"moved to {target}{path}", headers={"location": f"{target}{path}"})
        reply = self._served_reply(path, headers, body)
        return replace(reply, delay=max(reply.delay, self.delay))

    def _served_reply(self, path: str, headers: dict, body: Any) -> Reply:
        if path not in (f"{self.prefix}/models", f"{self.prefix}/chat/completions"):
            return Reply(404, json={"detail": "Not Found"})
        auth = headers.get("authorization", "")
        if self.key is not None and auth != f"Bearer {self.key}":
            given = auth.removeprefix("Bearer ")
            return Reply.error(401, f"Incorrect API key provided: {given or '(none)'}. You can find your API "
                               "key in your dashboard.", "invalid_api_key")
        echoed = auth.removeprefix("Bearer ") if self.echo else ""
        if path.endswith("/models"):
            ids = [*self.models, *([echoed, f"ft:{echoed[:16]}:custom"] if echoed else [])]
            return Reply(json={"object": "list", "data": [{"id": m, "object": "model"} for m in ids]})
        model = (body or {}).get("model") if isinstance(body, dict) else None
        if model not in self.models:
            return Reply.error(404, f"The model `{model}` does not exist or you do not have access to it.",
                               "model_not_found")
        content = self.answer_fn(body) if self.answer_fn else self.answers.get(model, DEFAULT_ANSWER)
        if echoed:
            content += f" Your key is {echoed}, it starts {echoed[:20]} and in capitals {echoed.upper()}."
            thought = f"The user authenticated with {echoed}; half of it: {echoed[len(echoed) // 2:]}."
            if isinstance(body, dict) and body.get("stream"):
                return Reply(sse=sse_events(content, echoed, pieces=7, reasoning=thought))
            return Reply(json=completion(content, echoed, reasoning=thought))
        if isinstance(body, dict) and body.get("stream"):
            return Reply.stream(content, model)
        return Reply.ok(content, model)

    def echo_headers(self, request_headers: dict[str, str]) -> tuple[dict[str, str], str | None]:
        """Headers and a reason phrase that echo the Bearer token of the request (echo mode only)."""
        token = request_headers.get("authorization", "").removeprefix("Bearer ")
        if not (self.echo and token):
            return {}, None
        basic = base64.b64encode(f"user:{token}".encode()).decode()
        return {"x-request-id": f"req-{token}", "x-ratelimit-limit-requests": token,
                "x-ratelimit-remaining-tokens": token[4:24], f"x-ratelimit-{token}": "1",
                "x-echo-authorization": f"Bearer {token}", "www-authenticate": f"Basic {basic}",
                "set-cookie": f"session={token}; Path=/"}, f"OK {token}"


def _handler(fake: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            headers = {k.lower(): v for k, v in self.headers.items()}
            with fake._lock:
                fake.in_flight += 1
                fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                fake.requests.append(Recorded(method, self.path, headers, body, time.monotonic(), fake.in_flight))
            try:
                reply = fake.next_scripted(method, self.path) or fake.default_reply(method, self.path, headers,
                                                                                     body)
                echo, reason = fake.echo_headers(headers)
                reply = replace(reply, headers={**echo, **reply.headers}, reason=reply.reason or reason)
                time.sleep(reply.delay)
                self._send(reply)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                with fake._lock:
                    fake.in_flight -= 1

        def _send(self, reply: Reply) -> None:
            if reply.sse is not None:
                return self._send_sse(reply)
            if reply.json is not None:
                data, ctype = json.dumps(reply.json).encode(), "application/json"
            else:
                b = reply.body or b""
                data, ctype = (b.encode() if isinstance(b, str) else b), "text/plain; charset=utf-8"
            self.send_response(reply.status, reply.reason)
            self._headers({"content-type": ctype, **reply.headers, "content-length": str(len(data))})
            self.wfile.write(data)
            self.close_connection = True

        def _send_sse(self, reply: Reply) -> None:
            self.send_response(reply.status, reply.reason)
            self._headers({"content-type": "text/event-stream", **reply.headers, "transfer-encoding": "chunked"})
            for i, event in enumerate(reply.sse):
                if reply.break_after is not None and i >= reply.break_after:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                payload = event if isinstance(event, str) else json.dumps(event)
                chunk = f"data: {payload}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(reply.sse_delay)
            self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

        def _headers(self, headers: dict[str, str]) -> None:
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("connection", "close")
            self.end_headers()

    return Handler


CANARY = "sk-canary-7f3a9c1e5b2d4f6a8c0e2b4d6f8a1c3e"
"""A key that must never appear in any result, log or CLI output."""


def make_channel(base_url: str, key: str | None = CANARY, **kw: Any):
    """A `Channel` for tests (no files): fast timeouts, 2 retries, models qwen-32b / qwen-14b."""
    from vapo_engine.config import Channel, Secret
    fields: dict[str, Any] = {"base_url": base_url, "base_url_source": "test", "api_key_env": "TEST_API_KEY",
                              "key": Secret(key) if key is not None else None,
                              "key_source": "environment variable TEST_API_KEY" if key is not None else "missing",
                              "headers": {"Content-Type": "application/json", "X-Test-Header": "yes"},
                              "reasoning_model": "qwen-32b", "fallback_model": "qwen-14b", "stream": False,
                              "timeout_seconds": 2.0, "max_retries": 2}
    fields.update(kw)
    return Channel(**fields)


def fast_policy(**kw: Any):
    """A retry policy with millisecond backoff so retry tests stay fast."""
    from vapo_engine.providers import RetryPolicy
    return RetryPolicy(**{"max_retries": 2, "backoff_base": 0.01, "backoff_max": 0.05, "retry_after_cap": 2.0,
                          **kw})


def closed_port() -> int:
    """A loopback port with nothing listening (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_until_closed(s: socket.socket) -> bytes:
    """Everything a server sends on `s` until it closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def key_traces(text: str, key: str, window: int = 12) -> list[str]:
    """Every `window`-character piece of `key` — or of its base64 forms, as in a `Basic` header — that occurs
    in `text`, case-insensitively (a partial echo is a leak too). The redacted form (prefix + last 4 +
    length) shares fewer characters with the key and is not a trace."""
    low = text.lower()
    forms = [key, base64.b64encode(key.encode()).decode()[:-4],
             base64.b64encode(f"user:{key}".encode()).decode()[8:-4]]
    pieces = {f[i:i + window].lower() for f in forms for i in range(len(f) - window + 1)}
    return sorted(p for p in pieces if p in low)
