"""Render the README's benchmark tables (markdown) from the committed JSON records in bench/results.

    .venv/bin/python bench/report.py                 # prints the markdown to stdout
    .venv/bin/python bench/report.py --results DIR   # records from another folder
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _f(x, nd=3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def _spread(s: dict, nd=3) -> str:
    if not s or s.get("mean") is None:
        return "—"
    if s.get("n", 1) <= 1:
        return _f(s["mean"], nd)
    return f"{_f(s['mean'], nd)} ± {_f(s['std'], nd)} [{_f(s['min'], nd)}–{_f(s['max'], nd)}]"


def _machine(rec: dict) -> str:
    m = rec["machine"]
    return (f"*{m['cpu_model']}, {m['logical_cores']} logical cores, torch {m['torch']}; "
            f"`{rec['command']}`; {rec['wall_s_total']:.0f} s wall; load average at start/end "
            f"{rec.get('load_avg_start')} / {rec.get('load_avg_end')} ({rec['date_utc']})*")


def throughput(rec: dict) -> str:
    p = rec["matmul_peak"]
    lines = [("| model.dtype | step time (s) | rollout phase (s) | update phase (s) | rollout tokens/s | "
              "update samples/s | update GFLOP/s | % of same-dtype matmul peak | % of fp32 peak |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for d, s in rec["summary"].items():
        lines.append(f"| {d} | {s['step_time_s']:.2f} | {s['rollout_time_s']:.2f} | {s['update_time_s']:.2f} | "
                     f"{s['rollout_tokens_per_s']:.0f} | {s['update_samples_per_s']:.1f} | "
                     f"{s['update_gflops_achieved']:.2f} | {100 * s['fraction_of_peak_same_dtype']:.2f} | "
                     f"{100 * s['fraction_of_fp32_peak']:.2f} |")
    mk = p["model_shape"]["m_k_n"]
    peak = (f"Measured matmul peak (torch.matmul, best of square sizes {list(p['square']['float32'])}): "
            f"fp32 {p['peak_gflops']['float32']:.0f} GFLOP/s, bf16 {p['peak_gflops']['bfloat16']:.0f} GFLOP/s; "
            f"one micro-batch MLP-shaped matmul ({mk[0]}×{mk[1]} @ {mk[1]}×{mk[2]}): "
            f"fp32 {p['model_shape']['float32']:.1f}, bf16 {p['model_shape']['bfloat16']:.1f} GFLOP/s.")
    lines += ["", peak, "", _machine(rec)]
    return "\n".join(lines)


def _hit(curve: list[dict], key: str, target: float):
    return next((p["step"] for p in curve if p.get(key) is not None and p[key] >= target), None)


def _tail_mean(curve: list[dict], key: str, k: int = 3):
    """Mean of the last k evaluations (less noisy than the single final one)."""
    vals = [p[key] for p in curve if p.get(key) is not None][-k:]
    return sum(vals) / len(vals) if vals else None


def _mstd(values: list) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "—"
    if len(v) == 1:
        return _f(v[0])
    m = sum(v) / len(v)
    sd = (sum((x - m) ** 2 for x in v) / (len(v) - 1)) ** 0.5
    return f"{m:.3f} ± {sd:.3f} [{min(v):.3f}–{max(v):.3f}]"


def _hits(runs: list[dict], key: str, target: float) -> str:
    return ", ".join("—" if h is None else str(h) for h in (_hit(r["curve"], key, target) for r in runs))


def sample_efficiency(rec: dict) -> str:
    c = rec["config"]
    lines = [("| algorithm | final greedy (mean ± std [min–max]) | final sampled avg@2 | sampled avg@2, mean of last 3 "
              "evals | steps to greedy ≥ 0.85 (per seed) | steps to sampled ≥ 0.65 (per seed) | critic EV | s / run |"),
             "|---|---|---|---|---|---|---|---|"]
    for a, s in rec["summary"].items():
        runs = [r for r in rec["runs"] if r["variant"] == a]
        lines.append(f"| {a} | {_spread(s['final_greedy'])} | {_spread(s['final_sampled'])} | "
                     f"{_mstd([_tail_mean(r['curve'], 'sampled') for r in runs])} | {_hits(runs, 'greedy', 0.85)} | "
                     f"{_hits(runs, 'sampled', 0.65)} | {_f(s['mean_explained_var']['mean'])} | "
                     f"{_f(s['wall_s']['mean'], 0)} |")
    starts = [r["curve"][0] for r in rec["runs"] if r["curve"] and r["curve"][0]["step"] == 0]
    start = {k: sum(p[k] for p in starts) / len(starts) for k in ("greedy", "sampled")} if starts else {}
    lines += ["", f"{c['steps']} policy steps × 32 responses per step, seeds {c['seeds']}; held-out 200 problems "
              f"evaluated every ~{c['eval_interval']} steps (at the first rollout boundary past each multiple); "
              f"step-0 mean over runs: greedy {_f(start.get('greedy'))}, sampled {_f(start.get('sampled'))} (the sampled "
              f"eval draw depends on the seed); — = not reached."
              + ("" if rec.get("complete", True) else " **Incomplete record** (interrupted)."), "", _machine(rec)]
    return "\n".join(lines)


def ablation(rec: dict) -> str:
    c = rec["config"]
    lines = [("| variant | paper: AIME24 avg@32, Qwen2.5-32B (different model and benchmark) | "
              "ours: final greedy, built-in addition | Δ vs VAPO | ours: final sampled avg@2 | "
              "ours: sampled, mean of last 3 evals | steps to greedy ≥ 0.85 | critic EV | mean λ_policy |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rec["table"]:
        runs = [x for x in rec["runs"] if x["variant"] == r["variant"]]
        d = r["delta_greedy_vs_vapo"]
        lines.append(f"| {r['description']} | {'—' if r['paper_aime24'] is None else r['paper_aime24']} | "
                     f"{_spread(r['final_greedy'])} | {'—' if d is None else f'{d:+.3f}'} | "
                     f"{_spread(r['final_sampled'])} | {_mstd([_tail_mean(x['curve'], 'sampled') for x in runs])} | "
                     f"{_hits(runs, 'greedy', 0.85)} | {_f(r['mean_explained_var'])} | "
                     f"{_f(r['mean_lambda_policy'])} |")
    lines += ["", f"Mode {c['mode']}: {c['steps']} policy steps, seeds {c['seeds']}, eval every ~{c['eval_interval']}"
              f" steps. {rec['paper_note']}. Critic EV = explained variance of the value model (mean over steps); "
              "λ_policy is logged for every algorithm, but GRPO/DAPO do not use it." + ("" if rec.get("complete", True) else
                                                 " **Incomplete record** (interrupted; finished rows only)."),
              "", _machine(rec)]
    return "\n".join(lines)


def _ci(d: dict | None) -> str:
    """Δ with its 95% Welch interval, * when the interval excludes 0."""
    if not d or d.get("delta") is None:
        return "—"
    if not d.get("ci95"):
        return f"{d['delta']:+.3f}"
    lo, hi = d["ci95"]
    return f"{d['delta']:+.3f} [{lo:+.3f}, {hi:+.3f}]{'*' if d.get('significant') else ''}"


def _start(runs: list[dict], key: str) -> float | None:
    vals = [x["curve"][0].get(key) for x in runs if x.get("curve") and x["curve"][0].get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def ablation_chain(rec: dict) -> str:
    """The ablation on builtin:chain: final greedy overall / long / mid with Δ vs VAPO and its 95% CI."""
    c = rec["config"]
    lines = [("| variant | paper: AIME24 avg@32, Qwen2.5-32B | ours: final greedy, all | Δ vs VAPO [95% CI] | "
              "long (9–14 steps): final | Δ long [95% CI] | mid (4–8 steps): final | Δ mid [95% CI] | "
              "critic EV (Monte-Carlo targets) | mean λ_policy |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rec["table"]:
        base = r["variant"] == "vapo"
        lines.append(f"| {r['description']} | {'—' if r['paper_aime24'] is None else r['paper_aime24']} | "
                     f"{_spread(r['final_greedy'])} | {'' if base else _ci(r.get('vs_vapo_final_greedy'))} | "
                     f"{_spread(r.get('final_greedy_long', {}))} | "
                     f"{'' if base else _ci(r.get('vs_vapo_final_greedy_long'))} | "
                     f"{_spread(r.get('final_greedy_mid', {}))} | "
                     f"{'' if base else _ci(r.get('vs_vapo_final_greedy_mid'))} | "
                     f"{_f(r['mean_explained_var'])}"
                     f"{'' if base or r['mean_explained_var'] is None else ' (Δ ' + _ci(r.get('vs_vapo_mean_explained_var')) + ')'}"
                     f" | {_f(r['mean_lambda_policy'])} |")
    runs = rec["runs"]
    extra = ", ".join(f"`{o}`" for o in c.get("extra_overrides") or []) or "none"
    lines += ["", f"Preset {c['preset']}, {c['steps']} policy steps per run, seeds {c['seeds']}, eval every "
              f"{c['eval_interval']} steps; extra overrides on every row: {extra}. Start (step 0, mean over runs): "
              f"all {_f(_start(runs, 'greedy'))}, long {_f(_start(runs, 'greedy_long'))}, mid "
              f"{_f(_start(runs, 'greedy_mid'))}. Values are mean ± std [min–max] over seeds; Δ = row mean − VAPO mean "
              "with Welch's 95% interval (* = excludes 0). Critic EV is against the same Monte-Carlo returns in "
              f"every row (mean over steps; — = no critic). {rec['paper_note']}."
              + ("" if rec.get("complete", True) else " **Incomplete record** (interrupted; finished rows only)."),
              "", _machine(rec)]
    return "\n".join(lines)


def chain_lookup(rec: dict) -> str:
    """Teacher-forced P(right sign) on the middle lines, by prompt length, one column group per policy."""
    res = rec["results"]
    head = "| steps | " + " | ".join(f"{chr(65 + i)}: sign P, middle lines | {chr(65 + i)}: lines with sign P < 0.5"
                                     f" | {chr(65 + i)}: digit P, middle lines" for i in range(len(res))) + " |"
    lines = [head, "|---|" + "---|---|---|" * len(res)]
    for n in sorted({int(k) for r in res for k in r["by_steps"]}):
        cells = []
        for r in res:
            x = r["by_steps"].get(str(n)) or r["by_steps"].get(n) or {}
            below = x.get("sign_below_half")
            cells += [_f(x.get("sign_middle"), 2), "—" if below is None else f"{below:.0%}", _f(x.get("digit_middle"), 2)]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    policies = "; ".join(f"{chr(65 + i)}: `{r['policy']}`" for i, r in enumerate(res))
    note = (f"{rec['config']['per_length']} held-out problems per step count, reference solution fed "
            f"(teacher-forced); middle lines = all but the first and the last two. Policies — {policies}.")
    lines += ["", note, "", _machine(rec)]
    return "\n".join(lines)


def concurrency(rec: dict) -> str:
    head = ("| scenario | runs at once | threads per run | OpenMP wait | rollout-step time per run (s; 128 samples "
            "+ 4 updates) | vs alone | wall (s) | load average start → end |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        lines.append(f"| {r['scenario']} | {r['runs']} | {r['threads']} | {r['wait_policy']} | "
                     f"{', '.join(f'{t:.2f}' for t in r['step_time_s_per_run'])} | {r['step_time_vs_alone']:.2f}× | "
                     f"{r['wall_s']:.0f} | {r['load_avg_start']} → {r['load_avg_end']} |")
    m = rec["machine"]
    summary = (f"Two runs at once: the run manager's thread budget makes a step {rec['naive_over_sized']:.2f}× faster "
               f"than torch's defaults. {rec['steps']} cpu-demo policy steps per run (first rollout step excluded).")
    footer = f"*{m['cpu_model']}, {m['logical_cores']} logical cores, torch {m['torch']}; `{rec['command']}` ({rec['date_utc']})*"
    lines += ["", summary, "", footer]
    return "\n".join(lines)


def trl_side_by_side(rec: dict) -> str:
    c, n = rec["config"], rec["config"]["points"]
    lines = [(f"| side | s / optimizer step | vs TRL GRPO | greedy start → final | step to +{n:g} points | "
              f"training s to +{n:g} points | training s total | of which value pretraining |"),
             "|---|---|---|---|---|---|---|---|"]
    for side, s in rec["summary"].items():
        lines.append(f"| {side} | {s['s_per_opt_step']:.3f} | {rec['ratio_vs_trl_grpo'][side]['s_per_opt_step']:.2f}× | "
                     f"{_f(s['start_greedy'])} → {_f(s['final_greedy'])} | {s['step_to_target'] or '—'} | "
                     f"{_f(s['train_s_to_target'], 1)} | {s['train_s_total']:.1f} | {s['value_pretrain_s']:.1f} |")
    v = c["versions"]
    note = (f"{c['task']}, preset {c['preset']}, {c['steps']} optimizer steps of {c['mini_batch_size']} responses "
            f"({c['opt_steps_per_rollout']} per rollout of {c['batch_size']}), eval every ~{c['eval_interval']} steps "
            f"on {c['heldout_problems']} held-out problems, seed {c['seed']}, one run per side; TRL {v['trl']}, "
            f"accelerate {v['accelerate']}; — = not reached.")
    lines += ["", note, "", _machine(rec)]
    return "\n".join(lines)


def provider_samples(rec: dict) -> str:
    c = rec["config"]
    gain = round(100 * c["gain"])
    lines = [(f"| run B | seed | greedy start → final | step to +{gain} points | wall s to +{gain} points | wall s "
              "total | provider answers (correct) | replayed provider positives | dropped | p50 latency (s) |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rec["runs"]:
        p = r.get("provider") or {}
        answers = f"{p['ok']:.0f} ({_f(p.get('accuracy'), 2)})" if p.get("ok") is not None else "—"
        lines.append(f"| {r['arm']} provider samples | {r['seed']} | {_f(r['start_greedy'])} → {_f(r['final_greedy'])}"
                     f" | {r['steps_to_target'] or '—'} | {_f(r['wall_s_to_target'], 0)} | {r['wall_s']:.0f} | "
                     f"{answers} | {_f(p.get('positives_added'), 0) if p else '—'} | "
                     f"{_f(p.get('dropped'), 0) if p else '—'} | {_f(p.get('latency_p50_s'), 2) if p else '—'} |")
    a = rec["run_a"]
    note = (f"Run A (the served model): cpu-demo, {c['steps_a']} steps, greedy {_f(a['curve'][0]['greedy'])} → "
            f"{_f(a['final_greedy'])}. Each run B: {c['steps_b']} steps from the initial model, eval every "
            f"{c['eval_interval']}; provider: {c['samples_per_prompt']} answers per prompt, concurrency "
            f"{c['concurrency']}, served on the same 2 cores (its cost is in the wall times); — = not reached.")
    return "\n".join([*lines, "", note, "", _machine(rec)])


def _mib(x) -> str:
    return "—" if x is None else f"{x / 2 ** 20:.0f}"


def memory(rec: dict) -> str:
    c, m = rec["config"], rec["config"]["model"]
    lines = [("| strategy | rank | parameters (MiB) | gradients (MiB) | AdamW states (MiB) | tensors total (MiB) | "
              "bytes per model parameter | peak RSS − baseline (MiB) | of which setup / step 1 / step 2 |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        phases = " / ".join(_mib(r[f"{k}_peak_minus_baseline"]) for k in ("setup", "first_step", "step"))
        lines.append(f"| {r['strategy']} | {r['rank']} | {r['param_bytes'] / 2 ** 20:.1f} | "
                     f"{r['grad_bytes'] / 2 ** 20:.1f} | {r['optimizer_bytes'] / 2 ** 20:.1f} | "
                     f"{r['tensor_bytes'] / 2 ** 20:.1f} | {r['bytes_per_param']:.2f} | "
                     f"{_mib(r['peak_rss_minus_baseline'])} | {phases} |")
    for s, run in rec["runs"].items():
        if not run["ok"]:
            lines.append(f"| {s} | — | failed: {run['error'].strip().splitlines()[-1][:200]} | | | | | | |")
    base = sorted({_mib(r["baseline_rss"]) for r in rec["rows"]})
    lines += ["", (f"Random-init Qwen2 (hidden {m['hidden']}, {m['layers']} layers; {m.get('policy_params', 0):,} "
                   f"policy + {m.get('value_params', 0):,} value parameters), {c['world_size']} gloo processes, two "
                   f"rollout steps of 4 responses (≤ 8 tokens), LoRA r {c['lora_r']} on every trunk linear; tensors "
                   f"counted after step 2 (a DTensor counts its local shard); RSS baseline after the imports: "
                   f"{', '.join(base)} MiB per rank.")]
    worlds = sorted({r["world"] for r in rec["extrapolation"]})
    strategies = list(dict.fromkeys(r["strategy"] for r in rec["extrapolation"]))
    lines += ["", "| model shapes (policy + value parameters) | " + " | ".join(
        f"{s}, {w} rank{'s' if w > 1 else ''}" for s in strategies for w in worlds) + " |",
              "|---|" + "---|" * (len(strategies) * len(worlds))]
    for name, t in rec["targets"].items():
        cells = {(r["strategy"], r["world"]): r["gib_per_rank"] for r in rec["extrapolation"] if r["model"] == name}
        lines.append(f"| {name} ({t['policy'] / 1e9:.2f} B + {t['value'] / 1e9:.2f} B) | " + " | ".join(
            f"{cells[s, w]:.1f}" for s in strategies for w in worlds) + " |")
    how = rec["extrapolation_method"].replace("\n", " ")
    lines += ["", ("GiB per rank of policy + value weights, gradients and AdamW states (fp32; activations not "
                   f"included). {how[0].upper()}{how[1:]}")]
    lines += ["", ("| bf16 on CUDA, GiB per rank (arithmetic) | fsdp: persistent at " + ", ".join(map(str, worlds))
                   + " ranks | fsdp: + transient ≤ | ddp: persistent | ddp: + flat fp32 gradients | ddp: + autocast "
                   "copies ≤ | lora: fp32 base (engine) | lora: bf16 base (not implemented) |"),
              "|---|---|---|---|---|---|---|---|"]
    for name, x in rec["bf16_cuda_arithmetic"].items():
        lines.append(f"| {name} | {' / '.join(str(v) for v in x['fsdp_persistent'].values())} | "
                     f"{x['fsdp_transient_up_to']} | {x['ddp_persistent']} | {x['ddp_transient_flat_grads']} | "
                     f"{x['autocast_bf16_weight_copies_up_to']} | {x['lora_frozen_fp32']} | {x['lora_if_bf16_base']} |")
    lines += ["", rec["bf16_note"], "", _machine(rec)]
    return "\n".join(lines)


RENDER = {"throughput": throughput, "sample_efficiency": sample_efficiency, "ablation": ablation,
          "ablation_chain": ablation_chain, "chain_lookup": chain_lookup,
          "concurrency": concurrency, "trl_side_by_side": trl_side_by_side, "provider_samples": provider_samples,
          "memory": memory}
OPTIONAL = {"trl_side_by_side", "chain_lookup"}
"""Records of optional extras: left out of the report, not flagged, when missing."""


def render(results: Path = RESULTS) -> str:
    parts = []
    for name, fn in RENDER.items():
        path = results / f"{name}.json"
        if path.is_file():
            parts.append(f"### {name.replace('_', ' ')}\n\n" + fn(json.loads(path.read_text(encoding="utf-8"))))
        elif name not in OPTIONAL:
            script = name.removesuffix("_chain") + ".py" + (" --preset chain-demo" if name.endswith("_chain") else "")
            parts.append(f"### {name.replace('_', ' ')}\n\n(no record: run `bench/{script}`)")
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(RESULTS), help="folder of the JSON records")
    print(render(Path(p.parse_args(argv).results)), end="")


if __name__ == "__main__":
    main()
