"""Typed provider errors: status, parsed body, rate-limit headers and attempts kept; the key never.

Hierarchy (the retry table in `retry.py` reads `kind` and `status`):

    ProviderError
    ├── APIConnectionError      kind: dns | refused | tls | tls_http | proxy | proxy_config | unreachable | connect | protocol
    │   └── APITimeoutError     kind: timeout
    ├── APIStatusError          any non-2xx; subclasses by status:
    │   BadRequestError 400, AuthenticationError 401, PaymentRequiredError 402, PermissionDeniedError 403,
    │   NotFoundError 404 (`target`: route | model), RequestTimeoutError 408, ConflictError 409,
    │   UnprocessableEntityError 422, RateLimitError 429 (`quota_exhausted`, `cooldown`), ServerError 5xx,
    │   RedirectError 3xx (`location`: redirects are never followed, so the key never leaves the base URL)
    ├── BadResponseError        HTTP 200 that is not a usable answer: kind error_body | not_json
    │   └── StreamError         kind stream_broken (retryable) | stream_error (error event in the stream)
    └── KeyFormatError          the key cannot be sent (newline, surrounding spaces, non-ASCII)

Every message is built from scrubbed, bounded pieces (the body, the kept headers and the message are scrubbed
of the key the client sent), so `str(e)`, `repr(e)` and `e.summary()` are safe to log and return.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vapo_engine.config.secrets import strip_url_credentials

from .errorbody import (
    ErrorInfo,
    is_model_not_found,
    is_quota_exhausted,
    mentions_cooldown,
    rate_limit_headers,
)
from .redaction import safe_text

MAX_BODY = 2000


class ProviderError(Exception):
    """Base of every error the client raises."""

    kind = "provider_error"

    def __init__(self, message: str, *, status: int | None = None, body: str | None = None,
                 info: ErrorInfo | None = None, headers: Mapping[str, str] | None = None,
                 url: str | None = None, model: str | None = None, secrets=()):
        self.message = safe_text(message, 1000, secrets)
        super().__init__(self.message)
        self.status = status
        self.body = safe_text(body, MAX_BODY, secrets) if body else None
        self.info = info
        self.headers = rate_limit_headers(headers, secrets=secrets)
        self.url = url
        self.model = model
        self.attempts = 1
        self.gave_up: str | None = None
        self.notes_: list[str] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, status={self.status}, message={self.message!r})"

    def short(self) -> str:
        """One line: status or kind, then the message."""
        if self.message.startswith("HTTP "):
            return self.message
        head = f"HTTP {self.status}" if self.status else self.kind
        return f"{head}: {self.message}"

    def summary(self) -> dict[str, Any]:
        """A bounded, JSON-safe view for results."""
        return {"type": type(self).__name__, "kind": self.kind, "status": self.status, "message": self.message,
                "error": self.info.model_dump() if self.info else None, "body": self.body,
                "rate_limit_headers": self.headers, "url": self.url, "model": self.model,
                "attempts": self.attempts, "gave_up": self.gave_up, "notes": self.notes_[:5]}


class APIConnectionError(ProviderError):
    """No HTTP response: DNS, refused, TLS, proxy, or the server dropped the connection."""

    def __init__(self, message: str, *, kind: str = "connect", exc_type: str | None = None, **kw):
        super().__init__(message, **kw)
        self.kind = kind
        self.exc_type = exc_type


class APITimeoutError(APIConnectionError):
    def __init__(self, message: str, **kw):
        kw.setdefault("kind", "timeout")
        super().__init__(message, **kw)


class APIStatusError(ProviderError):
    kind = "http_status"


class BadRequestError(APIStatusError):
    kind = "bad_request"


class AuthenticationError(APIStatusError):
    kind = "auth"


class PaymentRequiredError(APIStatusError):
    kind = "payment_required"


class PermissionDeniedError(APIStatusError):
    kind = "forbidden"


class NotFoundError(APIStatusError):
    kind = "not_found"

    @property
    def target(self) -> str:
        """'model' when the body is about the model id, else 'route' (the URL path is wrong)."""
        return "model" if is_model_not_found(self.info, self.body or "", self.model) else "route"


class RequestTimeoutError(APIStatusError):
    kind = "request_timeout"


class ConflictError(APIStatusError):
    kind = "conflict"


class UnprocessableEntityError(APIStatusError):
    kind = "unprocessable"


class RateLimitError(APIStatusError):
    kind = "rate_limit"

    @property
    def quota_exhausted(self) -> bool:
        return is_quota_exhausted(self.info, self.body or "")

    @property
    def cooldown(self) -> bool:
        return mentions_cooldown(self.info, self.body or "")


class ServerError(APIStatusError):
    kind = "server"


class RedirectError(APIStatusError):
    """A 3xx answer. The client does not follow redirects: the key goes only to the configured base URL, and
    a redirect would carry it to an address the user never configured. `location` is scrubbed and bounded;
    it is also kept in `headers["location"]` so the diagnostics can quote it."""

    kind = "redirect"

    def __init__(self, message: str, *, location: str | None = None, **kw):
        shown = safe_text(strip_url_credentials(location or ""), 300, kw.get("secrets", ())) or None
        super().__init__(message + (f"; it points to {shown}" if shown else ""), **kw)
        self.location = shown
        if shown:
            self.headers["location"] = shown


class BadResponseError(ProviderError):
    """HTTP 200 but not a usable answer (an error body, not JSON)."""

    def __init__(self, message: str, *, kind: str = "error_body", **kw):
        kw.setdefault("status", 200)
        super().__init__(message, **kw)
        self.kind = kind


class StreamError(BadResponseError):
    """The SSE stream broke, ended without `[DONE]`, sent invalid JSON or an error event."""

    def __init__(self, message: str, *, kind: str = "stream_broken", partial: str = "", **kw):
        super().__init__(message, kind=kind, **kw)
        self.partial = safe_text(partial, 500, kw.get("secrets", ()))


class KeyFormatError(ProviderError):
    """The key cannot go into an HTTP header (it was never sent)."""

    kind = "key_format"


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError, 401: AuthenticationError, 402: PaymentRequiredError, 403: PermissionDeniedError,
    404: NotFoundError, 408: RequestTimeoutError, 409: ConflictError, 422: UnprocessableEntityError,
    429: RateLimitError}


def status_error(status: int, info: ErrorInfo | None, **kw) -> APIStatusError:
    """The typed error for an HTTP status, with a readable message (a 3xx says where it pointed)."""
    if 300 <= status < 400:
        headers = {k.lower(): v for k, v in (kw.get("headers") or {}).items()}
        return RedirectError(f"HTTP {status}: redirect not followed (the key is sent only to the configured "
                             "base URL)", status=status, info=info, location=headers.get("location"), **kw)
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else APIStatusError)
    detail = info.short() if info and info.message else "(no error message in the body)"
    return cls(f"HTTP {status}: {detail}", status=status, info=info, **kw)
