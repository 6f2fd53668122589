"""OpenAI-compatible API client: base-URL normalisation, typed errors, the retry table, SSE, fallback, and
adaptive concurrency for bursts (`pool.py`) with a background worker for a training loop (`worker.py`).

Torch-free and MCP-free; `tools/channel.py` builds the agent-facing checks on top of it.
"""
from .client import ChatResult, ModelList, ProviderClient, is_model_unavailable, safe_error_text
from .errorbody import (
                        ErrorInfo,
                        is_error_payload,
                        is_model_not_found,
                        is_quota_exhausted,
                        mentions_cooldown,
                        parse_error_body,
                        rate_limit_headers,
                        retry_after_seconds,
)
from .errors import (
                        APIConnectionError,
                        APIStatusError,
                        APITimeoutError,
                        AuthenticationError,
                        BadRequestError,
                        BadResponseError,
                        ConflictError,
                        KeyFormatError,
                        NotFoundError,
                        PaymentRequiredError,
                        PermissionDeniedError,
                        ProviderError,
                        RateLimitError,
                        RedirectError,
                        RequestTimeoutError,
                        ServerError,
                        StreamError,
                        UnprocessableEntityError,
                        status_error,
)
from .netclass import classify_network_text, exception_text
from .pool import (
                        ConcurrencyController,
                        ConcurrencyPolicy,
                        ProviderDown,
                        ProviderDownError,
                        ProviderStats,
                        down_kind,
                        plain_down,
)
from .redaction import guard_logs, safe_text, scrub, scrub_model, scrub_obj, truncate
from .retry import Decision, RetryPolicy, backoff, call_with_retry, decide
from .urls import BaseURL, BaseURLError, is_loopback_host, normalize_base_url
from .worker import ProviderRequest, ProviderSample, ProviderWorker, run_requests, sample_once

__all__ = [
    "APIConnectionError", "APIStatusError", "APITimeoutError", "AuthenticationError", "BadRequestError",
    "BadResponseError", "BaseURL", "BaseURLError", "ChatResult", "ConcurrencyController",
    "ConcurrencyPolicy", "ConflictError", "Decision", "ErrorInfo", "KeyFormatError", "ModelList",
    "NotFoundError", "PaymentRequiredError", "PermissionDeniedError", "ProviderClient", "ProviderDown",
    "ProviderDownError", "ProviderError", "ProviderRequest", "ProviderSample", "ProviderStats",
    "ProviderWorker", "RateLimitError", "RedirectError", "RequestTimeoutError", "RetryPolicy",
    "ServerError", "StreamError", "UnprocessableEntityError", "backoff", "call_with_retry",
    "classify_network_text", "decide", "down_kind", "exception_text", "guard_logs", "is_error_payload",
    "is_loopback_host", "is_model_not_found", "is_model_unavailable", "is_quota_exhausted",
    "mentions_cooldown", "normalize_base_url", "parse_error_body", "plain_down", "rate_limit_headers",
    "retry_after_seconds", "run_requests", "safe_error_text", "safe_text", "sample_once", "scrub",
    "scrub_model", "scrub_obj", "status_error", "truncate",
]
