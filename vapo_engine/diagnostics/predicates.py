"""Named predicates over `Evidence` (what rules match on) and named facts (what rule texts can quote).

A predicate is `fn(ev, **args) -> str | None`: a sentence of concrete evidence when it holds, None when not.
Rule files refer to predicates by name (`{"status_in": [401]}`), so the knowledge base stays data; a new
evidence kind registers its own predicates with `@predicate` in a module listed in `diagnostics.__init__`.
A fact is `fn(ev) -> str | None`, usable as `{name}` in a rule's evidence and fix templates.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from vapo_engine.providers import (
    is_model_not_found,
    is_quota_exhausted,
    mentions_cooldown,
    retry_after_seconds,
)

from .evidence import Evidence

Predicate = Callable[..., "str | None"]
PREDICATES: dict[str, Predicate] = {}
FACTS: dict[str, Callable[[Evidence], str | None]] = {}


def predicate(fn: Predicate) -> Predicate:
    """Register `fn` under its name (without a leading underscore)."""
    PREDICATES[fn.__name__.lstrip("_")] = fn
    return fn


def fact(name: str):
    def deco(fn):
        FACTS[name] = fn
        return fn
    return deco


def _excerpt(m: re.Match, text: str, width: int = 60) -> str:
    a, b = max(0, m.start() - width), min(len(text), m.end() + width)
    return ("…" if a else "") + text[a:b].replace("\n", " ").strip() + ("…" if b < len(text) else "")


# --- HTTP -----------------------------------------------------------------------------------------------

@predicate
def status_in(ev: Evidence, codes: list[int]) -> str | None:
    return f"HTTP {ev.status}" if ev.status in codes else None


@predicate
def status_range(ev: Evidence, low: int, high: int) -> str | None:
    return f"HTTP {ev.status}" if ev.status is not None and low <= ev.status <= high else None


@predicate
def history_has(ev: Evidence, codes: list[int]) -> str | None:
    earlier = [s for s in ev.history if s in codes]
    return f"earlier in the same session/log: HTTP {', '.join(map(str, earlier))}" if earlier else None


@predicate
def said_matches(ev: Evidence, pattern: str) -> str | None:
    """Regex over everything the server/log said (body, parsed error, exception text)."""
    text = ev.said()
    m = re.search(pattern, text, re.IGNORECASE)
    return f"the error says: {_excerpt(m, text)!r}" if m else None


@predicate
def error_present(ev: Evidence) -> str | None:
    return f"the body holds an error: {ev.error.short()[:200]!r}" if ev.error and ev.error.message else None


@predicate
def model_not_found(ev: Evidence) -> str | None:
    if not (ev.status == 404 or (ev.error is not None and ev.status in (400, 200, None))):
        return None
    if is_model_not_found(ev.error, ev.said(), ev.model):
        said = ev.error.message if ev.error else ev.said()
        return f"the server says the model is unknown: {said[:160]!r}"
    return None


@predicate
def route_not_found(ev: Evidence) -> str | None:
    if ev.status != 404 or is_model_not_found(ev.error, ev.said(), ev.model):
        return None
    said = (ev.error.message if ev.error else "") or (ev.body or "")[:80] or "(empty body)"
    return f"HTTP 404 that does not mention a model ({said[:120]!r}): the URL path does not exist"


@predicate
def model_missing_from_list(ev: Evidence) -> str | None:
    if not ev.model or ev.models_listed is None or ev.model in ev.models_listed:
        return None
    close = close_matches(ev.model, ev.models_listed)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    return f"{ev.model!r} is not among the {len(ev.models_listed)} models GET /models lists{hint}"


@predicate
def quota_exhausted(ev: Evidence) -> str | None:
    if ev.status not in (429, 402, 403, 200, None):
        return None
    if ev.status == 402 or is_quota_exhausted(ev.error, ev.body or ev.text or ""):
        return f"HTTP {ev.status}: the message is about quota/balance/billing" if ev.status else \
            "the message is about quota/balance/billing"
    return None


@predicate
def cooldown(ev: Evidence) -> str | None:
    return "the message mentions a cooldown / temporary block" if mentions_cooldown(ev.error, ev.body or "") \
        else None


@predicate
def header_present(ev: Evidence, name: str) -> str | None:
    value = ev.headers.get(name.lower())
    return f"{name.lower()}: {value}" if value is not None else None


@predicate
def gave_up(ev: Evidence) -> str | None:
    return f"the client gave up: {ev.gave_up}" if ev.gave_up and ev.attempts else None


# --- network --------------------------------------------------------------------------------------------

@predicate
def network(ev: Evidence, kind: str) -> str | None:
    if ev.network_kind != kind:
        return None
    detail = re.sub(r"\s+", " ", (ev.text or ""))[:200]
    return f"connection failure ({kind}): {detail}" if detail else f"connection failure ({kind})"


@predicate
def proxy_set(ev: Evidence) -> str | None:
    p = ev.proxy
    return f"proxy variables set: {', '.join(f'{k}={v}' for k, v in p.variables.items())}" if p and p.active \
        else None


@predicate
def proxy_captures_loopback(ev: Evidence) -> str | None:
    p = ev.proxy
    if not p or not p.active:
        return None
    hosts = [ev.url.host] if ev.url and ev.url.loopback else []
    if ev.url is None and re.search(r"127\.0\.0\.1|localhost", ev.text or ""):
        hosts = ["127.0.0.1", "localhost"]
    captured = [h for h in hosts if not p.bypasses(h)]
    if not captured:
        return None
    return (f"{', '.join(p.variables)} set and NO_PROXY ({','.join(p.no_proxy) or 'unset'}) does not list "
            f"{', '.join(captured)}: local requests are sent to the proxy")


# --- key ------------------------------------------------------------------------------------------------

_KEY_FLAGS = {
    "missing": lambda k: (not k.present, "no key: {env} is not set in the environment or .env"),
    "env_name": lambda k: (k.looks_like_env_name, "the key value {red} looks like a variable name"
                           + (" — it equals api.api_key_env" if k.equals_env_name else "")),
    "quoted": lambda k: (k.quoted, "the key value starts or ends with a quote character ({red})"),
    "whitespace": lambda k: (k.surrounding_space or k.newline or k.inner_space,
                             "the key value contains whitespace or a line break ({red})"),
    "bearer": lambda k: (k.bearer_prefix, "the key value itself starts with 'Bearer' ({red})"),
    "placeholder": lambda k: (k.placeholder, "the key value is a placeholder ({red})"),
    "truncated": lambda k: (k.truncated and k.present, "the key looks cut short or masked ({red})"),
    "non_ascii": lambda k: (k.non_ascii, "the key contains non-ASCII characters (smart quotes? {red})"),
}


@predicate
def key(ev: Evidence, flag: str) -> str | None:
    """A shape flag of the key: missing, env_name, quoted, whitespace, bearer, placeholder, truncated."""
    k = ev.key
    if k is None or flag not in _KEY_FLAGS:
        return None
    hit, text = _KEY_FLAGS[flag](k)
    return text.format(env=k.env_name or "the key variable", red=k.redacted) if hit else None


@predicate
def said_mentions_env_name(ev: Evidence) -> str | None:
    """The error/log quotes an environment-variable-like name where the key should be."""
    said = ev.said()
    names = [ev.key.env_name] if ev.key and ev.key.env_name else []
    for name in names:
        if name and re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", said):
            return f"the error quotes {name!r}, the name of the key variable"
    m = re.search(r"(?:provided|api[ _]?key|token)[\"':= ]+([A-Z][A-Z0-9]*(?:_[A-Z0-9*]+)*_(?:KEY|TOKEN))\b", said)
    return f"the error quotes {m.group(1)!r} as the key it received" if m else None


# --- url / config / code --------------------------------------------------------------------------------

@predicate
def url(ev: Evidence, kind: str) -> str | None:
    u = ev.url
    if not u or (kind not in u.kinds and u.error_kind != kind):
        return None
    if u.error_kind == kind:
        return f"base URL {u.raw!r} ({u.source}): {u.error}"
    return f"base URL {u.raw!r} ({u.source}) → {u.normalised}"


@predicate
def url_repaired(ev: Evidence) -> str | None:
    u = ev.url
    if not u or not u.kinds:
        return None
    return f"base URL {u.raw!r} had to be repaired ({', '.join(u.kinds)}) → {u.normalised}"


@predicate
def base_url_overridden(ev: Evidence) -> str | None:
    return f"TAOTOKEN_BASE_URL overrides settings.json: {ev.base_url_override}" if ev.base_url_override else None


@predicate
def code_hit(ev: Evidence, kind: str) -> str | None:
    hits = [h for h in ev.code_hits if h.kind == kind]
    if not hits:
        return None
    shown = "; ".join(f"{h.file}:{h.line}: {h.snippet}" for h in hits[:3])
    return shown + (f" (+{len(hits) - 3} more)" if len(hits) > 3 else "")


@predicate
def dotenv_not_ignored(ev: Evidence) -> str | None:
    bad = [d.path for d in ev.dotenv if d.status == "not_ignored"]
    return f"not git-ignored: {', '.join(bad[:5])}" if bad else None


@predicate
def config_invalid(ev: Evidence) -> str | None:
    return "; ".join(ev.config_issues[:3]) if ev.config_issues else None


@predicate
def settings_key_problem(ev: Evidence) -> str | None:
    return "; ".join(ev.settings_key_problems[:3]) if ev.settings_key_problems else None


@predicate
def text_matches(ev: Evidence, pattern: str) -> str | None:
    """Regex over the exception/log text only."""
    m = re.search(pattern, ev.text or "", re.IGNORECASE | re.MULTILINE)
    return f"the log/traceback contains {_excerpt(m, ev.text or '', 40)!r}" if m else None


def close_matches(name: str, candidates: list[str], n: int = 3) -> list[str]:
    """Listed ids that look like `name`: same id under a vendor prefix (qwen/...), same family and size
    (qwen-14b ~ qwen2.5-14b-instruct), then string similarity."""
    low = name.lower()
    tail = [c for c in candidates if c.lower().rsplit("/", 1)[-1] == low]
    fam = re.match(r"[a-z]+", low)
    size = re.search(r"(?<![a-z0-9.])(\d+(?:\.\d+)?[bm])(?![a-z0-9])", low)
    same = [c for c in candidates if fam and size and c.lower().rsplit("/", 1)[-1].startswith(fam.group(0))
            and re.search(rf"(?<![0-9.]){re.escape(size.group(1))}(?![a-z0-9])", c.lower())]
    by_low = {c.lower(): c for c in candidates}
    similar = [by_low[m] for m in difflib.get_close_matches(low, list(by_low), n=n, cutoff=0.6)]
    return list(dict.fromkeys(c for c in tail + same + similar if c != name))[:n]


# --- facts for templates --------------------------------------------------------------------------------

_NAMED_MODEL = re.compile(r"\bmodel\b[ :=]*[`'\"]([^`'\"\s]{1,100})[`'\"]", re.IGNORECASE)


def named_model(ev: Evidence) -> str | None:
    """The model id the error itself quotes ("The model `gpt-5` does not exist"), when none was given."""
    m = _NAMED_MODEL.search(ev.said())
    return m.group(1) if m else None


for _name, _get in {
    "status": lambda ev: str(ev.status) if ev.status is not None else None,
    "model": lambda ev: ev.model or named_model(ev),
    "redirect_location": lambda ev: ev.headers.get("location"),
    "fallback_model": lambda ev: ev.fallback_model,
    "api_key_env": lambda ev: ev.key.env_name if ev.key else None,
    "key_source": lambda ev: ev.key.source if ev.key else None,
    "key_redacted": lambda ev: ev.key.redacted if ev.key else None,
    "base_url": lambda ev: ev.url.raw if ev.url else None,
    "normalised_url": lambda ev: (ev.url.normalised or ev.url.fix) if ev.url else None,
    "host": lambda ev: ev.url.host if ev.url else None,
    "retry_after": lambda ev: (f"{retry_after_seconds(ev.headers):g}s" if retry_after_seconds(ev.headers)
                               is not None else None),
    "error_message": lambda ev: ev.error.message[:200] if ev.error else None,
    "close_matches": lambda ev: (", ".join(close_matches(ev.model, ev.models_listed or []))
                                 or ("none; pick one GET /models lists" if ev.models_listed else None))
    if ev.model else None,
    "no_proxy_hint": lambda ev: ",".join(dict.fromkeys([*(ev.proxy.no_proxy if ev.proxy else []),
                                                         "localhost", "127.0.0.1", "::1"])),
}.items():
    FACTS[_name] = _get
