"""`vapo-mcp check | smoke | diagnose`: the API-channel tools at a terminal (readable text or `--json`).

Exit codes: 0 = channel OK / smoke passed / diagnosis printed, 1 = check failed / smoke failed,
2 = user error (bad arguments, invalid settings.json or config.toml), printed without a traceback.
"""
from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from vapo_engine.config import ConfigError
from vapo_engine.config.secrets import redact_tokens
from vapo_engine.providers import scrub

from .common import CONFIG_ENV, SETTINGS_ENV, UserError, add_file_options, add_json_option, print_json


def register(sub) -> None:
    chk = sub.add_parser("check", help="check the API channel: base URL, key, GET /models, a tiny chat call")
    add_file_options(chk)
    add_json_option(chk)
    chk.set_defaults(func=check)

    smk = sub.add_parser("smoke", help="ask a reasoning question with a known answer (default: 240 km in 3 h → 80)")
    add_file_options(smk)
    add_json_option(smk)
    smk.add_argument("--prompt", help="question to ask (default: the train question)")
    smk.add_argument("--expect", help="text/number the answer must contain (default: 80)")
    smk.add_argument("--model", help="model id (default: settings.json models.reasoning)")
    smk.add_argument("--no-stream", action="store_true", help="do not stream even if runtime.stream is true")
    smk.add_argument("--max-tokens", type=int, default=256, help="max_tokens of the call (default 256)")
    smk.set_defaults(func=smoke)

    dia = sub.add_parser("diagnose", help="diagnose an API error / config / code: ranked causes and fixes")
    dia.add_argument("--status", type=int, help="HTTP status code, e.g. 401")
    dia.add_argument("--body", metavar="TEXT|@FILE", help="error body (JSON or text), or @file to read it")
    dia.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                     help="response header, repeatable (e.g. --header 'retry-after: 20')")
    dia.add_argument("--text", metavar="TEXT|@FILE", help="exception message or traceback, or @file")
    dia.add_argument("--log", metavar="FILE", help="log file to scan (its last 256 KB)")
    dia.add_argument("--code", metavar="PATH", help="an existing file or folder to scan for key-handling bugs")
    dia.add_argument("--settings", help=f"settings.json (default: ${SETTINGS_ENV} or ./settings.json if present)")
    dia.add_argument("--config", help=f"config.toml (default: ${CONFIG_ENV} or ./config.toml if present)")
    dia.add_argument("--base-url", help="base URL that was called (if not the one in settings.json)")
    dia.add_argument("--model", help="model id that was requested")
    dia.add_argument("--limit", type=int, default=10, help="max findings (default 10)")
    add_json_option(dia)
    dia.set_defaults(func=diagnose_cmd)


@contextmanager
def _safe_config_errors():
    """Config errors quote the offending value; if a key was pasted into a file, print it redacted (a known
    prefix, a credential-named value, or an unprefixed token that looks like a key)."""
    try:
        yield
    except ConfigError as e:
        raise UserError(redact_tokens(scrub(str(e)))) from None


def _logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def check(args) -> int:
    from tools.channel import check_channel_sync

    _logging()
    with _safe_config_errors():
        report = check_channel_sync(settings_path=args.settings, config_path=args.config)
    if args.json:
        print_json(report.model_dump(mode="json"))
    else:
        _print_check(report)
    return 0 if report.ok else 1


def _print_check(r) -> None:
    changes = f" — repaired: {'; '.join(r.base_url_changes)}" if r.base_url_changes else ""
    print(f"base URL   {r.base_url}  (from {r.base_url_source}){changes}")
    print(f"key        {r.api_key_env} = {r.key}  (source: {r.key_source})")
    auth = {True: "yes (a request without the key is refused)", False: "NO (works without a key)",
            None: "unknown"}[r.auth_enforced]
    print(f"auth       enforced: {auth}")
    print("probes")
    for p in r.probes:
        ms = f"{p.latency_ms:7.0f} ms" if p.latency_ms is not None else "        -"
        tries = f"  ({p.attempts} attempts)" if p.attempts > 1 else ""
        print(f"  {p.name:44} {p.http_code:>4} {ms}  {p.detail or p.error or ''}{tries}"[:220])
    for m in r.models:
        state = {True: "listed", False: "NOT listed", None: "unknown (GET /models failed)"}[m.listed]
        close = f" — close: {', '.join(m.close_matches)}" if m.close_matches else ""
        print(f"model      {m.role:9} {m.name}: {state}{close}")
    if r.rate_limit_headers:
        print("rate limit " + ", ".join(f"{k}={v}" for k, v in r.rate_limit_headers.items()))
    print(f"\n{r.verdict.upper()}: {r.summary}")
    _print_findings(r.diagnosis.findings)


def _print_findings(findings, limit: int = 10) -> None:
    if not findings:
        return
    print("\nfindings (most likely first):")
    for i, f in enumerate(findings[:limit], 1):
        print(f"{i:2}. [{f.severity}] {f.title}  ({f.rule_id}, score {f.score:g})")
        print(f"    cause:    {f.cause}")
        for e in f.evidence[:4]:
            print(f"    evidence: {e}")
        print(f"    fix:      {f.fix}")


def smoke(args) -> int:
    from tools.channel import smoke_test_sync

    _logging()
    if args.max_tokens < 1 or args.max_tokens > 100_000:
        raise UserError("--max-tokens must be between 1 and 100000")

    def progress(fraction: float, message: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"\r[{fraction:4.0%}] {message:60}", end="", file=sys.stderr, flush=True)

    with _safe_config_errors():
        result = smoke_test_sync(settings_path=args.settings, config_path=args.config, prompt=args.prompt,
                                 expect=args.expect, model=args.model,
                                 stream=False if args.no_stream else None, max_tokens=args.max_tokens,
                                 on_progress=progress)
    if not args.json and sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        print_json(result.model_dump(mode="json"))
    else:
        _print_smoke(result)
    return 0 if result.passed else 1


def _print_smoke(r) -> None:
    used = r.model_used or "-"
    if r.fallback_used:
        used += f" (fallback; {r.fallback_reason})"
    print(f"question   {r.question}")
    print(f"expected   {r.expected}")
    print(f"model      {used}  {'streamed' if r.streamed else 'not streamed'}, {r.attempts} attempt(s)")
    lat = f"{r.latency_ms:.0f} ms" if r.latency_ms is not None else "-"
    ttft = f", first token {r.ttft_ms:.0f} ms" if r.ttft_ms is not None else ""
    print(f"http_code  {r.http_code}  latency {lat}{ttft}  finish_reason {r.finish_reason}")
    if r.usage:
        print("usage      " + ", ".join(f"{k}={v}" for k, v in r.usage.items() if not isinstance(v, dict)))
    if r.answer_excerpt:
        print(f"answer     {r.answer_excerpt}")
    print(f"\n{'PASS' if r.passed else 'FAIL'}: {r.reason}")
    for e in r.evidence:
        print(f"  - {e}")
    if r.diagnosis:
        _print_findings(r.diagnosis.findings, 5)


def _text_arg(value: str | None, flag: str) -> str | None:
    if value is None or not value.startswith("@"):
        return value
    path = Path(value[1:])
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:1_000_000]
    except OSError as e:
        raise UserError(f"{flag} {value}: cannot read {path} ({e.strerror}); pass the text or an existing @file")


def _default_file(given: str | None, env_name: str, name: str) -> str | None:
    if given:
        return given
    candidate = os.environ.get(env_name) or name
    return candidate if Path(candidate).is_file() else None


def diagnose_cmd(args) -> int:
    from tools.diagnose import diagnose_error

    try:
        diagnosis = diagnose_error(
            status=args.status, body=_text_arg(args.body, "--body"), headers=args.header or None,
            text=_text_arg(args.text, "--text"), log_path=args.log,
            settings_path=_default_file(args.settings, SETTINGS_ENV, "settings.json"),
            config_path=_default_file(args.config, CONFIG_ENV, "config.toml"), code_path=args.code,
            base_url=args.base_url, model=args.model, limit=args.limit)
    except ValueError as e:  # an argument error may quote what was passed (a key, by mistake)
        raise UserError(redact_tokens(scrub(str(e)))) from None
    if args.json:
        print_json(diagnosis.model_dump(mode="json"))
        return 0
    print(f"inputs: {', '.join(diagnosis.inputs) or 'none'}  ({diagnosis.rules_evaluated} rules)")
    print(f"\n{diagnosis.summary}")
    _print_findings(diagnosis.findings, args.limit)
    if diagnosis.truncated:
        print(f"\n(more findings matched; raise --limit above {args.limit} to see them)")
    return 0
