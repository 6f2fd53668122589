"""The OpenAI chat-completions wire format of `serve-model`: request validation and response shapes.

`parse_chat_request` turns a decoded JSON body into a `ChatRequest` or raises `ApiError` (status, message,
type, param, code: the OpenAI error object), so every client mistake gets a 4xx with a message that says
what to send instead. The builders make the shapes OpenAI clients parse: `chat.completion` (always with
`usage`), `chat.completion.chunk` (role first, content deltas, a final chunk with `finish_reason`, an
optional usage chunk with empty `choices`) and the `data: ...` framing of server-sent events.

Torch-free and HTTP-framework-free: the ASGI app (`app.py`) and the engine (`engine.py`) use it.
Unknown request fields (presence_penalty, seed, user, ...) are accepted and ignored, as most
OpenAI-compatible servers do.
"""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from vapo_engine.config.train_model import MIN_TEMPERATURE

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4


class ApiError(Exception):
    """An error answered in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ChatRequest:
    """A validated `POST /v1/chat/completions` body. `max_tokens` None = the server's default budget."""

    model: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def number_field(data: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    """`data[name]` as a float in [lo, hi] (lo excluded with `lo_open`); `default` when absent or null; else a 400."""
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{name} must be a number, got {type(value).__name__}", name)
    if value > hi or value < lo or (lo_open and value == lo):
        side = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
        raise bad_request(f"{name} = {value} is out of range: it must be {side} and at most {hi:g}", name)
    return float(value)


def temperature_field(data: dict, default: float, hi: float) -> float:
    """`data["temperature"]`: 0 (greedy) or in [MIN_TEMPERATURE, hi]; a value in between is a 400 (dividing the
    logits by it overflows, and the model would fail with a 500)."""
    value = number_field(data, "temperature", default, 0.0, hi)
    if 0 < value < MIN_TEMPERATURE:
        raise bad_request(f"temperature = {value:g} is numerically unsafe: use 0 for greedy decoding or at least "
                          f"{MIN_TEMPERATURE:g}", "temperature")
    return value


def integer_field(data: dict, name: str, lo: int, hi: int) -> int | None:
    """`data[name]` as an int in lo..hi; None when absent or null; else a 400."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer, got {type(value).__name__}", name)
    if not lo <= value <= hi:
        raise bad_request(f"{name} = {value} is out of range: allowed {lo}..{hi}", name)
    return value


def _content(value: Any, i: int) -> str:
    """A message's content as text: a string, a list of text parts, or null (an assistant tool call)."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        if any(p.get("type", "text") != "text" for p in value):
            raise bad_request(f"messages[{i}].content has a non-text part; this server takes text only",
                              f"messages[{i}].content")
        texts = [p.get("text") for p in value]
        bad = next((j for j, t in enumerate(texts) if t is not None and not isinstance(t, str)), None)
        if bad is not None:
            raise bad_request(f"messages[{i}].content[{bad}].text must be a string, got {type(texts[bad]).__name__}",
                              f"messages[{i}].content[{bad}].text")
        return "".join(t or "" for t in texts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def _messages(data: dict) -> tuple[dict[str, str], ...]:
    msgs = data.get("messages")
    if msgs is None:
        raise bad_request("messages is required: a list of {\"role\", \"content\"} objects", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
        if m.get("role") not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        out.append({"role": m["role"], "content": _content(m.get("content"), i)})
    return tuple(out)


def _stop(data: dict) -> tuple[str, ...]:
    stop = data.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or len(items) > MAX_STOP or not all(isinstance(s, str) and s for s in items):
        raise bad_request(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return tuple(items)


def json_object(data: Any) -> dict:
    """The already-parsed JSON body, which must be an object (a type check: nothing is decoded here)."""
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


def served_model(data: dict, served: str, listed_at: str) -> str:
    """The body's `model`, which must name the served model; the errors point at `listed_at` (the route that
    lists it)."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"model is required: this server serves {served!r} ({listed_at})", "model")
    if model != served:
        raise ApiError(404, f"The model `{model[:200]}` does not exist; this server serves `{served}` "
                            f"({listed_at})", param="model", code="model_not_found")
    return model


def parse_chat_request(data: Any, *, served: str, max_n: int, max_tokens_cap: int) -> ChatRequest:
    """Validate a chat-completions body against the served model's name and the server's limits."""
    data = json_object(data)
    model = served_model(data, served, "GET /v1/models")
    max_tokens = integer_field(data, "max_completion_tokens", 1, max_tokens_cap)
    max_tokens = max_tokens if max_tokens is not None else integer_field(data, "max_tokens", 1, max_tokens_cap)
    n = integer_field(data, "n", 1, max_n)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise bad_request("stream_options must be an object like {\"include_usage\": true}", "stream_options")
    return ChatRequest(model=model, messages=_messages(data), max_tokens=max_tokens,
                       temperature=temperature_field(data, 1.0, 2.0),
                       top_p=number_field(data, "top_p", 1.0, 0.0, 1.0, lo_open=True), n=n or 1, stop=_stop(data),
                       stream=stream, include_usage=bool(options.get("include_usage", False)))


# --- responses ----------------------------------------------------------------------------------------------
def completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(12)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(cid: str, model: str, created: int, choices: list[tuple[str, str]], use: dict) -> dict:
    """A `chat.completion` object; `choices` = [(text, finish_reason)] in index order."""
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": reason} for i, (text, reason) in enumerate(choices)],
            "usage": use}


def chunk(cid: str, model: str, created: int, index: int, delta: dict, finish_reason: str | None = None,
          with_usage: bool = False) -> dict:
    """One `chat.completion.chunk` with one choice (`usage: null` on every chunk when usage was asked for)."""
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    if with_usage:
        out["usage"] = None
    return out


def usage_chunk(cid: str, model: str, created: int, use: dict) -> dict:
    """The last chunk when `stream_options.include_usage` is true: no choices, the whole request's usage."""
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
            "usage": use}


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` (or a literal such as `[DONE]`) and the blank line."""
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def model_card(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "vapo-mcp"}


def now() -> int:
    return int(time.time())
