"""Markdown sections of docs/results.md, one renderer per record in bench/results (used by bench.report).

A renderer takes the record (a dict) and returns markdown. Every number it writes comes from the record: the
prose around the tables is generated from the same fields, so it cannot drift from them, and words such as
"resolved" are decided by the record's statistics, never typed in. Torch-free.
"""
from __future__ import annotations

import statistics

from . import stats
from .runs import steps_to_target
from .stats import welch_ci


def f(x, nd: int = 3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def spread(s: dict, nd: int = 3) -> str:
    """mean ± std [min–max] of a `stats.spread` dict."""
    if not s or s.get("mean") is None:
        return "—"
    if s.get("n", 1) <= 1:
        return f(s["mean"], nd)
    return f"{f(s['mean'], nd)} ± {f(s['std'], nd)} [{f(s['min'], nd)}–{f(s['max'], nd)}]"


def mstd(values: list) -> str:
    """mean ± std [min–max] of the non-missing values."""
    return spread(stats.spread(values, nd=None))


def machine(rec: dict) -> str:
    m = rec["machine"]
    commit = f"; commit {rec['commit'][:10]}{'+changes' if rec['commit'].endswith('+changes') else ''}" \
        if rec.get("commit") else ""
    return (f"*{m['cpu_model']}, {m['logical_cores']} logical cores, torch {m['torch']}; "
            f"`{rec['command']}`; {rec['wall_s_total']:.0f} s wall; load average at start/end "
            f"{rec['load_avg_start']} / {rec['load_avg_end']} ({rec['date_utc']}{commit})"
            f"{'; ' + rec['note'] if rec.get('note') else ''}*")


def section(lines: list[str], rec: dict, *notes: str) -> str:
    """A record's section: its table lines, each note as a paragraph, and its provenance line last."""
    return "\n".join([*lines, *(x for note in notes for x in ("", note)), "", machine(rec)])


BENCH_LABELS = {"vapo_offline_critic": "full VAPO from a critic pretrained once offline and reused (its rollouts "
                                       "not in the budget)",
                "vapo_linear_critic": "full VAPO with the hidden-state critic (critic.head = linear)"}
"""The rows of the paired design that are not variants (bench/experiments/ablation.py BENCH_ROWS)."""


def _label(variant: str) -> str:
    from vapo_engine.variants import VARIANTS
    return VARIANTS[variant].description if variant in VARIANTS else BENCH_LABELS.get(variant, variant)


def _interval(t: dict | None) -> str:
    if not t or t.get("delta") is None:
        return "—"
    if not t.get("ci"):
        return f"{t['delta']:+.3f}"
    lo, hi = t["ci"]
    return f"{t['delta']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _per_seed(d: dict, nd: int = 0) -> str:
    return ", ".join("—" if v is None else f"{v:.{nd}f}" for _, v in sorted(d.items(), key=lambda kv: int(kv[0])))


def ablation_paired(rec: dict) -> str:
    """The paired-budget ablation: area under the held-out curve, Δ vs VAPO with Holm-corrected intervals."""
    c, runs = rec["config"], rec["runs"]
    key = c["metric"]
    head = (f"| row | area under the {key} curve (mean ± sd over seeds) | Δ area vs VAPO [Holm interval] | "
            f"p (Holm-adjusted) | resolved | rollouts to {key} ≥ {c['threshold']:g}, per seed | final {key}, mean | "
            "critic EV, pooled over steps | critic EV within prompt, mean over steps | value-pretraining rollouts, "
            "per seed |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rec["table"]:
        v, t = row["variant"], row.get("vs_base")
        mine = [r for r in runs if r["variant"] == v]
        ev = [r.get("pooled_explained_var") for r in mine]
        within = [r.get("mean_explained_var_within_prompt") for r in mine]
        pre = _pretrain_rollouts(rec, v)
        lines.append(
            f"| {_label(v)} | {f(row['area_mean'])} ± {f(row['area_sd'])} | {'' if t is None else _interval(t)} | "
            f"{'' if t is None else f(t.get('p_holm'), 3)} | {'' if t is None else ('yes' if t['resolved'] else 'no')} | "
            f"{_per_seed(row['reach'], 1)} | {f(_mean(list(row['final'].values())))} | "
            f"{mstd(ev)} | {mstd(within)} | {_per_seed(pre)} |")
    starts = [r["curve"][0][key] for r in runs if r["curve"] and r["curve"][0]["step"] == 0]
    extra = ", ".join(f"`{o}`" for o in c["extra_overrides"]) or "none"
    n_seeds, n_cmp = len(c["seeds"]), sum(1 for r in rec["table"] if r.get("vs_base"))
    lines += ["", (f"Preset {c['preset']}; every row spends {c['budget_rollouts']} rollouts (value-pretraining "
                   f"rollouts included) with seeds {c['seeds']}; evaluation every {c['eval_interval']} policy steps; "
                   f"overrides on every row: {extra}. Start (step 0, mean over runs): {key} {f(_mean(starts))}. "
                   "Area = mean held-out accuracy over the budget (the curve is flat at the start value while a "
                   "critic pretrains). Δ = row − VAPO, paired by seed; intervals are t intervals at the level Holm's "
                   f"procedure tests each row at ({n_cmp} comparisons, family-wise 95%); resolved = rejected by Holm. "
                   "Rows that pretrain a critic share one per seed (trained once, counted in each row's budget). "
                   "Without value pretraining the value head starts at zero: with V ≡ 0 and λ < 1 a token's advantage "
                   "is λ^(T−t)·R before whitening — the return, damped by λ for every token to the end (a decision "
                   "60 tokens before the end gets λ^60 of the last token's weight), with no per-state baseline; "
                   "whitening only subtracts one batch-wide mean — until the critic learns."),
              *_offline_note(rec), "", _resolution(rec["table"], n_seeds), *_policy_rollouts(rec)]
    lines += ["", (f"Cost of the design: {rec['wall_s_runs_and_critics_sum'] / 60:.0f} minutes of run time (every "
                   f"run and shared critic, each in its own process, {c['jobs']} at a time on this machine; the "
                   "wall time below is the last invocation's, which may have taken finished runs from the cache).")]
    return section(lines, rec)


def _pretrain_rollouts(rec: dict, variant: str) -> dict[str, int]:
    """A row's value-pretraining rollouts, by seed (as the record's per-seed tables key them)."""
    return {str(r["seed"]): r["pretrain_rollouts"] for r in rec["runs"] if r["variant"] == variant}


def _policy_rollouts(rec: dict) -> list[str]:
    """Where the rollouts to the threshold went: the budget's rollouts to it minus those spent pretraining a critic
    (the policy's own), per row, so a row that only pays for its critic is told from one whose updates learn faster."""
    c, parts = rec["config"], []
    for row in rec["table"]:
        pre = _pretrain_rollouts(rec, row["variant"])
        own = [v - pre.get(s, 0) for s, v in row["reach"].items() if v is not None]
        missed = sum(v is None for v in row["reach"].values())
        if own:
            parts.append(f"{row['variant']} {_mean(own):.1f}" + (f" ({missed} seed(s) never reached it)" if missed else ""))
    if not parts:
        return []
    return ["", (f"Policy rollouts to {c['metric']} ≥ {c['threshold']:g} (the rollouts to it above, minus the seed's "
                 "value-pretraining rollouts), mean over the seeds that reached it: " + ", ".join(parts) + ". Where a row's "
                 "number equals VAPO's, its area over VAPO's comes from the rollouts VAPO spends pretraining its "
                 "critic before its policy moves, not from faster learning per policy rollout.")]


def _offline_note(rec: dict) -> list[str]:
    """The offline critic's cost and quality, where the design has that row (its rollouts are not in the budget)."""
    c = rec.get("critics", {}).get("vapo_offline_critic")
    if not c:
        return []
    within = [x for x in c.get("heldout_explained_var_within_prompt") or [] if x is not None]
    return ["", (f"The offline critic of `vapo_offline_critic` was pretrained once, from seed {c['seed']} (a prompt "
                 f"stream no row draws), for {c['rollouts']} rollouts ({c['responses']} responses, "
                 f"{c['wall_s'] / 60:.0f} min here) and reused by every seed; those rollouts are not in the row's "
                 "budget. Its held-out EV in its last round: "
                 f"{f((c.get('heldout_explained_var') or [None])[-1])} overall"
                 + (f", {f(within[-1])} within prompt" if within else "") + ".")]


def _mean(xs: list) -> float | None:
    return stats.spread(xs, nd=None)["mean"]


def _resolution(table: list[dict], n_seeds: int) -> str:
    """What is resolved, then what is not — in that order, with numbers only, no direction words for the rest."""
    rows = [r for r in table if r.get("vs_base")]
    done = [r for r in rows if r["vs_base"]["resolved"]]
    open_ = [r for r in rows if not r["vs_base"]["resolved"]]
    parts = []
    if done:
        parts.append("**Resolved** at " + f"{n_seeds} seeds: " + "; ".join(
            f"{_label(r['variant'])} (Δ {_interval(r['vs_base'])})" for r in done) + ".")
    else:
        parts.append(f"**Resolved:** none of the {len(rows)} differences from VAPO at {n_seeds} seeds.")
    if open_:
        parts.append("**Not resolved** (the interval contains 0; read these as no measured difference at this size, "
                     "not as a ranking): " + ", ".join(_label(r["variant"]) for r in open_) + ".")
    return " ".join(parts)


def critic(rec: dict) -> str:
    """Each critic's EV against the Monte-Carlo ceiling, by kind of state."""
    c, top = rec["config"], rec["ceiling"]
    names = top["critics"]
    head = ("| states | scope | " + " | ".join(f"critic EV: {n}" for n in names)
            + " | Monte-Carlo EV | ceiling (true value's EV) | states measured |")
    lines = [head, "|---|---|" + "---|" * (len(names) + 3)]
    for kind, t in top["ev"].items():
        for scope in ("overall", "within_prompt"):
            row = t.get(scope)
            if row:
                lines.append(f"| {kind} | {scope.replace('_', ' ')} | " + " | ".join(f(row[n]) for n in names)
                             + f" | {f(row['monte_carlo'])} | {f(row['ceiling'])} | {t['states']} |")
    curves = "; ".join(f"{s['name']}: {', '.join(f(x, 2) for x in s['curve'])}" for s in rec["sweep"])
    over = f" with {', '.join(f'`{o}`' for o in c['overrides'])}" if c.get("overrides") else ""
    lines += ["", (f"Preset {c['preset']}{over}. Critics: value pretraining alone from the initial policy (seed 1), held-out "
                   f"EV of each round before training on it — {curves}. Measured on {top['prompts']} held-out "
                   f"prompts × {top['group']} responses of the initial policy (accuracy {f(top['accuracy'])}, mean "
                   f"length {f(top['mean_response_length'], 1)} tokens): at every line start (`line`) and right after "
                   f"every line's sign (`decision`), the Monte-Carlo value from {top['continuations']} sampled "
                   "continuations, against the response's return. EV is pooled over all states of a kind; `within "
                   "prompt` removes each prompt's mean first (what a per-prompt baseline leaves). The ceiling is the "
                   "Monte-Carlo EV plus its sampling noise (V̂(1 − V̂)/(m − 1) per state): the EV of the true value "
                   "function, which no critic can beat."), "", machine(rec)]
    return "\n".join(lines)


def critic_summary(rec: dict, name: str = "critic") -> str:
    """One sentence: the longest-trained critic's EV over all states against the ceiling, overall and within prompt."""
    top = rec["ceiling"]
    label, t = top["critics"][-1], top["ev"]["all"]
    mine, ceil = t["within_prompt"][label], t["within_prompt"]["ceiling"]
    share = "none of it (EV ≤ 0)" if mine <= 0 else f"{mine / ceil:.0%} of it"
    head = next((o.split("=", 1)[1].strip('"') for o in rec["config"].get("overrides", [])
                 if o.startswith("critic.head=")), None)
    return (f"**The critic** ({label}{f', {head} head' if head else ''}; `bench/results/{name}.json`, "
            f"{top['continuations']} Monte-Carlo continuations "
            f"per state, {t['states']} states): explained variance {f(t['overall'][label])} over all states against "
            f"a ceiling of {f(t['overall']['ceiling'])} for the true value; within prompt groups (what a value-based "
            f"advantage can add over a per-prompt baseline) the ceiling is {f(ceil)} and this critic explains "
            f"{share}.")


def warm_start(rec: dict) -> str:
    head = ("| model | bucket | greedy accuracy | sampled accuracy (T = 1) | sign errors per sampled line | "
            "sampled answers stopped early |")
    lines = [head, "|---|---|---|---|---|---|"]
    for m in rec["models"]:
        for b in ("short", "mid", "long", "all"):
            g, s = m[f"greedy_{b}"], m[f"sampled_{b}"]
            lines.append(f"| `{m['model']}` | {b} | {f(g['accuracy'], 2)} | {f(s['accuracy'], 2)} | "
                         f"{f(s['sign_error_per_line'])} | {f(s['stopped_early'], 2)} |")
    c = rec["config"]
    builds = "; ".join(
        f"`{m['model']}` ({m['folder']}): " + ", ".join(
            f"phase {p['name']} lr {p['lr']:g}" + (f" noise {p['noise']:g}" if p.get("noise") else "")
            + (f" teacher stops after {p['teacher_lines']} lines" if p.get("teacher_lines") else "")
            + (f", {m['build']['phase_steps'][p['name']]} steps" if p["name"] in m["build"]["phase_steps"] else "")
            for p in m["build"]["recipe_phases"]) for m in rec["models"] if m["build"]["recipe_phases"])
    lines += ["", (f"{c['problems']} held-out problems (an equal number per step count 1–14), sampled accuracy "
                   f"over {c['samples']} samples each. Phases after the start model: {builds or 'none'}."),
              "", machine(rec)]
    return "\n".join(lines)


def throughput(rec: dict) -> str:
    """Median [range] over interleaved repeats of one VAPO rollout step per dtype, and the within-round ratio."""
    p, c = rec["matmul_peak"], rec["config"]
    lines = [("| model.dtype | step time (s) | rollout phase (s) | update phase (s) | rollout tokens/s | "
              "update responses/s | update GFLOP/s | % of same-dtype matmul peak |"), "|---|---|---|---|---|---|---|---|"]

    def cell(s: dict, k: str, nd: int, scale: float = 1.0) -> str:
        lo, hi = s[f"{k}_range"]
        return f"{s[k] * scale:.{nd}f} [{lo * scale:.{nd}f}–{hi * scale:.{nd}f}]"
    over = []
    for d, s in rec["summary"].items():
        above = s["fraction_of_peak_same_dtype"] > 1  # the matmul probe is then no peak for this dtype
        over += [d] if above else []
        lines.append(f"| {d} | {cell(s, 'step_time_s', 2)} | {cell(s, 'rollout_time_s', 2)} | "
                     f"{cell(s, 'update_time_s', 2)} | {cell(s, 'rollout_tokens_per_s', 0)} | "
                     f"{cell(s, 'update_samples_per_s', 1)} | {cell(s, 'update_gflops_achieved', 1)} | "
                     f"{'— (see below)' if above else cell(s, 'fraction_of_peak_same_dtype', 1, 100)} |")
    mk, r = p["model_shape"]["m_k_n"], rec["step_time_ratio"]
    if over:
        lines += ["", (f"{', '.join(over)}: the update ran faster than the square-matmul probe of the same dtype, so "
                       "that probe is no peak for this dtype on this machine (why was not measured); no fraction is "
                       "shown.")]
    lines += ["", (f"Median [min–max] over {c['repeats']} {c['order']} repeats (a fresh trainer each; "
                   f"{c['warmup_steps']} unmeasured + {c['measured_steps']} measured rollout steps of the {c['preset']} "
                   f"VAPO recipe per repeat). Step-time ratio {r['of']} within each round: "
                   f"{', '.join(f'{x:.2f}' for x in r['per_round'])}. Measured matmul peak (torch.matmul, best of "
                   f"square sizes {list(p['square']['float32'])}): fp32 {p['peak_gflops']['float32']:.0f} GFLOP/s, bf16 "
                   f"{p['peak_gflops']['bfloat16']:.0f} GFLOP/s; one micro-batch MLP-shaped matmul ({mk[0]}×{mk[1]} @ "
                   f"{mk[1]}×{mk[2]}): fp32 {p['model_shape']['float32']:.1f}, bf16 {p['model_shape']['bfloat16']:.1f} "
                   "GFLOP/s."), "", machine(rec)]
    return "\n".join(lines)


def _tail_mean(curve: list[dict], key: str, k: int = 3):
    """Mean of the last k evaluations (less noisy than the single final one)."""
    vals = [p[key] for p in curve if p.get(key) is not None][-k:]
    return sum(vals) / len(vals) if vals else None


def _hits(runs: list[dict], key: str, target: float) -> str:
    return ", ".join("—" if h is None else str(h) for h in (steps_to_target(r["curve"], target, key) for r in runs))


def sample_efficiency(rec: dict) -> str:
    c = rec["config"]
    lines = [("| algorithm | final greedy (mean ± std [min–max]) | Δ final greedy vs VAPO [Welch 95%] | final sampled "
              "avg@2 | sampled avg@2, mean of last 3 evals | steps to greedy ≥ 0.85 (per seed) | critic EV, mean of per-step "
              "ratios | s / run |"),
             "|---|---|---|---|---|---|---|---|"]
    base = [r["final_greedy"] for r in rec["runs"] if r["variant"] == "vapo"]
    deltas = {}
    for a, s in rec["summary"].items():
        runs = [r for r in rec["runs"] if r["variant"] == a]
        deltas[a] = None if a == "vapo" else welch_ci([r["final_greedy"] for r in runs], base)
        lines.append(f"| {a} | {spread(s['final_greedy'])} | {_welch(deltas[a])} | {spread(s['final_sampled'])} | "
                     f"{mstd([_tail_mean(r['curve'], 'sampled') for r in runs])} | {_hits(runs, 'greedy', 0.85)} | "
                     f"{f(s['mean_explained_var']['mean'])} | {f(s['wall_s']['mean'], 0)} |")
    starts = [r["curve"][0] for r in rec["runs"] if r["curve"] and r["curve"][0]["step"] == 0]
    start = {k: statistics.fmean(p[k] for p in starts) for k in ("greedy", "sampled")} if starts else {}
    resolved = [a for a, d in deltas.items() if d and d.get("significant")]
    verdict = ("Resolved at 95% (Welch, unpaired): " + ", ".join(resolved) + "." if resolved else
               f"No difference from VAPO is resolved at {len(c['seeds'])} seeds (every Welch interval contains 0).")
    note = (f"{c['steps']} policy steps × 32 responses per step, seeds {c['seeds']} (unpaired: recorded before "
            f"runs drew their prompts from named streams); held-out 200 problems evaluated every ~{c['eval_interval']} "
            f"steps; step-0 mean over runs: greedy {f(start.get('greedy'))}, sampled {f(start.get('sampled'))}; "
            f"— = not reached. {verdict}")
    return section(lines, rec, note)


def _welch(d: dict | None) -> str:
    if not d or d.get("delta") is None:
        return ""
    return f"{d['delta']:+.3f}" + (f" [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" if d.get("ci95") else "")


def chain_lookup(rec: dict) -> str:
    """Teacher-forced P(right sign) on the middle lines, by prompt length, one column group per policy."""
    res = rec["results"]
    head = "| steps | " + " | ".join(f"{chr(65 + i)}: sign P, middle lines | {chr(65 + i)}: lines with sign P < 0.5"
                                     f" | {chr(65 + i)}: digit P, middle lines" for i in range(len(res))) + " |"
    lines = [head, "|---|" + "---|---|---|" * len(res)]
    for n in sorted({int(k) for r in res for k in r["by_steps"]}):
        cells = []
        for r in res:
            x = r["by_steps"].get(str(n)) or {}
            below = x.get("sign_below_half")
            cells += [f(x.get("sign_middle"), 2), "—" if below is None else f"{below:.0%}", f(x.get("digit_middle"), 2)]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    policies = "; ".join(f"{chr(65 + i)}: `{r['policy']}`" for i, r in enumerate(res))
    note = (f"{rec['config']['per_length']} held-out problems per step count, reference solution fed "
            f"(teacher-forced); middle lines = all but the first and the last two. Policies — {policies}.")
    return section(lines, rec, note)


def provider_samples(rec: dict) -> str:
    c = rec["config"]
    gain = round(100 * c["gain"])
    lines = [(f"| run B | seed | greedy start → final | step to +{gain} points | wall s to +{gain} points | wall s "
              "total | provider answers (share correct) | provider positives added to the replay buffer | dropped | "
              "p50 latency (s) |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rec["runs"]:
        p = r.get("provider") or {}
        answers = f"{p['ok']:.0f} ({f(p.get('accuracy'), 2)})" if p.get("ok") is not None else "—"
        lines.append(f"| {r['arm']} provider samples | {r['seed']} | {f(r['start_greedy'])} → {f(r['final_greedy'])}"
                     f" | {r['steps_to_target'] or '—'} | {f(r['wall_s_to_target'], 0)} | {r['wall_s']:.0f} | "
                     f"{answers} | {f(p.get('positives_added'), 0) if p else '—'} | "
                     f"{f(p.get('dropped'), 0) if p else '—'} | {f(p.get('latency_p50_s'), 2) if p else '—'} |")
    a = rec["run_a"]
    note = (f"Run A (the served model): cpu-demo, {c['steps_a']} steps, greedy {f(a['curve'][0]['greedy'])} → "
            f"{f(a['final_greedy'])}. Each run B: {c['steps_b']} steps from the initial model, eval every "
            f"{c['eval_interval']}; provider: {c['samples_per_prompt']} answers per prompt, concurrency "
            f"{c['concurrency']}, served on the same 2 cores (its cost is in the wall times); — = not reached. "
            "Answers = provider requests answered (prompts sent × answers per prompt); positives added = correct "
            "answers that joined the replay buffer (what the positive-example NLL then draws from, not how often "
            "each was drawn).")
    return section(lines, rec, note)


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
    lines += ["", (f"Random-init Qwen2 (hidden {m['hidden']}, {m['layers']} layers; {m['policy_params']:,} "
                   f"policy + {m['value_params']:,} value parameters), {c['world_size']} gloo processes, two "
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
    return section(lines, rec, rec["bf16_note"])


def rollout_backends(rec: dict) -> str:
    """hf vs serve-model replicas: mean over interleaved rounds (each round's value listed), the load around each."""
    c = rec["config"]
    lines = [("| backend | replicas | generated tokens/s | s / rollout step | vs hf (s/step) | rollout phase (s) | "
              "update phase (s) | load average per round (start → end) |"), "|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        loads = "; ".join(f"{a[0]:.1f} → {b[0]:.1f}" for a, b in r["load_avg_rounds"])
        lines.append(f"| {r['scenario']} | {r['replicas'] or 'in the trainer'} | {r['tokens_per_s']:.0f} "
                     f"({', '.join(f'{x:.0f}' for x in r['tokens_per_s_rounds'])}) | {r['s_per_step']:.2f} "
                     f"({', '.join(f'{x:.2f}' for x in r['s_per_step_rounds'])}) | {r['s_per_step_vs_hf']:.2f}× | "
                     f"{r['rollout_time_s']:.2f} | {r['update_time_s']:.2f} | {loads} |")
    threads = ", ".join(f"{k}: {v}" for k, v in c["replica_threads"].items())
    note = (f"Preset {c['preset']}, seed {c['seed']}, {c['updates_per_rollout']} updates per rollout step; per run "
            f"{c['warmup']} unmeasured + {c['steps']} measured rollout steps, {c['repeats']} interleaved rounds (the "
            f"round values in parentheses). s / rollout step is the wall time between two steps' records (for "
            f"server it includes writing the weights and every replica loading them); torch threads: trainer "
            f"{c.get('trainer_threads', '—')}, per replica {threads}. On CPU `server` runs the same Hugging Face model on the same cores as the trainer: this is "
            "the protocol's overhead, not an engine's speed-up (a GPU-engine property: scripts/gpu_check.py "
            "--checks engine). Timings depend on other work on the cores: the load average of each run is shown.")
    return section(lines, rec, note)
