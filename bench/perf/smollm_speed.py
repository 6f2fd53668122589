"""Where a rollout step of the real model (`--preset smollm-word`) spends its time on this CPU, next to the
physical bound (docs/results.md "A real model's rollout step on this CPU").

Measured in one run, on a quiet machine (`cpu-slot --both`, OMP_NUM_THREADS=2):
1. the fp32 matmul rate: torch.matmul at the model's shapes (a decode step of the rollout batch, and a prefill /
   update micro-batch, through the 576 × 1536 MLP projection and the 576 × 49,152 LM head) and square 1024;
2. `--steps` full rollout steps of the preset (after one warm-up step), each split into its parts as the trainer
   logs them: sampling (generate, KV cache, the old log-probs read off the decoding steps), the old-output pass
   (the critic's values), the actor's and the critic's micro-batches, the optimizer steps;
3. the bound of each part: FLOPs ÷ the measured matmul rate at that shape. FLOPs per token of a forward pass =
   2 × the weights used in matmuls (LM head included for the policy: it runs at every sampled position, and on
   the response positions only in the trainer's passes) + 4 × layers × context × hidden for attention; a LoRA
   update's backward computes input gradients only through the frozen weights (≈ the forward again) plus the
   adapters' small weight gradients; the critic likewise (its own adapters, full head);
4. a torch.profiler breakdown of one sampling call at the rollout's shape (16 new tokens): the share of the
   matmuls against the per-token work around them (cache concatenation, sampling, logits processors);
5. the trainer's log-prob pass with and without `logits_to_keep` (the LM head on response positions only) on
   this model and on the built-in tiny model (interleaved repeats, the ratio measured in one run);
6. full fine-tuning (lora off) of the same preset: the parameters that train, and its steps' parts.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.perf.smollm_speed [--steps 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.lib import records
from bench.lib.runs import settings_with_seed
from bench.perf.throughput import _time_matmul, matmul_params

PARTS = ("perf/sample_time_s", "perf/old_outputs_time_s", "perf/actor_time_s", "perf/critic_time_s",
         "perf/optimizer_time_s", "perf/update_time_s", "perf/step_time_s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2, help="measured rollout steps (after one warm-up step)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="overrides of the preset")
    p.add_argument("--full-ft-steps", type=int, default=1, help="rollout steps with full fine-tuning (lora off) "
                   "measured after the LoRA ones (0 = none)")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


def matmul_rates(rows_decode: int, rows_update: int, min_s: float = 0.5) -> dict:
    """GFLOP/s of fp32 torch.matmul (m × k) @ (k × n) at the shapes the model runs."""
    import torch
    shapes = {"decode_mlp": (rows_decode, 576, 1536), "decode_lm_head": (rows_decode, 576, 49152),
              "update_mlp": (rows_update, 576, 1536), "update_lm_head": (rows_update, 576, 49152),
              "square_1024": (1024, 1024, 1024)}
    out = {}
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        out[name] = {"m_k_n": [m, k, n], "gflops": round(2 * m * k * n / _time_matmul(a, b, min_s) / 1e9, 2)}
    return out


def build(overrides: list[str]):
    from vapo_engine.config import load_config
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.setup import build_trainer
    cfg = load_config(records.REPO / "config.toml", ["training.total_steps=100000", "eval.eval_interval=100000",
                                                     *overrides], preset="smollm-word")
    with tempfile.TemporaryDirectory(prefix="vapo-bench-") as tmp:
        info = create_run(cfg, settings_with_seed(1), Path(tmp), run_id="smollm-speed")
        return build_trainer(info.run_dir, write=False, log=lambda s: None), cfg


def full_finetuning(overrides: list[str], steps: int) -> dict:
    """The same preset with every weight training (lora.enabled = false): `steps` rollout steps after a warm-up,
    the parameters that train, and the step's parts."""
    tr, _ = build([*overrides, "lora.enabled=false"])
    trains = sum(p.numel() for p in tr.models.policy.parameters() if p.requires_grad)
    return {"policy_trainable_params": trains, "steps": measure_steps(tr, steps)}


def measure_steps(tr, steps: int) -> list[dict]:
    """One warm-up rollout step, then `steps` measured ones: the trainer's perf/ parts and the batch widths."""
    from vapo_engine.trainer import loop
    widths: list[tuple[int, int]] = []
    real = loop.add_advantages

    def seen(ro, *a, **kw):  # the sampled batch's (prompt, response) widths, as the trainer's passes see them
        widths.append((ro.prompt_len, ro.response_mask.shape[1]))
        return real(ro, *a, **kw)
    loop.add_advantages = seen
    try:
        loop.rollout_step(tr)
        rows = []
        for _ in range(steps):
            widths.clear()
            m = loop.rollout_step(tr)
            rows.append({**{k: round(float(m[k]), 3) for k in PARTS if k in m},
                         "tokens_per_s": round(float(m["rollout/tokens_per_s"]), 1),
                         "response_length": round(float(m["rollout/response_length"]), 1),
                         "widths": widths[0] if widths else None})
    finally:
        loop.add_advantages = real
    return rows


def bounds(tr, cfg, rows: list[dict], rates: dict) -> dict:
    """FLOPs of each part per rollout step and the seconds they take at the measured matmul rates."""
    pol, crit = tr.models.policy.config, tr.models.value.config
    head = pol.vocab_size * pol.hidden_size
    n_pol = matmul_params(tr.models.policy, False)  # LM head (tied embedding) included once
    n_trunk = n_pol - head
    n_crit = matmul_params(tr.models.value, True)
    b = cfg.training.batch_size
    prompt, resp = (statistics.fmean(r["widths"][i] for r in rows if r["widths"]) for i in (0, 1))
    gen = statistics.fmean(r["response_length"] for r in rows) * b  # generated tokens
    attn = lambda layers, ctx: 4 * layers * ctx * pol.hidden_size
    ctx = prompt + resp / 2
    f_sample = b * prompt * (2 * n_trunk + attn(pol.num_hidden_layers, prompt / 2)) + b * 2 * head \
        + gen * (2 * n_pol + attn(pol.num_hidden_layers, ctx))
    tokens = b * (prompt + resp)
    f_actor = tokens * 2 * (2 * n_trunk + 2 * attn(pol.num_hidden_layers, ctx)) + b * resp * 2 * 2 * head
    f_critic = tokens * 2 * (2 * n_crit + 2 * attn(crit.num_hidden_layers, ctx))
    f_old = tokens * (2 * n_crit + attn(crit.num_hidden_layers, ctx))
    dec = rates["decode_mlp"]["gflops"] * 1e9
    upd = rates["update_mlp"]["gflops"] * 1e9
    mean = lambda k: statistics.fmean(r[k] for r in rows if k in r)
    parts = {"sample": (f_sample, dec, "perf/sample_time_s"), "old_outputs": (f_old, upd, "perf/old_outputs_time_s"),
             "actor": (f_actor, upd, "perf/actor_time_s"), "critic": (f_critic, upd, "perf/critic_time_s")}
    out = {name: {"gflop": round(f / 1e9, 1), "bound_s": round(f / rate, 2), "measured_s": round(mean(k), 2),
                  "measured_over_bound": round(mean(k) / (f / rate), 2)} for name, (f, rate, k) in parts.items()}
    # the first update micro-batch's forward runs inside the old-output pass (trainer/first_forward.py): the
    # update's parts are compared together
    f_upd, t_upd = f_old + f_actor + f_critic, sum(mean(k) for k in PARTS[1:4])
    out["update"] = {"gflop": round(f_upd / 1e9, 1), "bound_s": round(f_upd / upd, 2), "measured_s": round(t_upd, 2),
                     "measured_over_bound": round(t_upd / (f_upd / upd), 2)}
    out["sample"]["tokens_per_s"] = round(mean("tokens_per_s"), 1)
    out["sample"]["bound_tokens_per_s"] = round(gen / (f_sample / dec), 1)
    return {"parts": out, "step_s": round(mean("perf/step_time_s"), 2), "params": {"policy_matmul": n_pol, "lm_head": head, "critic_matmul": n_crit},
            "per_step": {"rows": b, "prompt_width": round(prompt, 1), "response_width": round(resp, 1),
                         "generated_tokens": round(gen, 1)}}


def keep_logits_ratio(models, repeats: int = 5) -> dict:
    """Seconds of `response_log_probs` on one micro-batch of 8 rows with and without logits_to_keep."""
    import torch

    from vapo_engine.rollout import experience
    ids = torch.randint(0, min(models.tokenizer.vocab_size, 1000), (8, 160))
    ro = experience.from_token_ids([(list(r[:64]), list(r[64:])) for r in ids.tolist()], 0, torch.device("cpu"),
                                   temperature=1.0)
    real, times = experience.keep_logits, {"kept": [], "all": []}
    try:
        for _ in range(repeats):
            for name, fn in (("kept", real), ("all", lambda model, n: {})):
                experience.keep_logits = fn
                t0 = time.perf_counter()
                with torch.no_grad():
                    experience.response_log_probs(models.policy, ro)
                times[name].append(time.perf_counter() - t0)
    finally:
        experience.keep_logits = real
    kept, full = statistics.median(times["kept"]), statistics.median(times["all"])
    return {"kept_s": round(kept, 4), "all_positions_s": round(full, 4), "speedup": round(full / kept, 2)}


def profile_sampling(tr, rows: int, new_tokens: int = 16) -> dict:
    """torch.profiler over one sampling call of the rollout's shape: the share of CPU time of the top operators
    (is generation bound by its matmuls, or by per-token work around them?)."""
    from torch.profiler import ProfilerActivity, profile

    from vapo_engine.rollout.generate import sample
    prompts = [p.prompt for p in tr.task.heldout(rows)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        sample(tr.models, prompts, max_new_tokens=new_tokens, temperature=1.0, prompt_format=tr.prompts,
               policy_outputs=True)
        wall = time.perf_counter() - t0
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops) or 1
    return {"rows": rows, "new_tokens": new_tokens, "wall_s": round(wall, 2),
            "top_ops": [{"op": e.key, "share": round(e.self_cpu_time_total / total, 3), "calls": e.count}
                        for e in ops[:8]]}


def tiny_models():
    import torch

    from vapo_engine.trainer.models import load_models, resolve_model_path
    return load_models(resolve_model_path(None), value_path=None, need_value=False, reference_path=None,
                       device=torch.device("cpu"), autocast_dtype=None)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    start, t0 = records.load_avg(), time.perf_counter()
    tr, cfg = build(args.set)
    rows = measure_steps(tr, args.steps)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    rates = matmul_rates(cfg.training.batch_size, cfg.micro_batch_size * 160)
    rec = {"preset": "smollm-word", "overrides": args.set, "torch_threads": torch.get_num_threads(),
           "steps": rows, "peak_rss_gib": round(peak_rss, 2), "micro_batch_size": cfg.micro_batch_size, "matmul": rates, **bounds(tr, cfg, rows, rates),
           "sampling_profile": profile_sampling(tr, cfg.training.batch_size),
           "log_probs_keep_logits": {"smollm": keep_logits_ratio(tr.models), "tiny": keep_logits_ratio(tiny_models())},
           "full_finetuning": full_finetuning(args.set, args.full_ft_steps) if args.full_ft_steps else None,
           "wall_s_total": round(time.perf_counter() - t0, 1), "load_avg_start": start,
           "load_avg_end": records.load_avg()}
    path = records.write_record("smollm_speed", rec, records.REPO / args.out if args.out else None)
    for name, part in rec["parts"].items():
        print(f"{name:12} {part['measured_s']:7.2f} s  (bound {part['bound_s']:6.2f} s, {part['gflop']} GFLOP)")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
