"""Base-URL normalisation for OpenAI-compatible APIs.

The client always calls `<base>/chat/completions` and `<base>/models`, where `<base>` ends in a version
segment (`/v1`, `/v4`, `/v1beta`). Users paste many shapes; each repair is recorded (`kinds`, `changes`)
so `check_channel` can tell them what other clients (the openai SDK, curl scripts) will get wrong:

| pasted                                   | kind              | normalised                 |
|------------------------------------------|-------------------|----------------------------|
| `"https://h/api/v1"` with quotes/spaces  | `quotes`/`spaces` | `https://h/api/v1`         |
| `https://h/api/v1/`                      | `trailing_slash`  | `https://h/api/v1`         |
| `https://h/api`                          | `missing_v1`      | `https://h/api/v1`         |
| `https://h/api/v1/v1`                    | `double_v1`       | `https://h/api/v1`         |
| `https://h/api/v1/chat/completions`      | `endpoint_pasted` | `https://h/api/v1`         |
| `https://h//api/v1`                      | `double_slash`    | `https://h/api/v1`         |
| `h/api/v1` (no scheme)                   | error `no_scheme` | (refused: `BaseURLError`)  |
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from vapo_engine.config.secrets import strip_url_credentials
from vapo_engine.errors import UserError

ENDPOINTS = ("/chat/completions", "/completions", "/models", "/embeddings", "/responses")
_VERSION = re.compile(r"/v\d+(?:alpha\d*|beta\d*)?$", re.IGNORECASE)
_DOUBLE_VERSION = re.compile(r"(/v\d+(?:alpha\d*|beta\d*)?)\1$", re.IGNORECASE)
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "0.0.0.0"}

KIND_TEXT = {
    "spaces": "removed surrounding whitespace",
    "quotes": "removed surrounding quotes",
    "query": "dropped a query string / fragment",
    "double_slash": "collapsed a double slash in the path",
    "trailing_slash": "removed a trailing slash",
    "endpoint_pasted": "removed a pasted endpoint path (the base URL must stop before /chat/completions)",
    "double_v1": "removed a doubled version segment (/v1/v1)",
    "missing_v1": "appended the missing /v1",
}


URL_CREDENTIALS_WITH_KEY = "credentials_with_key"
"""BaseURLError kind: the base URL has user:password@ and a key is configured (ProviderClient refuses it)."""


def url_has_credentials(url: str) -> bool:
    """Whether `url` carries `user[:password]@` before its host."""
    try:
        parts = urlsplit(url)
        return parts.username is not None or parts.password is not None
    except ValueError:
        return False


class BaseURLError(UserError):
    """The base URL cannot be used (no scheme, unsupported scheme, no host). `fix` says what to write.
    The message and the fix quote the URL without its `user:pass@` credentials (`raw` keeps them)."""

    def __init__(self, raw: str, kind: str, message: str, fix: str):
        fix = strip_url_credentials(fix)
        super().__init__(f"base URL {strip_url_credentials(raw)!r}: {message}. Fix: {fix}")
        self.raw, self.kind, self.message, self.fix = raw, kind, message, fix


@dataclass(frozen=True)
class BaseURL:
    """A normalised base URL (ends with the version segment, no trailing slash) and what was repaired."""

    url: str
    original: str
    kinds: tuple[str, ...] = ()

    @property
    def changes(self) -> list[str]:
        return [KIND_TEXT.get(k, k) for k in self.kinds]

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)

    @property
    def origin(self) -> tuple[str, str, int]:
        """(scheme, host, port) — where the key may go; default ports filled in."""
        return origin_of(self.url)

    def owns(self, url: str) -> bool:
        """True when `url` has this base URL's origin (the only origin the key is ever sent to)."""
        try:
            return origin_of(url) == self.origin
        except ValueError:
            return False

    def endpoint(self, path: str) -> str:
        """`<base>/<path>` with exactly one slash between them."""
        return f"{self.url}/{path.lstrip('/')}"

    def __str__(self) -> str:
        return self.url


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, lower-case host, port) of `url`, the port defaulted from the scheme (80 / 443)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def is_loopback_host(host: str) -> bool:
    """True for localhost names and loopback/unspecified IP addresses."""
    host = (host or "").strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def normalize_base_url(raw: str, *, append_version: bool = True) -> BaseURL:
    """Normalise a pasted base URL; raise `BaseURLError` when no scheme/host can be trusted."""
    kinds: list[str] = []
    text = _strip_wrapping(raw or "", kinds)
    if not text:
        raise BaseURLError(raw, "empty", "it is empty", "set api.base_url, e.g. https://api.openai.com/v1")
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError as e:
        raise BaseURLError(raw, "malformed", f"it cannot be parsed ({str(e).split(':')[0].lower()})",
                           "write it as https://host[:port]/path with a port between 1 and 65535") from None
    if "://" not in text:
        guess = "https://" + text.lstrip("/")
        raise BaseURLError(raw, "no_scheme", "the scheme is missing (http:// or https://)",
                           f"write it with the scheme, e.g. {guess!r}")
    if parts.scheme.lower() not in ("http", "https"):
        raise BaseURLError(raw, "bad_scheme", f"unsupported scheme {parts.scheme!r}",
                           "use https:// (or http:// for a local server)")
    if not parts.hostname:
        raise BaseURLError(raw, "no_host", "there is no host name", "write it as https://host[:port]/path")
    if parts.query or parts.fragment:
        kinds.append("query")
    path = _normalise_path(parts.path, kinds, append_version)
    url = urlunsplit((parts.scheme.lower(), parts.netloc, path, "", ""))
    return BaseURL(url=url, original=raw, kinds=tuple(kinds))


def _strip_wrapping(text: str, kinds: list[str]) -> str:
    if text != text.strip():
        kinds.append("spaces")
        text = text.strip()
    quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`"
    if quoted or (text[:1] == "<" and text[-1:] == ">"):
        kinds.append("quotes")
        text = text[1:-1].strip()
    return text


def _normalise_path(path: str, kinds: list[str], append_version: bool) -> str:
    if "//" in path:
        kinds.append("double_slash")
        path = re.sub("/{2,}", "/", path)
    if path.endswith("/") and path != "/":
        kinds.append("trailing_slash")
    path = path.rstrip("/")
    stripped = True
    while stripped:
        stripped = False
        for ep in ENDPOINTS:
            if path.lower().endswith(ep):
                path = path[: -len(ep)].rstrip("/")
                if "endpoint_pasted" not in kinds:
                    kinds.append("endpoint_pasted")
                stripped = True
    while _DOUBLE_VERSION.search(path):
        path = _DOUBLE_VERSION.sub(r"\1", path)
        if "double_v1" not in kinds:
            kinds.append("double_v1")
    if append_version and not _VERSION.search(path):
        kinds.append("missing_v1")
        path += "/v1"
    return path
