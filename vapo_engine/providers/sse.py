"""Server-sent events of `/chat/completions` with `stream: true`, accumulated into one answer.

A stream is complete when `data: [DONE]` arrives (or, leniently, when a chunk carried a `finish_reason` and
the connection then closed cleanly). A dropped connection, a stream that stops without either, or a chunk that
is not JSON raises `StreamError(kind="stream_broken")` (retried as a whole request); an `error` object inside
the stream raises `StreamError(kind="stream_error")` (not retried).

Everything in a stream is server-controlled: the model id, usage and finish reason are scrubbed of the key per
chunk; the answer and reasoning text are scrubbed once joined (a key split across two chunks is still found),
and each delta is scrubbed before it reaches `on_delta`. A stream longer than `MAX_STREAM_CHARS` of answer
and reasoning is refused (`StreamError(kind="too_large")`); a long answer is scrubbed away from the event loop.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from .errorbody import parse_error_body
from .errors import StreamError
from .offload import off_loop, plain
from .redaction import scrub, scrub_obj

MAX_CONTENT = 200_000
MAX_STREAM_CHARS = 4_000_000


@dataclass
class StreamState:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    model: str | None = None
    choices_seen: bool = False
    done: bool = False
    chunks: int = 0
    chars: int = 0
    first_token_at: float | None = None

    def text(self) -> str:
        return "".join(self.content)[:MAX_CONTENT]

    async def seal(self, secrets) -> None:
        """Join and scrub the answer and the reasoning (call once, when the stream is complete)."""
        content, reasoning = await off_loop("scrub_pair", "".join(self.content), "".join(self.reasoning),
                                            plain(secrets), size=self.chars)
        self.content, self.reasoning = [content], [reasoning]


async def read_stream(resp: httpx.Response, *, secrets=(), url: str | None = None, model: str | None = None,
                      on_delta: Callable[[str], None] | None = None) -> StreamState:
    """Consume the SSE body of `resp`; raise `StreamError` when it is broken."""
    st, data_lines = StreamState(), []
    kw = {"secrets": secrets, "url": scrub(url) if url else url, "model": model, "headers": resp.headers}
    try:
        async for line in resp.aiter_lines():
            line = line.rstrip("\r")
            if line.startswith(":"):
                continue
            if line.startswith("data:"):
                data_lines.append(line[5:].lstrip(" "))
                continue
            if line == "" and data_lines:
                _dispatch("\n".join(data_lines), st, kw, on_delta)
                data_lines = []
                if st.done:
                    break
        if data_lines and not st.done:
            _dispatch("\n".join(data_lines), st, kw, on_delta)
    except (httpx.TransportError, httpx.StreamError) as e:
        raise StreamError(f"the stream broke after {st.chunks} chunk(s): {type(e).__name__}: {e}",
                          partial=st.text(), **kw) from None
    if not st.done and st.finish_reason is None:
        raise StreamError(f"the stream ended after {st.chunks} chunk(s) without [DONE] or a finish_reason",
                          partial=st.text(), **kw)
    await st.seal(secrets)
    return st


def _dispatch(data: str, st: StreamState, kw: dict, on_delta) -> None:
    if data.strip() == "[DONE]":
        st.done = True
        return
    try:
        chunk: Any = json.loads(data)
    except ValueError:
        raise StreamError(f"chunk {st.chunks + 1} of the stream is not JSON: {data[:120]!r}",
                          partial=st.text(), **kw) from None
    st.chunks += 1
    if isinstance(chunk, dict) and chunk.get("error"):
        info = parse_error_body(chunk, kw["secrets"])
        raise StreamError(f"the stream carried an error: {info.short() if info else chunk['error']}",
                          kind="stream_error", info=info, partial=st.text(), **kw)
    if not isinstance(chunk, dict):
        return
    secrets = kw["secrets"]
    st.model = scrub(chunk["model"], secrets) if chunk.get("model") else st.model
    if chunk.get("usage"):
        st.usage = scrub_obj(chunk["usage"], secrets)
    for choice in chunk.get("choices") or []:
        st.choices_seen = True
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or choice.get("message") or {}
        piece = str(delta.get("content") or "")
        thought = str(delta.get("reasoning_content") or delta.get("reasoning") or "")
        if (piece or thought) and st.first_token_at is None:
            st.first_token_at = time.perf_counter()
        st.chars += len(piece) + len(thought)
        if st.chars > MAX_STREAM_CHARS:
            raise StreamError(f"the stream sent more than {MAX_STREAM_CHARS} characters of answer (the most this "
                              "client keeps); ask for less: lower max_tokens", kind="too_large", **kw)
        if piece:
            st.content.append(piece)
            if on_delta:
                on_delta(scrub(piece, secrets))
        if thought:
            st.reasoning.append(thought)
        reason = choice.get("finish_reason")
        st.finish_reason = scrub(reason, secrets) if reason else st.finish_reason
