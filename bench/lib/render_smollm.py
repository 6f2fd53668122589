"""Markdown of the real-model records (docs/results.md): SmolLM2-135M-Instruct's baseline on builtin:word, the speed of
its rollout steps next to the physical bound, and the `smollm-word` run with the smoke question before and after.
Every number comes from the record (bench/lib/render.py's rules). Torch-free."""
from __future__ import annotations

from fractions import Fraction

from vapo_engine.tasks.answers import last_number

from .render import f, section

BUCKETS = ("speed", "price", "rate", "percent", "two_step")
SCALE = ("Numbers of a 135M-parameter model on a 2-core CPU, not of the paper's 32B model.")


def _bucket_cells(buckets: dict, kind: str) -> str:
    return " | ".join(f((buckets.get(b) or {}).get(kind)) for b in BUCKETS)


def baseline(rec: dict) -> str:
    head = "| | all | " + " | ".join(BUCKETS) + " |"
    lines = [head, "|---" * (len(BUCKETS) + 2) + "|",
             f"| greedy | {f(rec['greedy_accuracy'])} | {_bucket_cells(rec['buckets'], 'greedy')} |",
             (f"| sampled (avg@{rec['samples_per_problem']}) | {f(rec['sampled_accuracy'])} | "
             f"{_bucket_cells(rec['buckets'], 'sampled')} |")]
    wrong = next((e for e in rec["examples"] if not e["correct"]), None)
    ex = (f" A greedy answer it gets wrong ({wrong['bucket']}, gold {wrong['answer']}): \"{wrong['prompt']}\" → "
          f"\"{' '.join(wrong['response'][-160:].split())}\"" if wrong else "")
    note = (f"`{rec['model']}` through its chat template, preset `{rec['preset']}`: {rec['problems']} held-out "
            f"problems of `{rec['benchmark']}` (the kinds in turn), greedy and {rec['samples_per_problem']} samples "
            f"each at temperature {rec['temperature']:g}, at most {rec['max_tokens']} new tokens; mean greedy answer "
            f"length {f(rec['response_length'], 1)} tokens; {rec['eval_seconds']:.0f} s.{ex} {SCALE}")
    return section(lines, rec, note)


def speed(rec: dict) -> str:
    lines = ["| part of a rollout step | measured (s) | bound (s) | measured / bound | GFLOP |", "|---|---|---|---|---|"]
    names = {"sample": "sampling (generate, KV cache)", "update": "old outputs + actor + critic micro-batches"}
    for key, label in names.items():
        p = rec["parts"][key]
        lines.append(f"| {label} | {p['measured_s']:.1f} | {p['bound_s']:.1f} | {p['measured_over_bound']:.2f} | "
                     f"{p['gflop']:.0f} |")
    s, w, m = rec["parts"]["sample"], rec["per_step"], rec["matmul"]
    k = rec["log_probs_keep_logits"]
    note = (f"Preset `{rec['preset']}` ({w['rows']} responses per rollout step, prompts {w['prompt_width']:.0f} "
            f"tokens wide, responses {w['response_width']:.0f}), {rec['torch_threads']} torch threads, "
            f"{len(rec['steps'])} measured step(s) after one warm-up: {rec['step_s']:.1f} s per rollout step, peak resident "
            f"memory {rec['peak_rss_gib']:.1f} GiB of the machine's 24 (so micro-batches of "
            f"{rec['micro_batch_size']} rows leave room; the logits of a micro-batch are rows × response × 49,152 "
            f"floats); sampling "
            f"{s['tokens_per_s']:.1f} generated tokens/s against a bound of {s['bound_tokens_per_s']:.1f}. The bound "
            f"is FLOPs ÷ the fp32 matmul rate measured at the same shapes: {m['decode_mlp']['gflops']:.1f} GFLOP/s "
            f"for a decode step's MLP ({m['decode_mlp']['m_k_n']}), {m['update_mlp']['gflops']:.1f} for an update "
            f"micro-batch's ({m['update_mlp']['m_k_n']}), {m['square_1024']['gflops']:.1f} at 1024³. The LM head on "
            f"response positions only (logits_to_keep) makes the trainer's log-prob pass {k['smollm']['speedup']:.2f}× "
            f"as fast on this model and {k['tiny']['speedup']:.2f}× on the built-in tiny model (medians of "
            f"interleaved repeats). {_profile(rec['sampling_profile'])}{_full(rec.get('full_finetuning'))} {SCALE}")
    return section(lines, rec, note)


def _full(ff: dict | None) -> str:
    if not ff or not ff["steps"]:
        return ""
    st = ff["steps"][-1]
    return (f" Full fine-tuning (lora.enabled = false, {ff['policy_trainable_params']:,} policy weights training): "
            f"{st['perf/step_time_s']:.1f} s per rollout step (sampling {st['perf/sample_time_s']:.1f} s, actor "
            f"{st['perf/actor_time_s']:.1f} s, optimizer {st['perf/optimizer_time_s']:.1f} s).")


def _profile(prof: dict) -> str:
    ops = ", ".join(f"{o['op'].removeprefix('aten::')} {100 * o['share']:.0f} %" for o in prof["top_ops"][:5])
    return (f"Profile of one sampling call ({prof['rows']} rows, {prof['new_tokens']} new tokens, torch.profiler "
            f"self CPU time): {ops}.")


def ends_on(answers: list[dict], expect: str) -> int:
    """How many answers end on the expected number (the last number of the answer's kept tail): stricter than
    smoke's rule, which passes an answer that contains it anywhere, also one that goes on to a wrong result."""
    last = (last_number(a["answer_tail"]) for a in answers)
    return sum(n is not None and Fraction(n.replace(",", "")) == Fraction(expect) for n in last)


def run(rec: dict) -> str:
    lines = ["| step | time (s) | sampled | greedy | " + " | ".join(f"sampled {b}" for b in BUCKETS)
             + " | critic held-out EV |", "|---" * (len(BUCKETS) + 5) + "|"]
    for p in rec["curve"]:
        lines.append(f"| {p['step']} | {f(p.get('time_s'), 0)} | {f(p['sampled'])} | {f(p['greedy'])} | "
                     + " | ".join(f(p.get(f"sampled_{b}")) for b in BUCKETS) + f" | {f(p.get('critic_ev'), 2)} |")
    sm = rec["smoke"]
    note = (f"`vapo-mcp train --preset {rec['preset']}` (overrides: {', '.join(rec['overrides']) or 'none'}), seed "
            f"{rec['seed']}: held-out sampled accuracy {f(rec['start_sampled'])} → {f(rec['final_sampled'])} "
            f"({rec['gain_sampled_points']:+.1f} points), greedy {f(rec['start_greedy'])} → {f(rec['final_greedy'])} "
            f"({rec['gain_greedy_points']:+.1f} points), in {rec['wall_s']:.0f} s. The seed's smoke question "
            f"(\"{sm['prompt']}\", `vapo-mcp smoke --max-tokens {sm['max_tokens']}` against `vapo-mcp serve-model`, "
            f"{sm['base']['samples']} times each): the base model answered correctly {sm['base']['passed']} of {sm['base']['samples']} times "
            f"({f(sm['base']['rate'], 2)}), the trained checkpoint {sm['trained']['passed']} of "
            f"{sm['trained']['samples']} ({f(sm['trained']['rate'], 2)}) (smoke's rule: 80 as a number anywhere in "
            f"the answer); ending on {sm['expect']}: {ends_on(sm['base']['answers'], sm['expect'])} and "
            f"{ends_on(sm['trained']['answers'], sm['expect'])} of {sm['trained']['samples']}. {_evaluated(rec)}{SCALE}")
    shown = [ln for ln in rec.get("printed", []) if not ln.startswith("  more:")]
    transcript = "\n".join(["What the run printed (`vapo-mcp train`'s console lines):", "```text", *shown, "```"])
    return section(lines, rec, note, *([transcript] if shown else []))


def _evaluated(rec: dict) -> str:
    ev = rec["config"]["eval"]
    n, k = ev["num_problems"], ev["samples_per_problem"]
    return (f"Each evaluation: {n} held-out problems, greedy once and sampled {k} times each at temperature "
            f"{rec['config']['model']['temperature']} ({n * k} sampled answers). ")
