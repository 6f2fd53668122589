"""Build `Evidence` from what a user or a tool has: status, body, headers, log text, files, code, a live error.

This is the I/O side of diagnostics (reading settings/config, scanning code, running git); the evaluator in
`engine.py` stays pure. It also records where facts came from: a status, body, headers or log text given by the
caller is a *pasted* error (`Evidence.pasted`), while the key, base URL, proxy variables and config files read
here describe this server's own channel (`Evidence.server_facts`) — an MCP server started by an IDE has no key,
and that must not be the headline of a 429 pasted from the user's program. Every string that enters `Evidence` is scrubbed (known key + credential patterns);
what a user pastes (a body, headers, a log, a question) is also cleared of bare tokens that look like a key
(`looks_like_secret`: a key with no prefix and no name around it, e.g. echoed inside an error message).
"""
from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from vapo_engine.config import (
    BASE_URL_ENV,
    Channel,
    ConfigError,
    TrainConfig,
    load_config,
    load_settings,
    resolve_channel,
)
from vapo_engine.config.secrets import looks_like_secret, redact_tokens, safe_config_dump
from vapo_engine.providers import (
    APIConnectionError,
    ProviderError,
    classify_network_text,
    parse_error_body,
    safe_text,
    scrub,
    truncate,
)
from vapo_engine.rundir import (
    CONFIG_JSON,
    METRICS,
    PROVIDER_JSON,
    ROLLOUT_JSON,
    RUN_JSON,
    SUMMARY_JSON,
    WORKER_LOG,
    RunDir,
    step_of,
)

from .evidence import (
    ENV_NAME,
    SERVER_FACT_FIELDS,
    Evidence,
    crash_facts,
    key_facts,
    pack_metrics,
    proxy_facts,
    url_facts,
)
from .scan import dotenv_status, scan_code

MAX_BODY, MAX_TEXT = 4000, 8000
RUN_LOG_LINES, RUN_LOG_CHARS = 200, 24_000
_STATUS_PATTERNS = re.compile(
    r"Error code: (\d{3})|status[_ ]?code[\"']?\s*[=:]\s*(\d{3})|HTTP/\d(?:\.\d)?\"? (\d{3})|\bHTTP (\d{3})\b|"
    r"(?:Client|Server) error '(\d{3})|\b(\d{3}) (?:Unauthorized|Forbidden|Not Found|Too Many Requests|"
    r"Internal Server Error|Bad Gateway|Service Unavailable|Gateway Time-?out|Payment Required|Bad Request)\b",
    re.IGNORECASE)
_EXC_TYPE = re.compile(r"^[ \t]*([A-Za-z_][\w.]*(?:Error|Exception|Timeout))\b", re.MULTILINE)
r"""An exception name at the start of a line (`[ \t]*`, not `\s*`: from each of n blank lines `\s*` scans all
the following ones, which is quadratic)."""
_DICT_AFTER_CODE = re.compile(r"Error code: \d{3} - (\{.*\})")
_SECRET_HEADERS = {"authorization", "cookie", "set-cookie", "proxy-authorization", "x-api-key", "api-key",
                   "x-goog-api-key", "x-auth-token", "x-access-token", "x-api-token", "apikey", "api_key"}


def clean_text(text: object, secrets=()) -> str:
    """User-pasted text with the known key, credential-shaped strings and bare key-like tokens redacted."""
    return redact_tokens(scrub(text, secrets))


def _clean(text: object, limit: int, secrets=()) -> str:
    return truncate(clean_text(text, secrets), limit)


def parse_headers(headers: Mapping[str, str] | Iterable[str] | None, secrets=()) -> dict[str, str]:
    """`{"Retry-After": "2"}` or `["retry-after: 2"]` → lower-case names, credential headers dropped, names and
    values cleaned (`clean_text`)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(headers, Mapping):
        pairs = [(str(k), str(v)) for k, v in headers.items()]
    elif headers:
        for h in headers:
            name, sep, value = str(h).partition(":")
            if not sep:
                raise ValueError(f"header {clean_text(h)!r} must look like Name: value")
            pairs.append((name, value))
    return {_clean(k.strip().lower(), 120, secrets): _clean(v.strip(), 300, secrets) for k, v in pairs[:50]
            if k.strip().lower() not in _SECRET_HEADERS}


def statuses_in_text(text: str) -> list[int]:
    """HTTP statuses mentioned in a log/traceback, in order of appearance."""
    out = []
    for m in _STATUS_PATTERNS.finditer(text or ""):
        code = next(g for g in m.groups() if g)
        if 100 <= int(code) <= 599:
            out.append(int(code))
    return out


def _body_from_text(text: str) -> Any:
    for m in _DICT_AFTER_CODE.finditer(text):
        raw = m.group(1)
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(raw)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict):
                return value
    return None


def text_facts(text: str, secrets=()) -> dict[str, Any]:
    """Statuses, network failure kind, exception type and an embedded error body of a log/traceback
    (every fact is taken from the cleaned text)."""
    text = clean_text(text, secrets)
    statuses = statuses_in_text(text)
    exc_types = _EXC_TYPE.findall(text)
    clean = truncate(text[-MAX_TEXT:] if len(text) > MAX_TEXT else text, MAX_TEXT)
    facts: dict[str, Any] = {"text": clean, "network_kind": classify_network_text(text),
                             "exception_type": exc_types[-1] if exc_types else None}
    if statuses:
        facts["status"], facts["history"] = statuses[-1], statuses[:-1]
    body = _body_from_text(text)
    if body is not None:
        facts["error"] = parse_error_body(body, secrets)
        facts["body"] = safe_text(json.dumps(body), MAX_BODY, secrets)
    return facts


def error_facts(exc: ProviderError) -> dict[str, Any]:
    """Evidence fields of a live client error (already scrubbed by the client)."""
    facts: dict[str, Any] = {"status": exc.status, "body": exc.body, "error": exc.info, "headers": exc.headers,
                             "text": exc.message, "attempts": exc.attempts, "gave_up": exc.gave_up,
                             "exception_type": type(exc).__name__}
    if isinstance(exc, APIConnectionError):
        facts["network_kind"] = exc.kind
    elif exc.kind in ("stream_broken",):
        facts["network_kind"] = "protocol"
    if exc.model:
        facts["model"] = exc.model
    return facts


def channel_facts(channel: Channel, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Key shape, URL shape, models and proxy facts of a resolved channel."""
    env = os.environ if env is None else env
    override = env.get(BASE_URL_ENV) if channel.base_url_source.startswith("environment") else None
    return {"key": key_facts(channel.key, channel.api_key_env, channel.key_source),
            "url": url_facts(channel.base_url, channel.base_url_source), "model": channel.reasoning_model,
            "fallback_model": channel.fallback_model, "proxy": proxy_facts(env),
            "base_url_override": scrub(override) if override else None}


def settings_key_problems(path: Path) -> list[str]:
    """Credential material written into settings.json (read raw, so it works even when validation fails)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    api = data.get("api") if isinstance(data, dict) else None
    if not isinstance(api, dict):
        return []
    out = []
    for name in ("api_key", "key", "token", "apikey"):
        if isinstance(api.get(name), str) and api[name]:
            out.append(f"{path.name}: api.{name} holds a value ({safe_text(api[name], 60, [api[name]])})")
    env_name = api.get("api_key_env")
    if isinstance(env_name, str) and env_name and not ENV_NAME.match(env_name) and \
            (len(env_name) >= 20 or env_name.startswith("sk-") or looks_like_secret(env_name)):
        out.append(f"{path.name}: api.api_key_env looks like a key, not a variable name "
                   f"({safe_text(env_name, 60, [env_name])})")
    headers = api.get("default_headers")
    if isinstance(headers, dict) and any(str(k).lower() == "authorization" for k in headers):
        out.append(f"{path.name}: api.default_headers contains an Authorization header")
    return out


def _settings_facts(settings_path: Path, env: Mapping[str, str] | None, config_path: Path | None
                    ) -> dict[str, Any]:
    facts: dict[str, Any] = {"config_issues": [], "settings_key_problems": settings_key_problems(settings_path)}
    config = None
    if config_path is not None:
        try:
            config = load_config(config_path)
        except ConfigError as e:
            facts["config_issues"] += [_clean(i, 400) for i in e.issues]
    try:
        settings = load_settings(settings_path)
    except ConfigError as e:
        facts["config_issues"] += [_clean(i, 400) for i in e.issues]
        return facts
    channel, _ = resolve_channel(settings, config, env=env, dotenv_path=settings_path.resolve().parent / ".env",
                                 settings_file=str(settings_path))
    facts.update(channel_facts(channel, env))
    facts["_secrets"] = channel.secrets()
    return facts


def gather_evidence(*, status: int | None = None, body: str | None = None,
                    headers: Mapping[str, str] | Iterable[str] | None = None, text: str | None = None,
                    settings_path: str | Path | None = None, config_path: str | Path | None = None,
                    code_path: str | Path | None = None, env: Mapping[str, str] | None = None,
                    model: str | None = None, base_url: str | None = None, history: list[int] | None = None,
                    error: ProviderError | None = None, channel: Channel | None = None,
                    run_dir: str | Path | None = None) -> Evidence:
    """Everything given, as one scrubbed `Evidence`. Missing files become config issues, not exceptions;
    a `run_dir` that is not a run directory raises `ValueError`."""
    fields: dict[str, Any] = {"inputs": [], "extra": {},
                              "pasted": any(x is not None and x != "" for x in (status, body, headers, text))}
    secrets: list = []
    if settings_path is not None or config_path is not None:
        sp = Path(settings_path) if settings_path is not None else None
        cp = Path(config_path) if config_path is not None else None
        if sp is not None:
            fields.update(_settings_facts(sp, env, cp))
            secrets = fields.pop("_secrets", [])
        elif cp is not None:
            fields["config_issues"] = _config_only(cp)
        fields["inputs"].append("config files")
    if channel is not None:
        fields.update(channel_facts(channel, env))
        secrets = channel.secrets()
        fields["inputs"].append("channel")
    server = {name for name in SERVER_FACT_FIELDS if name in fields}
    if text:
        fields["extra"]["question"] = _clean(text, 2000, secrets)
    if config_path is not None and (cfg := _config_dump(Path(config_path))) is not None:
        fields["extra"]["config"] = cfg
    if run_dir is not None:
        text = _add_run(fields, run_dir, text, secrets)
    if text:
        fields.update({k: v for k, v in text_facts(text, secrets).items() if v is not None})
        fields["inputs"].append("log/traceback text")
    if error is not None:
        fields.update({k: v for k, v in error_facts(error).items() if v not in (None, {}, "")})
        fields["inputs"].append("client error")
        server -= {"model"} if error.model else set()
    _direct(fields, secrets, status=status, body=body, headers=headers, model=model, base_url=base_url,
            history=history)
    server -= {"model"} if model else set()
    server -= {"url"} if base_url else set()
    if code_path is not None:
        _code(fields, Path(code_path), settings_path, secrets)
    if "proxy" not in fields:
        fields["proxy"] = proxy_facts(os.environ if env is None else env)
        server.add("proxy")
    fields["server_facts"] = sorted(server)
    return Evidence(**fields)


def with_decisions(config: dict | None) -> dict | None:
    """A config.json written before `decisions` existed gets them derived (the rules read decisions.*)."""
    if config is None or "decisions" in config:
        return config
    try:
        return {**config, "decisions": TrainConfig.model_validate(config).decisions.model_dump(mode="json")}
    except ValueError:
        return config


def _config_dump(cp: Path) -> dict | None:
    """The config as data for the training rules, with URL credentials and a pasted key redacted."""
    try:
        return safe_config_dump(load_config(cp).model_dump(mode="json"))
    except (ConfigError, OSError, ValueError):
        return None


def _add_run(fields: dict, run_dir: str | Path, text: str | None, secrets: list) -> str | None:
    """Put a run's facts into `extra` (its config.json wins over config_path) and return the text to analyse:
    the worker.log tail followed by the user's own text (so the existing log/traceback rules see both)."""
    run = run_facts(run_dir, secrets)
    fields["extra"].update({k: v for k, v in run.items() if v is not None})
    tail = run["run"]["log_tail"]
    files = [n for n in (CONFIG_JSON, SUMMARY_JSON, WORKER_LOG) if run["run"]["files"].get(n)]
    fields["inputs"].append(f"run directory ({run['metrics']['records']} metric records"
                            + "".join(f", {n}" for n in files) + ")")
    return "\n".join(t for t in (tail, text) if t) or None


def run_facts(run_dir: str | Path, secrets=()) -> dict[str, Any]:
    """`Evidence.extra` entries of a training run directory: `config` (config.json), `metrics` (metrics.jsonl,
    packed), `run` (id, summary.json, bounded worker.log tail, crash, checkpoint steps). Raises `ValueError`
    when `run_dir` is missing or holds none of the files a run directory has."""
    rd = RunDir(Path(run_dir).expanduser())
    p = rd.path
    if not p.is_dir():
        raise ValueError(f"run directory {str(p)!r} not found: pass the directory of a run "
                         "(<runtime.log_dir>/<experiment>/<run id>, the run_dir start_training returned)")
    present = {n: rd.file(n).is_file() for n in (RUN_JSON, CONFIG_JSON, SUMMARY_JSON, METRICS, WORKER_LOG)}
    if not any(present[n] for n in (RUN_JSON, CONFIG_JSON, METRICS)):
        raise ValueError(f"{str(p)!r} is not a run directory: it has no run.json, config.json or metrics.jsonl")
    meta, summary, config, provider, rollout = (rd.read_json(n) for n in (RUN_JSON, SUMMARY_JSON, CONFIG_JSON,
                                                                           PROVIDER_JSON, ROLLOUT_JSON))
    config = with_decisions(config)
    present[SUMMARY_JSON], present[CONFIG_JSON] = summary is not None, config is not None  # readable
    tail = _clean(rd.log_tail(RUN_LOG_LINES, RUN_LOG_CHARS, max_bytes=256_000), RUN_LOG_CHARS, secrets)
    finished = summary is not None and summary.get("status") == "succeeded"
    steps = sorted(s for s in map(step_of, rd.usable_checkpoints()[0]) if s is not None)
    run_id = meta.get("run_id") if meta is not None else None
    return {"config": config, "metrics": pack_metrics(rd.metrics()),
            "run": {"dir": str(p), "run_id": run_id or p.name, "summary": summary, "log_tail": tail,
                    "crash": None if finished else crash_facts(tail), "checkpoints": steps, "files": present,
                    "provider_down": _provider_down(provider, secrets),
                    "rollout_down": _provider_down(rollout, secrets, ("reason", "fix"))}}


def _provider_down(state: Any, secrets, keys=("kind", "reason", "fix")) -> dict | None:
    """provider.json's verdict (provider samples stopped), or rollout.json's (the inference servers were given
    up on), its strings cleaned again before they are shown."""
    down = state.get("down") if isinstance(state, dict) else None
    if not isinstance(down, dict):
        return None
    return {k: _clean(str(down.get(k) or ""), 600, secrets) for k in keys}


def _config_only(cp: Path) -> list[str]:
    try:
        load_config(cp)
    except ConfigError as e:
        return [_clean(i, 400) for i in e.issues]
    return []


def _direct(fields: dict, secrets: list, *, status, body, headers, model, base_url, history) -> None:
    if status is not None:
        if fields.get("status") not in (None, status):
            fields.setdefault("history", []).append(fields["status"])
        fields["status"] = int(status)
        fields["inputs"].append("status code")
    if body:
        body = clean_text(body, secrets)
        fields["body"] = truncate(body, MAX_BODY)
        fields["error"] = parse_error_body(body, secrets)
        fields["inputs"].append("error body")
    if headers:
        fields["headers"] = parse_headers(headers, secrets)
        fields["inputs"].append("headers")
    if model:
        fields["model"] = model
    if base_url:
        fields["url"] = url_facts(base_url, "given")
    if history:
        fields["history"] = list(history) + [s for s in fields.get("history", []) if s not in history]


def _code(fields: dict, root: Path, settings_path, secrets=()) -> None:
    if not root.exists():  # the path is echoed, so it is scrubbed like any pasted text (a key pasted as a path)
        fields.setdefault("config_issues", []).append(f"{_clean(root, 300, secrets)}: code path not found")
        return
    hits, envs = scan_code(root)
    if settings_path is not None:
        env_file = Path(settings_path).resolve().parent / ".env"
        if env_file.is_file() and env_file.resolve() not in {e.resolve() for e in envs}:
            envs.append(env_file)
    fields["code_hits"] = hits
    fields["dotenv"] = [dotenv_status(e) for e in envs[:20]]
    fields["inputs"].append("code scan")
