"""Error bodies of OpenAI-compatible servers parsed into one shape, plus the header facts retries need.

The HTTP status is half the story; the body is the other half, and every server family writes it differently:

| server             | body                                                                                  |
|--------------------|---------------------------------------------------------------------------------------|
| OpenAI             | `{"error": {"message", "type", "param", "code": "model_not_found"}}`                  |
| vLLM (current)     | `{"error": {"message", "type": "NotFoundError", "param", "code": 404}}`               |
| vLLM (older)       | `{"object": "error", "message", "type", "param", "code": 404}`                        |
| litellm proxy      | `{"error": {"message": "litellm.AuthenticationError: …", "type", "param", "code": "401"}}` |
| llama.cpp server   | `{"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}` |
| Ollama / TGI       | `{"error": "model 'x' not found"}` (TGI adds `"error_type"`)                          |
| FastAPI apps       | `{"detail": "Not Found"}` or `{"detail": [{"loc": [...], "msg": "..."}]}`             |
| aggregators        | `{"code": 401, "msg": "…"}` / `{"success": false, "message": "…"}`, often with HTTP 200 |
| reverse proxies    | HTML (`<title>502 Bad Gateway</title>`) or plain text                                 |
"""
from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from vapo_engine.config import Secret

from .redaction import safe_text, scrub

MAX_MESSAGE = 600
RATE_LIMIT_HEADER = re.compile(r"^(x-ratelimit-.*|ratelimit.*|retry-after(-ms)?|x-request-id|request-id|"
                               r"x-should-retry|openai-processing-ms|x-litellm-.*(limit|remaining).*)$", re.IGNORECASE)
_MODEL_GONE = re.compile(r"model[^.]{0,80}?(not[ _]found|does not exist|doesn't exist|not exist|unknown|no such|"
                         r"not available|unavailable|not supported|invalid model|not[ _]allowed)|"
                         r"(unknown|invalid|unsupported|no such)[ _]model|model_not_found|no available (channel|"
                         r"distributor)|no deployments? (available|found) for", re.IGNORECASE)
_QUOTA = re.compile(r"insufficient_quota|quota|billing|insufficient[ _]balance|balance|credit|out of credits|"
                    r"payment|余额|欠费|额度", re.IGNORECASE)
_COOLDOWN = re.compile(r"cool[ -]?down|temporarily (disabled|suspended|blocked)|too many (failed|invalid|auth)",
                       re.IGNORECASE)
_TAG = re.compile(r"<[^<>]*>")
"""A tag (it ends at the next `<` too, so each `<` starts at most one short scan)."""
_ROUTE_404 = re.compile(r"^\s*(404 page not found|not found|cannot (get|post) /|no route|invalid url|"
                        r"unknown (url|route|endpoint|path))", re.IGNORECASE)


class ErrorInfo(BaseModel):
    """What the server said, normalised. Strings are scrubbed and bounded."""

    message: str = ""
    type: str | None = None
    code: str | None = None
    param: str | None = None
    shape: str = "unknown"
    """openai | vllm-legacy | litellm | llama.cpp | plain-error (Ollama/TGI) | fastapi | aggregator | html | text"""

    def short(self) -> str:
        bits = [b for b in (self.type, f"code={self.code}" if self.code else None) if b]
        return self.message + (f" ({', '.join(bits)})" if bits else "")


def _s(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def parse_error_body(body: str | bytes | Mapping | None, secrets: Iterable[Secret | str | None] = ()
                     ) -> ErrorInfo | None:
    """Parse any error body; None when the body carries no error (e.g. a normal completion)."""
    if body is None:
        return None
    data: Any = body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        if not body.strip():
            return None
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to be an error object
            return _from_text(body, secrets)
    if not isinstance(data, Mapping):
        return None
    info = _from_mapping(data)
    if info is None:
        return None
    info.message = safe_text(info.message, MAX_MESSAGE, secrets)
    info.code, info.type, info.param = (safe_text(v, 120, secrets) if v else None
                                        for v in (info.code, info.type, info.param))
    return info


def _from_mapping(data: Mapping) -> ErrorInfo | None:
    err = data.get("error")
    if isinstance(err, Mapping):
        msg = _s(err.get("message") or err.get("msg") or err.get("detail")) or json.dumps(err)[:MAX_MESSAGE]
        code, shape = err.get("code"), "openai"
        if msg.startswith("litellm."):
            shape = "litellm"
        elif isinstance(code, int) and "param" not in err:
            shape = "llama.cpp"
        elif isinstance(code, int):
            shape = "vllm"
        return ErrorInfo(message=msg, type=_s(err.get("type")), code=_s(code), param=_s(err.get("param")),
                         shape=shape)
    if isinstance(err, str) and err:
        return ErrorInfo(message=err, type=_s(data.get("error_type") or data.get("type")),
                         code=_s(data.get("code")), shape="plain-error")
    if data.get("object") == "error":
        return ErrorInfo(message=_s(data.get("message")) or "", type=_s(data.get("type")),
                         code=_s(data.get("code")), param=_s(data.get("param")), shape="vllm-legacy")
    if "detail" in data and "choices" not in data:
        return ErrorInfo(message=_detail(data["detail"]), shape="fastapi")
    return _aggregator(data)


def _detail(detail: Any) -> str:
    if isinstance(detail, list):
        parts = [f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg', '')}" if isinstance(d, Mapping)
                 else str(d) for d in detail[:5]]
        return "; ".join(parts)
    return str(detail)


def _aggregator(data: Mapping) -> ErrorInfo | None:
    if "choices" in data or "data" in data and "message" not in data:
        return None
    msg = data.get("message") or data.get("msg") or data.get("error_msg") or data.get("errmsg")
    code = data.get("code", data.get("error_code", data.get("status")))
    failed = data.get("success") is False or (code not in (None, 0, "0", 200, "200", "success", "ok"))
    if msg and failed:
        return ErrorInfo(message=str(msg), code=_s(code), type=_s(data.get("type")), shape="aggregator")
    return None


def _from_text(text: str, secrets) -> ErrorInfo:
    stripped = text.strip()
    if stripped.startswith("<"):
        inner = _element_text(stripped, "title")
        inner = _element_text(stripped, "h1") if inner is None else inner
        msg = re.sub(r"\s+", " ", inner).strip() if inner is not None else _TAG.sub(" ", stripped)
        return ErrorInfo(message=safe_text(msg.strip(), MAX_MESSAGE, secrets), shape="html")
    return ErrorInfo(message=safe_text(stripped.splitlines()[0], MAX_MESSAGE, secrets), shape="text")


def _element_text(html: str, tag: str) -> str | None:
    """The text of the first `<tag>…</tag>` (case-insensitive), found with two scans (a lazy `<tag>(.*?)</tag>`
    retried after each of many unclosed `<tag>`s is quadratic)."""
    low = html.lower()
    start = low.find(f"<{tag}>")
    end = low.find(f"</{tag}>", start + len(tag) + 2) if start >= 0 else -1
    return html[start + len(tag) + 2:end] if end >= 0 else None


def is_error_payload(data: Any) -> bool:
    """True when a 200 JSON body is really an error (no choices/data, an error object or a failure code)."""
    return isinstance(data, Mapping) and "choices" not in data and parse_error_body(data) is not None


def is_model_not_found(info: ErrorInfo | None, text: str = "", model: str | None = None) -> bool:
    """A 404 (or error body) that is about the model id, not the route."""
    hay = " ".join(filter(None, [info.message if info else "", info.code if info else "",
                                 info.type if info else "", text]))
    if info and (info.code or "").lower() in ("model_not_found", "model_not_available"):
        return True
    if _MODEL_GONE.search(hay):
        return True
    return bool(model and info and info.shape != "html" and model in hay and not _ROUTE_404.search(hay))


def is_quota_exhausted(info: ErrorInfo | None, text: str = "") -> bool:
    hay = " ".join(filter(None, [info.message if info else "", info.code if info else "",
                                 info.type if info else "", text]))
    return bool(_QUOTA.search(hay)) and not re.search(r"rate[ _-]?limit(ed)? (reached|exceeded) for requests",
                                                       hay, re.IGNORECASE)


def mentions_cooldown(info: ErrorInfo | None, text: str = "") -> bool:
    return bool(_COOLDOWN.search(" ".join(filter(None, [info.message if info else "", text]))))


def rate_limit_headers(headers: Mapping[str, str] | None, limit: int = 20,
                       secrets: Iterable[Secret | str | None] = ()) -> dict[str, str]:
    """The rate-limit / retry / request-id headers of a response (lower-case names, bounded); names and
    values are server-controlled, so both are scrubbed of `secrets` and credential-shaped text."""
    out: dict[str, str] = {}
    for k, v in (headers or {}).items():
        if RATE_LIMIT_HEADER.match(k) and len(out) < limit:
            out[scrub(k.lower(), secrets)[:200]] = scrub(v, secrets)[:200]
    return out


def retry_after_seconds(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms`, then `retry-after` (seconds or an HTTP date)."""
    if not headers:
        return None
    low = {k.lower(): v for k, v in headers.items()}
    ms = low.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = low.get("retry-after")
    if ra is None:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        parsed = email.utils.parsedate_tz(ra)
        if parsed is None:
            return None
        return max(0.0, email.utils.mktime_tz(parsed) - (time.time() if now is None else now))
