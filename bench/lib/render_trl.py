"""The sections of the TRL side-by-side record (bench/experiments/trl_side_by_side.py): its table with our
sides' rollout step by part in docs/results.md, and its step-cost line in the README (used by bench.report)."""
from __future__ import annotations

from .render import f, section


def question(rec: dict) -> str:
    """The section's question, with how many rounds the record ran (one run per side, or interleaved rounds)."""
    n = rec["config"].get("repeats", 1)
    how = "one run per side" if n <= 1 else f"{n} interleaved rounds, every side once per round"
    return f"Seconds per optimizer step of TRL's GRPO, ours and our VAPO on the same shapes ({how})."


def trl_side_by_side(rec: dict) -> str:
    c, n = rec["config"], rec["config"]["points"]
    repeats = c.get("repeats", 1)
    step = f"s / optimizer step (median of {repeats} rounds)" if repeats > 1 else "s / optimizer step"
    first = " (round 1)" if repeats > 1 else ""  # the per-run columns are the first round's run
    lines = [(f"| side | {step} | vs TRL GRPO | greedy start → final{first} | step to +{n:g} points{first} | "
              f"training s to +{n:g} points{first} | training s per run{first} | of which value pretraining |"),
             "|---|---|---|---|---|---|---|---|"]
    for side, s in rec["summary"].items():
        lines.append(f"| {side} | {s['s_per_opt_step']:.3f} | {rec['ratio_vs_trl_grpo'][side]['s_per_opt_step']:.2f}× | "
                     f"{f(s['start_greedy'])} → {f(s['final_greedy'])} | {s['step_to_target'] or '—'} | "
                     f"{f(s['train_s_to_target'], 1)} | {s['train_s_total']:.1f} | {s['value_pretrain_s']:.1f} |")
    v = c["versions"]
    note = (f"{c['task']}, preset {c['preset']}, {c['steps']} optimizer steps of {c['mini_batch_size']} responses "
            f"({c['opt_steps_per_rollout']} per rollout of {c['batch_size']}), eval every ~{c['eval_interval']} steps "
            f"on {c['heldout_problems']} held-out problems, seed {c['seed']}, {_rounds(c.get('repeats', 1))}; TRL {v['trl']}, "
            f"accelerate {v['accelerate']}; — = not reached.")
    if c.get("small_critic"):
        note += f" vapo_small_critic: our VAPO with {', '.join(c['small_critic'])} (a smaller critic, same policy)."
    return section(lines, rec, note, *_phase_table(rec["summary"], c["opt_steps_per_rollout"]))


PHASE_COLUMNS = (("sample", "sampling + reward"), ("old_outputs", "old outputs"), ("actor", "actor fwd+bwd"),
                 ("critic", "critic fwd+bwd"), ("optimizer", "optimizer steps"))


def _phase_table(summary: dict, per_rollout: int) -> list[str]:
    """Where our sides' rollout step goes (the engine's perf/*_time_s metrics), when the record has it."""
    sides = {side: s["phases_s"] for side, s in summary.items() if s.get("phases_s")}
    if not sides:
        return []
    head = " | ".join(label for _, label in PHASE_COLUMNS)
    rows = [f"| side | {head} | rest | rollout step |", "|---" * (len(PHASE_COLUMNS) + 3) + "|"]
    for side, p in sides.items():
        rest = p["step"] - sum(p.get(k, 0.0) for k, _ in PHASE_COLUMNS)
        cells = " | ".join(f"{p[k]:.3f}" if k in p else "—" for k, _ in PHASE_COLUMNS)
        rows.append(f"| {side} | {cells} | {rest:.3f} | {p['step']:.3f} |")
    intro = (f"Our sides' rollout step ({per_rollout} optimizer steps) by part, seconds (the engine's perf/*_time_s "
             "metrics, mean per rollout, median over the rounds; rest = advantages, metrics, replay buffer):")
    return [intro, "\n".join(rows)]


def trl_summary(rec: dict) -> str:
    """The README's step-cost lines: seconds per optimizer step of each side and its ratio to TRL's GRPO."""
    c = rec["config"]
    def ratio(side: str) -> str:
        r = rec["ratio_vs_trl_grpo"][side]
        rounds = r.get("s_per_opt_step_rounds") or []
        each = f"; rounds {', '.join(f'{x:.2f}' for x in rounds)}" if len(rounds) > 1 and side != "trl_grpo" else ""
        return f"{r['s_per_opt_step']:.2f}×{each}"
    sides = ", ".join(f"{side} {s['s_per_opt_step']:.3f} s ({ratio(side)})" for side, s in rec["summary"].items())
    small = f"; vapo_small_critic = {', '.join(c['small_critic'])}" if c.get("small_critic") else ""
    return (f"**Step cost next to TRL** (`bench/results/trl_side_by_side.json`, {c['task']}, {c['preset']} shapes, "
            f"{c.get('repeats', 1)} interleaved round(s), load {rec['load_avg_start'][0]} → {rec['load_avg_end'][0]}"
            f"{small}): seconds per optimizer step and the ratio to TRL's GRPOTrainer: {sides}.")


def _rounds(n: int) -> str:
    if n <= 1:
        return "one run per side"
    return (f"{n} interleaved rounds (every side once per round): s / optimizer step is the median over the rounds "
            "and the ratio the median of the per-round ratios; accuracies and times to target are the first round's")
