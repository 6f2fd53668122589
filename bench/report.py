"""docs/results.md and the README's results block, rendered from the committed records in bench/results.

    .venv/bin/python -m bench.report             # print docs/results.md
    .venv/bin/python -m bench.report --write     # write docs/results.md and the README's results block
    .venv/bin/python -m bench.report --check     # exit 1 when either differs from what the records render, or a
                                                 # record lacks what makes it reproducible (the test suite runs it)

Every number in docs/results.md and between the README's `results:begin` / `results:end` markers comes from a
record (bench/lib/render.py writes the prose from the same fields). A record is reproducible when its command
runs a module of bench (`python -m bench.…`) from the repository root, with no path outside the repository, and
it keeps the machine, the date and the load average. Edit a renderer or re-run a benchmark, then `--write`; never edit the outputs.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import shlex
import sys
from pathlib import Path

if not __package__:  # run as a file (`python bench/report.py`): make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib import render, render_critic, render_smollm, render_suite, render_tools, render_trl
from bench.lib.records import REPO

BEGIN = "<!-- results:begin (rendered by bench/report.py from bench/results; edit the renderer, not this block) -->"
END = "<!-- results:end -->"

SECTIONS = (  # (record, title, renderer, what it answers: a text, or a function of the record)
    ("ablation_chain_paired", "VAPO's parts on builtin:chain: the paired ablation (hidden-state critic)", render.ablation_paired,
     ("Which of VAPO's parts change how fast the long end improves, next to GRPO and rejection-sampling fine-tuning "
     "at an equal sample budget (value-pretraining rollouts counted)?")),
    ("ablation_chain_critic", "VAPO with the surprise-head critic: the paired ablation", render.ablation_paired,
     ("With a critic that sees the policy's mistakes, does VAPO improve the long end faster than GRPO and "
      "rejection-sampling fine-tuning at an equal sample budget, and does a critic pretrained once and reused pay?")),
    ("critic_fit", "Why the critic learnt nothing on builtin:chain, and the fix", render_critic.critic_fit,
     ("Can a policy-sized critic fit the value of this policy at all — with which head, recipe, initialisation and "
      "targets, from how many rollouts — and what can it see of the policy's mistakes?")),
    ("critic_surprise", "The surprise-head critic against its ceiling", render.critic,
     "How much of the return variance does the value-pretrained surprise-head critic explain, against any critic's?"),
    ("critic", "The hidden-state critic against its ceiling (before the fix)", render.critic,
     "How much of the return variance does the pretrained linear-head critic explain, and how much could any critic?"),
    ("warm_start", "The chain models RL starts from", render.warm_start,
     "What each built-in chain model gets right and wrong before RL, and how its deficit was made."),
    ("chain_lookup", "Reading a sign from far back in the prompt", render.chain_lookup,
     "Teacher-forced probability of the right sign and digit on each line, by prompt length."),
    ("sample_efficiency", "VAPO, PPO and GRPO on builtin:addition", render.sample_efficiency,
     "Held-out accuracy curves of the three algorithms on the cpu-demo recipe."),
    ("trl_side_by_side", "Next to TRL's GRPOTrainer", render_trl.trl_side_by_side, render_trl.question),
    ("throughput", "Throughput of one VAPO step", render.throughput,
     "Where a cpu-demo VAPO rollout step spends its time, and the FLOP rate of its updates."),
    ("rollout_backends", "Rollouts in the trainer vs on serve-model replicas", render.rollout_backends,
     "What sampling through the rollout protocol (loopback replicas, weights pushed every step) costs on this CPU."),
    ("memory", "Memory per rank: DDP, FSDP2 and LoRA", render.memory,
     "Bytes per rank of weights, gradients and optimizer states, measured on CPU and extrapolated."),
    ("provider_samples", "Provider samples as extra positives", render.provider_samples,
     "A run with and without correct answers of an API model (here: a served checkpoint) in its replay buffer."),
    ("smollm_word_baseline", "A real pretrained model before RL: SmolLM2-135M-Instruct on word problems",
     render_smollm.baseline, "What the base model gets right on builtin:word, per kind of problem."),
    ("smollm_speed", "A real model's rollout step on this CPU, next to the physical bound", render_smollm.speed,
     "Where a smollm-word rollout step spends its time, and how far each part is from FLOPs ÷ the measured rate."),
    ("smollm_word_run", "VAPO on SmolLM2-135M-Instruct: the smollm-word preset", render_smollm.run,
     "Does held-out accuracy rise within an hour on 2 cores, and does the trained model answer the smoke question?"),
    ("smollm_word_run_seed7", "The smollm-word preset again, another seed", render_smollm.run,
     "The same run with seed 7: how much of the first run's gain is that seed's luck?"),
    ("suite_time", "How long the test suite takes, next to the host's speed", render_suite.suite_time,
     "How long `bash .ci/run` takes from a fresh clone on this 2-core machine, and how fast the host was meanwhile."),
    ("tool_use", "Tool use: RL with a calculator over MCP", render_tools.tool_use,
     ("Does RL with a calculator (an MCP server over stdio) teach the built-in model to call it, and does held-out "
      "accuracy follow — next to the same runs without it, under VAPO and GRPO?")),
)
HEADLINES = {"ablation_chain_critic": "critic_surprise", "ablation_chain_paired": "critic"}
"""The README's headline: the newest paired ablation on builtin:chain that has a record, with its critic's record."""
INTRO = """# Results

Rendered by `python -m bench.report` from the records in `bench/results/` (one JSON file per benchmark, with the
command that produced it, the machine, the date, the load average and the commit); `python -m bench.report --check`
fails when this file or the README's results block differs from what the records render. Each section says what it
answers, shows the table and plot, and ends with the record's own provenance line. Numbers are measurements of
this project's built-in tiny models on CPU, not of the paper's 32B model on AIME.
"""


def _load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def render_results(results: Path) -> str:
    parts = [INTRO]
    for name, title, fn, question in SECTIONS:
        rec = _load(results, name)
        if rec is None:
            continue
        plot = f"\n![{title}](../bench/results/{name}.png)\n" if (results / f"{name}.png").is_file() else ""
        question = question(rec) if callable(question) else question
        parts.append(f"## {title}\n\n*{question}* Record: `bench/results/{name}.json`.\n{plot}\n{fn(rec)}\n")
    return "\n".join(parts)


def render_headline(results: Path) -> str:
    """The README's results block: the paired ablation's verdict and its compact table, with a link."""
    name = next((n for n in HEADLINES if (results / f"{n}.json").is_file()), list(HEADLINES)[-1])
    rec = _load(results, name)
    if rec is None:
        return "No headline record yet: run `python -m bench.experiments.ablation --budget …` (docs/results.md lists every record)."
    c = rec["config"]
    bench = next((o.split("=", 1)[1].strip('"') for o in c["extra_overrides"] if o.startswith("eval.benchmark=")),
                 "the preset's benchmark")
    lines = [(f"Preset `{c['preset']}`, {len(c['seeds'])} paired seeds, {c['budget_rollouts']} rollouts per row (value "
              f"pretraining included); primary metric: the area under the held-out {c['metric']} accuracy curve on "
              f"`{bench}` (the mean accuracy over the budget):"), "",
             "| row | area (mean over seeds) | Δ vs VAPO [Holm interval] | resolved |", "|---|---|---|---|"]
    for row in rec["table"]:
        t = row.get("vs_base")
        lines.append(f"| {render._label(row['variant'])} | {render.f(row['area_mean'])} | "
                     f"{'' if t is None else render._interval(t)} | {'' if t is None else ('yes' if t['resolved'] else 'no')} |")
    lines += ["", render._resolution(rec["table"], len(c["seeds"])), *render._policy_rollouts(rec)]
    fit = _load(results, "critic_fit")
    if fit is not None:
        lines += ["", render_critic.critic_fit_summary(fit)]
    crit = _load(results, HEADLINES[name])
    if crit is not None:
        lines += ["", render.critic_summary(crit, HEADLINES[name])]
    trl = _load(results, "trl_side_by_side")
    if trl is not None:
        lines += ["", render_trl.trl_summary(trl)]
    lines += ["", (f"Design, plots and every other measurement: [docs/results.md](docs/results.md) (record "
                   f"`bench/results/{name}.json`, {rec['date_utc']}).")]
    return "\n".join(lines)


def record_problems(results: Path) -> list[str]:
    """What keeps each record from being reproducible from the repository root."""
    out = []
    for path in sorted(results.glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        name, cmd = path.name, rec.get("command") or ""
        argv = shlex.split(cmd) if cmd else []
        if len(argv) < 3 or argv[1] != "-m" or not is_bench_module(argv[2]):
            out.append(f"{name}: command {cmd!r} does not run a module of bench from the repository root")
        for a in argv[3:]:
            for part in a.split(","):
                v = part.split("=", 1)[-1]
                if v.startswith(("/", "~")) or ".." in Path(v).parts:
                    out.append(f"{name}: command names a path outside the repository ({v!r})")
        missing = [k for k in ("machine", "date_utc", "load_avg_start", "load_avg_end") if k not in rec]
        if missing:
            out.append(f"{name}: no {', '.join(missing)} in the record")
        if (rec.get("config") or {}).get("smoke"):
            out.append(f"{name}: a --smoke record")
    return out


def is_bench_module(name: str) -> bool:
    """`bench.<…>` naming a module file of this repository's bench package."""
    parts = name.split(".")
    return parts[0] == "bench" and len(parts) > 1 and (REPO.joinpath(*parts[:-1]) / f"{parts[-1]}.py").is_file()


def readme_block(readme: str) -> str | None:
    m = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), readme, re.DOTALL)
    return m.group(1).removesuffix("\n") if m else None


def check(root: Path = REPO) -> list[str]:
    """Every way docs/results.md, the README block or a record fails the rules above (empty = all good)."""
    results = root / "bench" / "results"
    problems = record_problems(results)
    want, doc = render_results(results), root / "docs" / "results.md"
    have = doc.read_text(encoding="utf-8") if doc.is_file() else ""
    if have != want:
        problems.append("docs/results.md differs from what the records render" + _first_diff(have, want))
    block = readme_block((root / "README.md").read_text(encoding="utf-8"))
    if block is None:
        problems.append(f"README.md has no results block ({BEGIN} … {END})")
    elif block != render_headline(results):
        problems.append("README.md's results block differs from what the records render"
                        + _first_diff(block, render_headline(results)))
    return problems


def _first_diff(have: str, want: str) -> str:
    diff = list(difflib.unified_diff(want.splitlines(), have.splitlines(), lineterm="", n=0))[2:]
    added = [d[1:] for d in diff if d.startswith("+")]
    missing = [d[1:] for d in diff if d.startswith("-")]
    if added:
        return f" (first line not rendered from a record: {added[0][:160]!r})"
    return f" (missing rendered line: {missing[0][:160]!r})" if missing else ""


def write(root: Path = REPO) -> None:
    results = root / "bench" / "results"
    (root / "docs").mkdir(exist_ok=True)
    (root / "docs" / "results.md").write_text(render_results(results), encoding="utf-8")
    readme = (root / "README.md").read_text(encoding="utf-8")
    if readme_block(readme) is None:
        raise SystemExit(f"README.md has no results block: add the two marker lines\n{BEGIN}\n{END}")
    new = re.sub(re.escape(BEGIN) + r"\n.*?" + re.escape(END),
                 lambda _: f"{BEGIN}\n{render_headline(results)}\n{END}", readme, flags=re.DOTALL)
    (root / "README.md").write_text(new, encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write docs/results.md and the README's results block")
    mode.add_argument("--check", action="store_true", help="exit 1 when they differ from the records")
    p.add_argument("--root", default=str(REPO), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    root = Path(a.root)
    if a.write:
        write(root)
        print(f"wrote {root / 'docs' / 'results.md'} and the README's results block")
    elif a.check:
        problems = check(root)
        for line in problems:
            print(f"report --check: {line}", file=sys.stderr)
        if problems:
            print("fix: re-run the benchmark or the renderer, then `.venv/bin/python -m bench.report --write`",
                  file=sys.stderr)
            return 1
        print("report --check: docs/results.md and the README's results block match the records")
    else:
        print(render_results(root / "bench" / "results"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
