"""`vapo-mcp runs …`, `vapo-mcp report`, `vapo-mcp ablate`: the run-manager tools for a person at a terminal.

Same functions as the MCP tools (tools/training.py, tools/report.py); runs started here are detached
background jobs like those of `start_training`.
"""
from __future__ import annotations

import argparse
import sys

from tools.paths import ToolInputError, files
from tools.report import AblationReport, report_metrics
from tools.training import ablate, list_runs, resume_run, run_status, stop_run
from vapo_engine.config import preset_names
from vapo_engine.jobs import RunError, State
from vapo_engine.variants import DEFAULT_ABLATION, VARIANTS

from .common import (
    add_file_options,
    add_json_option,
    add_trust_option,
    positive_int,
    print_json,
    run_request_error,
)


def register(sub) -> None:
    runs = sub.add_parser("runs", help="list, inspect, stop and resume background runs")
    rsub = runs.add_subparsers(dest="runs_command", metavar="SUBCOMMAND")
    for name, helptext in (("list", "runs, newest first"), ("status", "one run's state, progress and log tail"),
                           ("stop", "stop a run (graceful: checkpoint first)"),
                           ("resume", "continue a failed/stopped run from its checkpoint")):
        p = rsub.add_parser(name, help=helptext)
        add_file_options(p)
        add_json_option(p)
        if name != "list":
            p.add_argument("run_id")
        if name == "list":
            p.add_argument("--state", choices=[s.value for s in State], help="only runs in this state")
            p.add_argument("--tag", help="only runs with this tag (an ablation's runs: its abl-… id)")
            p.add_argument("--limit", type=positive_int(10_000), default=20, metavar="N",
                           help="at most N runs, newest first (default 20)")
        if name == "stop":
            p.add_argument("--force", action="store_true", help="SIGKILL at once")
        if name == "resume":
            add_trust_option(p)
        p.set_defaults(func=_runs, action=name)
    rep = sub.add_parser("report", help="metrics, trends and a plot of a run (or an ablation's table)")
    add_file_options(rep)
    add_json_option(rep)
    rep.add_argument("run_id")
    rep.set_defaults(func=_report)
    abl = sub.add_parser("ablate", help="start full VAPO + 'w/o X' variants + baselines as background runs",
                         description=ABLATE_HELP, epilog=_variant_table(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    add_file_options(abl)
    add_json_option(abl)
    abl.add_argument("--variants", nargs="+", choices=list(VARIANTS), metavar="VARIANT",
                     help="the arms to run, space-separated names from the list below (full VAPO is always "
                          f"added); default: {' '.join(DEFAULT_ABLATION)}")
    abl.add_argument("--preset", help=f"applied to every arm: a built-in preset ({', '.join(preset_names())}) or "
                                      "a .toml of overrides")
    abl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="config override applied to every arm, before the arm's own (repeatable)")
    abl.set_defaults(func=_ablate)


ABLATE_HELP = """\
Start one background run per arm of an ablation: full VAPO plus the variants you name, each the same base
config (config.toml, then --preset, then --set) with the arm's own overrides on top, so the same seed and
budget apply. The runs are queued and run one after another; `vapo-mcp report abl-…` prints the table.

Arms are variant names, space-separated after --variants (no commas, no quotes):

  vapo-mcp ablate --preset cpu-demo --variants no_decoupled_gae no_length_adaptive grpo
  vapo-mcp ablate --variants ppo grpo --set training.total_steps=200"""


def _variant_table() -> str:
    width = max(map(len, VARIANTS))
    rows = [f"  {v.name:{width}}  {v.description}" for v in VARIANTS.values()]
    return "variants (arms):\n" + "\n".join(rows)


def _call(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except (RunError, ToolInputError) as e:
        raise run_request_error(e) from None


def _runs(args) -> int:
    f = files(args.config, args.settings)
    if args.action == "list":
        out = _call(list_runs, f, state=args.state, tag=args.tag, limit=args.limit)
        if args.json:
            print_json([r.model_dump() for r in out.runs])
        for line in out.skipped:
            print(f"skipped: {line}", file=sys.stderr)
        if not out.runs and not args.json:
            filters = " ".join(f"--{k} {v}" for k, v in (("state", args.state), ("tag", args.tag)) if v)
            print(f"no runs match {filters} (vapo-mcp runs list shows them all)" if filters else
                  "no runs yet: start one with `vapo-mcp train` (or `vapo-mcp ablate`)")
        for r in [] if args.json else out.runs:
            acc = r.latest_eval.get("eval/greedy_accuracy")
            print(f"{r.run_id:28} {r.state:9} step {r.step}/{r.total_steps}  "
                  f"{'' if acc is None else f'greedy acc {acc:.3f}  '}{r.variant or ''}  {r.message[:60]}")
        return 0
    fn = {"status": run_status, "stop": stop_run, "resume": resume_run}[args.action]
    extra = {"stop": {"force": getattr(args, "force", False)},
             "resume": {"trust_run_config": getattr(args, "trust_run_config", False)}}.get(args.action, {})
    res = _call(fn, f, args.run_id, **extra)
    if args.json:
        print_json(res.model_dump())
        return 0
    run = getattr(res, "run", res)
    print(f"{run.run_id}: {run.state} — {run.message}\n  step {run.step}/{run.total_steps}  dir {run.run_dir}")
    if args.action == "status":
        print(f"  next: {'; '.join(res.next_steps)}\n--- log tail ---\n{res.log_tail}")
    return 0


def _report(args) -> int:
    res = _call(report_metrics, files(args.config, args.settings), args.run_id)
    if args.json:
        print_json(res.model_dump())
        return 0
    if isinstance(res, AblationReport):
        print(res.table_markdown)
    else:
        if not res.latest:
            print(f"{res.run_id}: {res.state}, no training steps yet: no metrics to report "
                  f"(vapo-mcp runs status {res.run_id} shows its state and log)")
        else:
            print(f"{res.run_id}: {res.state}, step {res.step}")
        for t in res.trends if res.latest else []:
            print(f"  {t.metric:28} {t.verdict:12} {t.detail}")
        for e in res.evals[-5:]:
            print(f"  eval at step {int(e.get('step', 0))}: " + "  ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in e.items() if k != "step"))
    if res.plot_png:
        print(f"plot: {res.plot_png}")
    return 0


def _ablate(args) -> int:
    res = _call(ablate, files(args.config, args.settings), variants=args.variants, preset=args.preset,
                overrides=args.set)
    if args.json:
        print_json(res.model_dump())
        return 0
    print(f"ablation {res.ablation_id}: {len(res.runs)} runs queued (one at a time)")
    for r in res.runs:
        print(f"  {r.variant:22} {r.run_id}")
    print(f"table: vapo-mcp report {res.ablation_id}")
    return 0
