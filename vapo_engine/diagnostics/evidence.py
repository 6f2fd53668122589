"""The evidence object the knowledge base reasons over, and pure helpers that derive facts from raw inputs.

`Evidence` holds only safe data: bodies and texts are scrubbed and bounded, the key is reduced to `KeyFacts`
(shape flags + the redacted form), proxy URLs lose their credentials. Gathering (files, git, env) happens in
`gather.py`; everything here is pure. New evidence kinds (e.g. a run's metrics) go into `extra` under a name
their predicates know, or become new fields here.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from vapo_engine.config import Secret
from vapo_engine.providers import BaseURLError, ErrorInfo, normalize_base_url, safe_text, scrub

ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
_PLACEHOLDER = re.compile(r"^(<.*>|\{\{.*\}\}|\$\{?[A-Z_]+\}?|(sk-)?(x{3,}|\.{3}|\*{3,})|your[-_ ].*|.*[-_ ]here|"
                          r"change[-_ ]?me|none|null|todo|api[-_]?key|secret|token|dummy|test|example|placeholder)$",
                          re.IGNORECASE)
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


class KeyFacts(BaseModel):
    """What the key looks like — never the key itself."""

    present: bool = False
    source: str = ""
    env_name: str | None = None
    redacted: str = "<not set>"
    length: int = 0
    looks_like_env_name: bool = False
    equals_env_name: bool = False
    quoted: bool = False
    surrounding_space: bool = False
    inner_space: bool = False
    newline: bool = False
    bearer_prefix: bool = False
    placeholder: bool = False
    truncated: bool = False
    non_ascii: bool = False


class URLFacts(BaseModel):
    raw: str
    source: str = ""
    normalised: str | None = None
    kinds: list[str] = Field(default_factory=list)
    error_kind: str | None = None
    error: str | None = None
    fix: str | None = None
    host: str = ""
    loopback: bool = False


class ProxyFacts(BaseModel):
    variables: dict[str, str] = Field(default_factory=dict)
    no_proxy: list[str] = Field(default_factory=list)
    socks: bool = False

    @property
    def active(self) -> bool:
        return bool(self.variables)

    def bypasses(self, host: str) -> bool:
        """Whether NO_PROXY makes httpx/requests skip the proxy for `host` (exact names; '*' = all)."""
        host = host.lower().strip("[]")
        return any(n == "*" or n.lower().lstrip(".") == host or (n.startswith(".") and host.endswith(n.lower()))
                   for n in self.no_proxy)


class CodeHit(BaseModel):
    file: str
    line: int
    kind: str
    """env_name_as_key | hardcoded_key"""
    snippet: str


class DotenvFacts(BaseModel):
    path: str
    status: str
    """ignored | not_ignored | not_a_repo | git_missing | error"""


SERVER_FACT_FIELDS = ("key", "url", "model", "fallback_model", "proxy", "base_url_override", "config_issues",
                      "settings_key_problems")
"""Evidence fields that `gather` fills from this server's own settings, environment and config files."""


class Evidence(BaseModel):
    """Everything known about one problem. Every field is optional; predicates skip what is missing."""

    status: int | None = None
    history: list[int] = Field(default_factory=list)
    """Earlier HTTP statuses of the same session/log, oldest first (the current one excluded)."""
    body: str | None = None
    error: ErrorInfo | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    text: str | None = None
    """Exception text, traceback or log excerpt (scrubbed, bounded)."""
    network_kind: str | None = None
    exception_type: str | None = None
    model: str | None = None
    fallback_model: str | None = None
    models_listed: list[str] | None = None
    key: KeyFacts | None = None
    url: URLFacts | None = None
    base_url_override: str | None = None
    proxy: ProxyFacts | None = None
    config_issues: list[str] = Field(default_factory=list)
    settings_key_problems: list[str] = Field(default_factory=list)
    code_hits: list[CodeHit] = Field(default_factory=list)
    dotenv: list[DotenvFacts] = Field(default_factory=list)
    attempts: int | None = None
    gave_up: str | None = None
    inputs: list[str] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    """Evidence contributed by other modules (e.g. `metrics` for training rules), keyed by name."""
    pasted: bool = False
    """The caller handed over an error (status, body, headers, log/traceback text) from *their* program."""
    server_facts: list[str] = Field(default_factory=list)
    """Fields that describe this server's own channel and files (its key, base URL, proxy variables,
    settings.json / config.toml), not the pasted error. With `pasted`, findings that need them rank after the
    findings about the error and are labelled (engine.evaluate)."""

    def caller_view(self) -> Evidence:
        """This evidence without the server's own facts: what the pasted error alone supports."""
        cleared = {name: type(self).model_fields[name].get_default(call_default_factory=True)
                   for name in self.server_facts}
        return self.model_copy(update={**cleared, "server_facts": []})

    def said(self) -> str:
        """Everything the server or the log said, as one string for pattern predicates."""
        e = self.error
        bits = [self.body, e.message if e else None, e.code if e else None, e.type if e else None, self.text]
        return "\n".join(b for b in bits if b)


def key_facts(key: Secret | None, env_name: str | None = None, source: str = "") -> KeyFacts:
    """Shape flags of a key (pure; the raw value stays inside this function)."""
    if key is None or not key.reveal():
        return KeyFacts(present=False, source=source or "missing", env_name=env_name)
    raw = key.reveal()
    core = raw.strip().strip("\"'").strip()
    if core.lower().startswith("bearer "):
        core = core[7:].strip()
    min_len = 30 if core.startswith("sk-") else 20
    return KeyFacts(
        present=True, source=source, env_name=env_name, redacted=key.redacted, length=len(raw),
        looks_like_env_name=bool(ENV_NAME.match(core)) or (env_name is not None and core == env_name),
        equals_env_name=env_name is not None and core == env_name,
        quoted=bool(raw.strip()) and (raw.strip()[0] in "\"'" or raw.strip()[-1] in "\"'"),
        surrounding_space=raw != raw.strip(), newline="\n" in raw or "\r" in raw,
        inner_space=" " in raw.strip() and not raw.strip().lower().startswith("bearer "),
        bearer_prefix=raw.strip().strip("\"'").lower().startswith("bearer"),
        placeholder=bool(_PLACEHOLDER.match(core)),
        truncated=("…" in core or "..." in core or "***" in core or len(core) < min_len)
        and not ENV_NAME.match(core),
        non_ascii=any(ord(c) > 126 for c in raw))


def url_facts(raw: str | None, source: str = "") -> URLFacts | None:
    """Normalisation result of a base URL as facts (what was wrong, what it becomes)."""
    if raw is None:
        return None
    try:
        b = normalize_base_url(raw)
    except BaseURLError as e:  # its message and fix may quote the URL, credentials included
        return URLFacts(raw=scrub(raw), source=source, error_kind=e.kind, error=scrub(e.message), fix=scrub(e.fix))
    return URLFacts(raw=scrub(raw), source=source, normalised=scrub(b.url), kinds=list(b.kinds), host=b.host,
                    loopback=b.is_loopback)


def proxy_facts(env: Mapping[str, str]) -> ProxyFacts:
    """Proxy variables in effect (values without credentials) and the NO_PROXY host list."""
    found = {k: safe_text(env[k], 200) for k in PROXY_VARS if env.get(k)}
    no_proxy = ",".join(env.get(k, "") for k in ("NO_PROXY", "no_proxy"))
    hosts = [h.strip() for h in no_proxy.split(",") if h.strip()]
    return ProxyFacts(variables=found, no_proxy=hosts,
                      socks=any(v.lower().startswith("socks") for v in found.values()))


RUN_METRIC_KINDS = ("train", "eval", "pretrain")
MAX_RUN_RECORDS = 50_000
_NONFINITE = {"nan", "-nan", "inf", "-inf", "+inf", "infinity", "-infinity"}


def pack_metrics(records: list[dict]) -> dict[str, Any]:
    """A run's metrics.jsonl records → `{"train" | "eval" | "pretrain": {name: [[step, value], ...]},
    "nonfinite": [{"step", "kind", "name", "value"}, ...] (first 50), "nonfinite_count", "records"}`.
    Non-finite values (written as "nan"/"inf" strings) are listed apart, never put into a series."""
    if len(records) > MAX_RUN_RECORDS:
        records = records[:MAX_RUN_RECORDS // 10] + records[-(MAX_RUN_RECORDS - MAX_RUN_RECORDS // 10):]
    out: dict[str, Any] = {**{k: {} for k in RUN_METRIC_KINDS}, "nonfinite": [], "nonfinite_count": 0,
                           "records": len(records)}
    for rec in records:
        kind = rec.get("kind") if rec.get("kind") in RUN_METRIC_KINDS else "train"
        step = rec.get("step") if isinstance(rec.get("step"), int) else 0
        for name, value in rec.items():
            if name in ("step", "kind", "time") or isinstance(value, bool):
                continue
            if (isinstance(value, str) and value.strip().lower() in _NONFINITE) or \
                    (isinstance(value, float) and not math.isfinite(value)):
                out["nonfinite_count"] += 1
                if len(out["nonfinite"]) < 50:
                    out["nonfinite"].append({"step": step, "kind": kind, "name": name, "value": str(value)})
            elif isinstance(value, (int, float)):
                out[kind].setdefault(name, []).append([step, float(value)])
    return out


_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|"
                  r"DefaultCPUAllocator: can't allocate memory|\bout of memory\b", re.IGNORECASE)
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$")
_KILLED = re.compile(r"^\s*Killed\b|SIGKILL|Signal 9\b|exit ?code\s*:?\s*-9\b", re.IGNORECASE)
_PROGRESS = re.compile(r"^(train|eval)\s+step\s+\d+|^value-pretrain\s+\d+")


def crash_facts(log_tail: str) -> dict[str, str] | None:
    """`{"kind": "oom" | "killed" | "traceback", "line": ...}` when a worker log *ends* in a crash: a kill
    message as its last line, or a traceback with no training progress printed after it."""
    lines = [ln.rstrip() for ln in (log_tail or "").splitlines() if ln.strip()]
    if not lines:
        return None
    if _KILLED.search(lines[-1]):
        return {"kind": "killed", "line": lines[-1].strip()}
    starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("Traceback (most recent call last)")]
    if not starts or any(_PROGRESS.match(ln) for ln in lines[starts[-1]:]):
        return None
    after = lines[starts[-1]:]
    exc = [ln for ln in after if _EXC_LINE.match(ln)]
    kind = "oom" if any(_OOM.search(ln) for ln in after) else "traceback"
    return {"kind": kind, "line": (exc[-1] if exc else after[-1]).strip()}
