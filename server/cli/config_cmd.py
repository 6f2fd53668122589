"""`vapo-mcp config check`: validate both files and print the effective, redacted configuration.

Redacted means: the key as prefix + last 4 + length, no `user:pass@` credentials of a base URL, no key pasted
into `api.api_key_env` (or into a header, a model id, a tag, a `--set` value), in the text and in `--json`.
Every local path of the config (model folders, data files) is checked on disk (vapo_engine.config.local_paths):
a missing one is an error naming the field, the path and the fix. It also says how the model will get its prompts (vapo_engine.prompts: its chat template or plain text, read
from the model directory's files) and fails when `model.prompt_format = "chat"` meets a model without one.
"""
from __future__ import annotations

import sys
from pathlib import Path

from vapo_engine.config import config_warnings, load_config, load_settings, resolve_channel
from vapo_engine.config.errors import ConfigError, ConfigIssue
from vapo_engine.config.local_paths import local_path_issues
from vapo_engine.config.secrets import redact_tokens, safe_config_dump, safe_settings_dump
from vapo_engine.prompts import NO_TEMPLATE_FIX, check_prompts
from vapo_engine.providers import scrub

from .common import add_file_options, add_json_option, dotenv_for, print_json


def register(sub) -> None:
    cfg = sub.add_parser("config", help="inspect and validate config.toml / settings.json")
    csub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    chk = csub.add_parser("check", help="validate both files; print the effective config and warnings")
    add_file_options(chk)
    add_json_option(chk)
    chk.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="config.toml override, e.g. --set vapo.alpha=0.5 (repeatable)")
    chk.set_defaults(func=check)


def check(args) -> int:
    errors = []
    config = settings = None
    try:
        config = load_config(args.config, args.set)
    except ConfigError as e:
        errors += e.issues
    try:
        settings = load_settings(args.settings)
    except ConfigError as e:
        errors += e.issues
    prompts = check_prompts(config.model, Path(args.config).resolve().parent) if config else None
    if prompts and prompts.problem:
        errors.append(ConfigIssue(args.config, "model.prompt_format", prompts.problem, NO_TEMPLATE_FIX))
    if config:
        errors += local_path_issues(config, args.config)
    if errors:
        _print_issues("error", errors, args.json)
        return 2
    channel, warnings = resolve_channel(settings, config, dotenv_path=dotenv_for(args.settings),
                                        settings_file=args.settings)
    warnings += config_warnings(config, args.config)
    config_view, settings_view = safe_config_dump(config.model_dump()), safe_settings_dump(settings.model_dump())
    if args.json:
        print_json({"ok": True, "channel": channel.public(), "config": config_view, "settings": settings_view,
                    "prompts": prompts.as_dict(), "warnings": [_safe_issue(w) for w in warnings]})
        return 0
    print(f"config:   {args.config}\nsettings: {args.settings}\n")
    print("channel:")
    for k, v in channel.public().items():
        print(f"  {k:16} {v}")
    print("\nrecipe:")
    for section, values in config_view.items():
        print(f"  [{section}] " + ", ".join(f"{k}={v}" for k, v in values.items()))
    print(f"  derived: prompts_per_step={config.prompts_per_step}, mini_batch_size={config.mini_batch_size}, "
          f"micro_batch_size={config.micro_batch_size}, loss_reduction={config.vapo.reduction}")
    print(f"  {_safe(prompts.line)}")
    exp = settings_view["experiment"]
    print(f"\nexperiment: {exp['name']} tags={exp['tags']} seed={exp['seed']} "
          f"log_dir={settings_view['runtime']['log_dir']}")
    _print_issues("warning", warnings, False)
    print("\nOK: configuration is valid.")
    return 0


def _safe(text: object) -> str:
    """Any text of a config problem fit to print: it may quote a value the user typed (a key by mistake)."""
    return redact_tokens(scrub(text))


def _safe_issue(issue) -> dict:
    return {k: _safe(v) if isinstance(v, str) else v for k, v in issue.as_dict().items()}


def _print_issues(level: str, issues, as_json: bool) -> None:
    if as_json:
        print_json({"ok": level != "error", f"{level}s": [_safe_issue(i) for i in issues]})
        return
    stream = sys.stderr if level == "error" else sys.stdout
    if issues:
        print(f"\n{len(issues)} {level}(s):", file=stream)
    for i in issues:
        print(f"  {level}: {_safe(i)}", file=stream)
