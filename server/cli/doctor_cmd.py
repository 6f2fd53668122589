"""`vapo-mcp doctor`: the preflight of a run (vapo_engine.doctor) without loading weights — every finding with
its numbers and fix; exit 2 when a finding is an error (a run of this config would fail), else 0."""
from __future__ import annotations

import json

from tools.doctor import doctor
from tools.hints import for_cli
from tools.paths import files, known_secrets
from vapo_engine.config import preset_names
from vapo_engine.providers import scrub

from .common import add_file_options, add_json_option


def register(sub) -> None:
    p = sub.add_parser("doctor", help="preflight a run: divisibility, memory per rank, disk, data, chat template, "
                       "threads, channel and rollout server (no weights loaded)")
    add_file_options(p)
    add_json_option(p)
    p.add_argument("--preset", help=f"a built-in preset ({', '.join(preset_names())}) or a .toml of overrides")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    f = files(args.config, args.settings)
    report = doctor(f, preset=args.preset, overrides=args.set)
    text = json.dumps(report.model_dump(), indent=2, ensure_ascii=False) if args.json else report.text()
    print(for_cli(scrub(text, known_secrets(f))))  # a finding's fix naming a tool (check_channel) as its command
    return 0 if report.ok else 2
