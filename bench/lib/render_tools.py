"""The section of the tool-use record (bench/experiments/tool_use.py) in docs/results.md (used by bench.report)."""
from __future__ import annotations

from .render import f, section


def _ends(points: list[dict], key: str) -> tuple:
    vals = [p.get(key) for p in points if p.get(key) is not None]
    return (vals[0], vals[-1]) if vals else (None, None)


def _mean(points: list[dict], key: str):
    vals = [p[key] for p in points if p.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def tool_use(rec: dict) -> str:
    c = rec["config"]
    lines = [("| arm | seed | held-out greedy accuracy start → final | sampled start → final | greedy calls per "
              "problem start → final | rollout/tool_use first → last step | tool errors per episode (mean) | "
              "wall s |"), "|---|---|---|---|---|---|---|---|"]
    for r in rec["runs"]:
        g, s, calls = (_ends(r["curve"], k) for k in ("greedy", "sampled", "greedy_tool_calls"))
        use = _ends(r["train"], "tool_use")
        lines.append(f"| {r['arm']} | {r['seed']} | {f(g[0])} → {f(g[1])} | {f(s[0])} → {f(s[1])} | "
                     f"{f(calls[0], 2)} → {f(calls[1], 2)} | {f(use[0], 2)} → {f(use[1], 2)} | "
                     f"{f(_mean(r['train'], 'tool_errors'), 3)} | {r['wall_s']:.0f} |")
    note = (f"Preset `{c['preset']}` (the built-in model `builtin:crates`, whose warm start calls the calculator on "
            "a share of the problems on purpose: `TOOL_RATE` in vapo_engine/tasks/crates.py), "
            f"{c['steps']} policy steps, evaluation every {c['eval_interval']} steps with the run's own episode; with the calculator = `rollout.episode = \"tool_calls\"` and `vapo-mcp "
            "tool-server calculator` over stdio, without = `single_turn`, where a call reaches nothing. — = not "
            "logged (no tool calls in single-turn runs). One seed per arm: the curves show what happened in these "
            "runs, not an effect size. Wall seconds are under the load average below (other jobs shared the 2 "
            "cores), so they do not compare arms.")
    return section(lines, rec, note)
