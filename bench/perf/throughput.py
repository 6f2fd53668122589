"""Throughput of one VAPO rollout step with the built-in policy + value models on this machine (docs/results.md "Throughput of one VAPO step").

Measures in one run: (1) the machine's matmul peak (torch.matmul, fp32 and bf16, square sizes 256–2048, plus
one matmul of the model's own MLP shape), (2) for each dtype setting, full VAPO rollout steps of the cpu-demo
recipe (128 responses = 16 prompts x 8, 4 updates of 32): generation tokens/s, update samples/s, step time,
and the update's achieved FLOP/s as a fraction of the measured peak.

FLOP estimate (stated in the record): a forward pass costs 2 x N_matmul FLOPs per processed token and a
forward+backward 6 x N_matmul, where N_matmul counts the weights used in matmuls (the tied embedding counts
once, as the LM head of the policy; the value model's embedding is only a lookup, its head is hidden x 1);
attention scores add 4 x layers x seq x hidden per token forward (x3 with backward). Processed tokens are
all positions of the padded (prompt + response) batch, as the models see them. Update = fwd+bwd of policy and
value on each mini-batch + fwd+bwd of the policy on replayed positives. Update samples/s = responses of the
rollout x ppo_epochs / update time (the engine's `perf/update_samples_per_s` multiplies the whole rollout by
the number of mini-batch updates, i.e. over-counts by mini-batches per rollout; it is kept as
`engine_metric_update_samples_per_s`).

Repeats are interleaved (fp32, bf16, fp32, bf16, ...: `--repeats` rounds over the dtypes, a fresh trainer each),
so a change in the machine's load hits every setting alike; the record keeps every repeat, the tables show the
median with the range, and the bf16/fp32 ratio is taken within each round.

    .venv/bin/python -m bench.perf.throughput    # ~2-3 min on 2 idle cores
    .venv/bin/python -m bench.perf.throughput --smoke --out /tmp/x
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.lib import plots, records
from bench.lib.runs import PRESET, SMOKE_OVERRIDES, load_bench_config, settings_with_seed


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warmup", type=int, default=2, help="rollout steps not measured")
    p.add_argument("--steps", type=int, default=6, help="measured rollout steps per dtype (4 updates each)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="model.dtype settings to measure")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds over the dtypes")
    p.add_argument("--smoke", action="store_true", help="tiny run (seconds) to check the script works")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    return p.parse_args(argv)


def _time_matmul(a: torch.Tensor, b: torch.Tensor, min_s: float) -> float:
    """Seconds per a @ b, best of repeated timed loops."""
    for _ in range(2):
        a @ b
    best, reps = float("inf"), 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        dt = time.perf_counter() - t0
        best = min(best, dt / reps)
        if dt >= min_s:
            return best
        reps *= 2


def matmul_peak(sizes: tuple[int, ...], shape: tuple[int, int, int], min_s: float) -> dict:
    """GFLOP/s of torch.matmul per dtype and size, the best per dtype, and the model-shape matmul."""
    out: dict = {"square": {}, "peak_gflops": {}, "model_shape": {"m_k_n": list(shape)}}
    for dt_name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        res = {}
        for n in sizes:
            a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
            res[n] = round(2 * n ** 3 / _time_matmul(a, b, min_s) / 1e9, 2)
        out["square"][dt_name] = res
        out["peak_gflops"][dt_name] = max(res.values())
        m, k, n = shape
        a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
        out["model_shape"][dt_name] = round(2 * m * k * n / _time_matmul(a, b, min_s) / 1e9, 2)
    return out


def matmul_params(model, value: bool) -> int:
    """Weights used in matmuls: all but norms; the tied embedding counts as the policy's LM head only."""
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n)
    return total - emb.numel() if value else total


class Counter:
    """Wraps the loop's update_step and the old-output pass (trainer/batches.py `old_outputs`) to count processed
    token positions."""

    def __init__(self, loop, batches):
        self.loop, self.batches, self.update_pos, self.replay_pos, self.old_pos, self.seq = loop, batches, 0, 0, 0, []
        self._upd, self._old = loop.update_step, batches.old_outputs
        loop.update_step, batches.old_outputs = self._update, self._attach

    def _update(self, models, oa, oc, mini, replay, spec, **kw):
        self.update_pos += mini.input_ids.numel()
        self.replay_pos += replay.input_ids.numel() if replay is not None else 0
        self.seq.append(mini.input_ids.shape[1])
        return self._upd(models, oa, oc, mini, replay, spec, **kw)

    def _attach(self, models, ro, *args, **kw):
        self.old_pos += ro.input_ids.numel()
        return self._old(models, ro, *args, **kw)

    def reset(self):
        self.update_pos = self.replay_pos = self.old_pos = 0
        self.seq = []

    def close(self):
        self.loop.update_step, self.batches.old_outputs = self._upd, self._old


def measure_steps(dtype: str, warmup: int, steps: int, extra: tuple[str, ...]) -> dict:
    """Warm up, then time `steps` full VAPO rollout steps; token counts from the Counter."""
    from vapo_engine.runs import create_run
    from vapo_engine.trainer import batches, loop
    from vapo_engine.trainer.setup import build_trainer
    config, overrides = load_bench_config("vapo", (f"model.dtype={dtype}", "training.total_steps=100000",
                                                           *extra))
    with tempfile.TemporaryDirectory(prefix="vapo-bench-") as tmp:
        info = create_run(config, settings_with_seed(1), Path(tmp), run_id=f"throughput-{dtype}")
        tr = build_trainer(info.run_dir, write=False, log=lambda s: None)
    counter = Counter(loop, batches)
    try:
        for _ in range(warmup):
            loop.rollout_step(tr)
        counter.reset()
        ms = [loop.rollout_step(tr) for _ in range(steps)]
    finally:
        counter.close()
    return {"dtype": dtype, "overrides": overrides, "per_step": [_step_row(m) for m in ms],
            "update_positions": counter.update_pos, "replay_positions": counter.replay_pos,
            "old_output_positions": counter.old_pos, "mean_seq_len": sum(counter.seq) / max(1, len(counter.seq)),
            "policy_matmul_params": matmul_params(tr.models.policy, False),
            "value_matmul_params": matmul_params(tr.models.value, True),
            "total_params": {"policy": sum(p.numel() for p in tr.models.policy.parameters()),
                             "value": sum(p.numel() for p in tr.models.value.parameters())},
            "model_config": {k: getattr(tr.models.policy.config, k) for k in
                             ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")},
            "batch": config.training.batch_size, "mini_batch": config.mini_batch_size,
            "ppo_epochs": config.training.ppo_epochs}


def _step_row(m: dict) -> dict:
    keys = ("perf/step_time_s", "perf/rollout_time_s", "perf/update_time_s", "rollout/tokens_per_s",
            "perf/update_samples_per_s", "rollout/response_length")
    return {k: round(float(m[k]), 4) for k in keys if k in m}


def flops_summary(run: dict, peak: dict) -> dict:
    """Estimated update FLOPs and achieved FLOP/s vs the measured peaks (see the module docstring)."""
    mean = lambda k: sum(r[k] for r in run["per_step"]) / len(run["per_step"])
    cfg, n = run["model_config"], len(run["per_step"])
    attn = 4 * cfg["num_hidden_layers"] * run["mean_seq_len"] * cfg["hidden_size"]  # fwd FLOPs per token
    pol, val = run["policy_matmul_params"], run["value_matmul_params"]
    upd = (6 * (pol + val + 2 * attn) * run["update_positions"] + 6 * (pol + attn) * run["replay_positions"])
    upd_time = mean("perf/update_time_s") * n
    achieved = upd / upd_time
    peak_run = peak["peak_gflops"]["float32" if run["dtype"] == "float32" else "bfloat16"] * 1e9
    return {"update_flops_per_rollout_step": upd / n, "update_gflops_achieved": round(achieved / 1e9, 3),
            "fraction_of_peak_same_dtype": round(achieved / peak_run, 5),
            "fraction_of_fp32_peak": round(achieved / (peak["peak_gflops"]["float32"] * 1e9), 5),
            "fraction_of_model_shape_matmul": round(achieved / (peak["model_shape"]["float32"] * 1e9), 5),
            "old_outputs_flops_per_rollout_step": 2 * (pol + val + 2 * attn) * run["old_output_positions"] / n,
            "step_time_s": round(mean("perf/step_time_s"), 3), "rollout_time_s": round(mean("perf/rollout_time_s"), 3),
            "update_time_s": round(mean("perf/update_time_s"), 3),
            "rollout_tokens_per_s": round(mean("rollout/tokens_per_s"), 1),
            "update_samples_per_s": round(run["batch"] * run["ppo_epochs"] / mean("perf/update_time_s"), 1),
            "engine_metric_update_samples_per_s": round(mean("perf/update_samples_per_s"), 1),
            "response_length": round(mean("rollout/response_length"), 2)}


def median_summary(rows: list[dict]) -> dict:
    """Per metric: the median over the repeats, with the range (`<metric>_range`)."""
    import statistics
    out = {}
    for k in rows[0]:
        vals = [r[k] for r in rows]
        out[k] = round(statistics.median(vals), 4)
        out[f"{k}_range"] = [round(min(vals), 4), round(max(vals), 4)]
    return out


def plot(path: Path, peak: dict, summaries: dict) -> None:
    plt = plots.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(summaries)
    gen = [summaries[d]["rollout_time_s"] for d in names]
    upd = [summaries[d]["update_time_s"] for d in names]
    a1.bar(names, gen, label="rollout (generate + old log-probs/values + GAE)")
    a1.bar(names, upd, bottom=gen, label="updates (4 mini-batches)")
    a1.set_ylabel("seconds per rollout step (128 responses)")
    a1.legend(fontsize=7)
    bars = {"fp32 peak": peak["peak_gflops"]["float32"], "bf16 peak": peak["peak_gflops"]["bfloat16"],
            "fp32 model-shape": peak["model_shape"]["float32"]}
    bars.update({f"update ({d})": summaries[d]["update_gflops_achieved"] for d in names})
    a2.bar(list(bars), list(bars.values()), color=["C0", "C0", "C1", *(["C2"] * len(names))])
    a2.set_ylabel("GFLOP/s")
    a2.tick_params(axis="x", labelsize=7, rotation=20)
    fig.suptitle("VAPO step throughput, built-in tiny policy + value models, this CPU", fontsize=10)
    plots.save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t0, load0 = time.time(), records.load_avg()
    sizes, min_s = ((128, 256), 0.02) if args.smoke else ((256, 512, 1024, 2048), 0.5)
    extra = SMOKE_OVERRIDES if args.smoke else ()
    warmup, steps = (1, 1) if args.smoke else (args.warmup, args.steps)
    dtypes = [x for x in args.dtypes.split(",") if x]
    rounds = [{d: measure_steps(d, warmup, steps, extra) for d in dtypes} for _ in range(1 if args.smoke else
                                                                                          args.repeats)]
    r0 = rounds[0][dtypes[0]]
    shape = (r0["mini_batch"] // 4 * int(r0["mean_seq_len"]), r0["model_config"]["hidden_size"],
             r0["model_config"]["intermediate_size"])  # one micro-batch through the MLP up-projection
    peak = matmul_peak(sizes, shape, min_s)
    per_round = [{d: flops_summary(r, peak) for d, r in rnd.items()} for rnd in rounds]
    summaries = {d: median_summary([p[d] for p in per_round]) for d in dtypes}
    ratios = [p[dtypes[-1]]["step_time_s"] / p[dtypes[0]]["step_time_s"] for p in per_round]
    record = {"config": {"preset": PRESET, "variant": "vapo", "warmup_steps": warmup, "measured_steps": steps,
                         "repeats": len(rounds), "order": "interleaved", "smoke": args.smoke,
                         "extra_overrides": list(extra)},
              "step_time_ratio": {"of": f"{dtypes[-1]} / {dtypes[0]}", "per_round": [round(x, 3) for x in ratios]},
              "per_round": per_round,
              "flop_estimate": __doc__.split("FLOP estimate (stated in the record): ")[1].split("\n\n")[0],
              "wall_s_total": round(time.time() - t0, 1), "load_avg_start": load0, "load_avg_end": records.load_avg(),
              "matmul_peak": peak, "summary": summaries, "runs": rounds}
    path = records.write_record("throughput", record, Path(args.out) if args.out else None)
    plot(path.with_suffix(".png"), peak, summaries)
    print(f"matmul peak GFLOP/s: {peak['peak_gflops']}, model-shape {shape}: {peak['model_shape']}")
    for d, s in summaries.items():
        print(f"{d}: step {s['step_time_s']} s (rollout {s['rollout_time_s']} + update {s['update_time_s']}), "
              f"rollout {s['rollout_tokens_per_s']} tok/s, update {s['update_samples_per_s']} samples/s, "
              f"update {s['update_gflops_achieved']} GFLOP/s = {100 * s['fraction_of_peak_same_dtype']:.2f}% of "
              f"the {d} peak, {100 * s['fraction_of_fp32_peak']:.2f}% of fp32 peak")
    print(f"wrote {path} and {path.with_suffix('.png')} in {record['wall_s_total']:.0f} s")
    return record


if __name__ == "__main__":
    main()
