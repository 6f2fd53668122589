"""Memory per rank of one VAPO rollout step: DDP vs FSDP2 vs LoRA on 2 CPU processes (gloo) (docs/scale-out.md, docs/results.md "Memory per rank").

One random-init Qwen2 with the built-in char tokenizer (default hidden 768, 8 layers ≈ 75 M parameters, so
weights and optimizer states dwarf the activations of a tiny batch: 4 responses of ≤ 8 tokens), one run
directory per strategy (config.toml + cpu-demo + the bench's overrides), and for each strategy two rollout
steps (sample → values → GAE → one AdamW step of policy and critic each; no value pretraining; the first step
allocates the AdamW states, the second is the steady state) under
`python -m torch.distributed.run --standalone --nproc_per_node=2`, a launch per strategy (--smoke: one launch
runs them in turn). The reward is the parity of the lengths
(`ParityReward`), so the untrained model gets non-zero gradients. Strategies:
  ddp   full fine-tuning, replicated models, gradients SUM-all-reduced (distributed.strategy = "ddp")
  fsdp  full fine-tuning, FSDP2 `fully_shard` per block (distributed.strategy = "fsdp")
  lora  peft adapters on policy and value trunk (+ the value head), ddp strategy (lora.enabled = true)

Each rank reports, for the policy and the value model separately, the bytes held in tensors after step 2,
counted from the live objects (a DTensor counts its local shard): parameters (frozen / trained), gradients,
AdamW states (`opt.state`); and its resident memory from /proc/self/status: the RSS right after the imports
(the Python/torch baseline), after building the trainer and after each step, and the peak (VmHWM = ru_maxrss)
of the setup and of each step (reset in between through /proc/self/clear_refs). Tensor counts are
exact and free of allocator noise; the RSS is what the OS saw (transient buffers, the full model each rank
loads before sharding, page-cache-backed reads of the weights files).

Extrapolation (stated in the record): the measured bytes per parameter of each model (weights + gradients +
AdamW states; for fsdp summed over the ranks; for lora split into frozen weights and trained adapter states),
applied to the shapes of Qwen2.5-7B and Qwen2.5-32B (policy = the causal LM, value = the same trunk with a scalar head; parameter counts
from the configs, on the meta device), at 1, 2 and 8 ranks: ddp does not divide by the world size, fsdp
divides everything by it, lora keeps the frozen fp32 weights on every rank plus the adapter states (adapter
count = r × (in + out) of every trunk linear, at the run's lora.r). The bf16-on-CUDA case is arithmetic only.

    .venv/bin/python -m bench.perf.memory    # ~2-3 min on 2 busy cores
    .venv/bin/python -m bench.perf.memory --smoke --out /tmp/x
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import plots, records
from bench.lib.runs import PRESET, load_bench_config, reward_parity, settings_with_seed

STRATEGIES = {"ddp": ['distributed.strategy="ddp"'], "fsdp": ['distributed.strategy="fsdp"'],
              "lora": ['distributed.strategy="ddp"', "lora.enabled=true"]}
RUN_OVERRIDES = ("training.batch_size=4", "vapo.group_size=2", "training.mini_batch_size=4",
                 "training.micro_batch_size=2", "model.max_tokens=8", "training.total_steps=2",
                 "distributed.nproc_per_node=2", "eval.num_problems=4", "eval.samples_per_problem=1")
WORLD = 2
TARGETS = {  # Hugging Face configs of Qwen/Qwen2.5-7B and Qwen/Qwen2.5-32B (the shapes that matter here)
    "Qwen2.5-7B": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False},
    "Qwen2.5-32B": {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
                    "tie_word_embeddings": False}}
WORLDS = (1, 2, 8)
MiB, GiB = 2 ** 20, 2 ** 30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated: ddp,fsdp,lora")
    p.add_argument("--smoke", action="store_true", help="tiny model (seconds per strategy) to check the script")
    p.add_argument("--out", default=None, help="output folder (default bench/results)")
    p.add_argument("--worker", nargs=2, action="append", metavar=("RUN_DIR", "OUT_DIR"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- the worker: one rank of one strategy ------------------------------------------------------------------

def _status() -> dict:
    """Resident and peak resident memory of this process, in bytes (/proc/self/status VmRSS, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def _reset_peak() -> bool:
    """Reset VmHWM (and with it ru_maxrss) to the current RSS (Linux ≥ 4.0); False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _nbytes(t) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor (FSDP2): this rank's shard only
    return t.numel() * t.element_size()


def count_tensors(model, opt) -> dict:
    """Bytes this rank holds in the model's parameters, gradients and optimizer states; parameter counts are
    full (unsharded) counts."""
    import torch
    params = list(model.parameters())
    trained = [p for p in params if p.requires_grad]
    states = [v for s in (opt.state.values() if opt is not None else ()) for v in s.values() if torch.is_tensor(v)]
    return {"params": sum(p.numel() for p in params), "trained_params": sum(p.numel() for p in trained),
            "param_bytes": sum(_nbytes(p) for p in params),
            "trained_param_bytes": sum(_nbytes(p) for p in trained),
            "buffer_bytes": sum(_nbytes(b) for b in model.buffers()),
            "grad_bytes": sum(_nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer_bytes": sum(_nbytes(v) for v in states)}


def worker(jobs: list[list[str]]) -> None:
    """One rank: each (run dir, out dir) of `jobs` in turn, in one process group. The benchmark gives each
    strategy a launch of its own (every rank's RSS starts clean); --smoke gives all of them to one launch."""
    import torch  # noqa: F401  (the baseline includes torch, transformers, peft and the trainer)
    import transformers  # noqa: F401
    try:
        import peft  # noqa: F401
    except ImportError:
        pass
    from vapo_engine.trainer.distributed import shutdown
    from vapo_engine.trainer.loop import rollout_step  # noqa: F401  (in the baseline too)
    from vapo_engine.trainer.setup import build_trainer  # noqa: F401
    base = _status()["VmRSS"]
    for i, (run_dir, out_dir) in enumerate(jobs):
        world = _measure(run_dir, out_dir, base, later=i > 0)
    shutdown(world)


def _measure(run_dir: str, out_dir: str, base: int, later: bool):
    """Build the trainer of `run_dir`, take two rollout steps, write this rank's record to `out_dir`; returns the
    world. `later`: an earlier strategy ran in this process (the peak is reset before the setup too)."""
    import gc

    from vapo_engine.trainer.loop import rollout_step
    from vapo_engine.trainer.setup import build_trainer
    rss = {"after_imports": base}
    if later:  # the earlier strategy's trainer is gone; where the peak cannot be reset, it includes that one's
        gc.collect()
        _reset_peak()
    t0 = time.perf_counter()
    tr = build_trainer(run_dir, write=False, log=lambda m: None)
    reward_parity(tr)  # non-zero gradients for an untrained model
    setup_s = round(time.perf_counter() - t0, 2)
    st = _status()
    rss["after_setup"], peak = st["VmRSS"], {"setup": st["VmHWM"]}
    steps_s = []
    for name in ("first_step", "step"):  # the first step allocates the AdamW states; the second is steady state
        reset = _reset_peak()
        t1 = time.perf_counter()
        metrics = rollout_step(tr)
        steps_s.append(round(time.perf_counter() - t1, 2))
        st = _status()
        rss[f"after_{name}"], peak[name] = st["VmRSS"], st["VmHWM"] if reset else None
    models = {"policy": count_tensors(tr.models.policy, tr.opt_actor),
              "value": count_tensors(tr.models.value, tr.opt_critic)}
    rec = {"rank": tr.world.rank, "world": tr.world.world_size, "rss": rss, "peak": peak, "peak_reset": reset,
           "setup_s": setup_s, "step_s": steps_s, "models": models,
           "metrics": {k: metrics.get(k) for k in ("actor/grad_norm", "critic/grad_norm", "rollout/reward_mean",
                                                          "rollout/response_length")}}
    Path(out_dir, f"rank{tr.world.rank}.json").write_text(json.dumps(rec, indent=2))
    tr.world.barrier()
    return tr.world


# --- the parent: runs, launches, summary, extrapolation -------------------------------------------------------

def make_runs(tmp: Path, model_dir: Path, strategies: list[str], seed: int = 1) -> dict[str, Path]:
    from vapo_engine.runs import create_run
    runs = {}
    for s in strategies:
        extra = (*RUN_OVERRIDES, f'model.local_path="{model_dir}"', *STRATEGIES[s])
        config, overrides = load_bench_config("vapo", extra)
        runs[s] = create_run(config, settings_with_seed(seed), tmp / "runs", run_id=s, overrides=overrides,
                             preset=PRESET).run_dir
    return runs


def launch(jobs: list[tuple[Path, Path]]) -> list[dict]:
    """Strategies under one torchrun (2 gloo processes), each (run dir, out dir) of `jobs` in turn; per job its
    per-rank records, or the error's tail (the launch's wall time is every job's)."""
    for _, out_dir in jobs:
        out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
           "-m", "bench.perf.memory", *[x for run, out in jobs for x in ("--worker", str(run), str(out))]]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=False, env=env, cwd=records.REPO, capture_output=True, text=True, timeout=900)
    wall = round(time.perf_counter() - t0, 1)
    if r.returncode != 0:
        return [{"ok": False, "wall_s": wall, "error": (r.stderr[-6000:] + r.stdout[-2000:]).strip()}] * len(jobs)
    return [{"ok": True, "wall_s": wall, "ranks": [json.loads((out / f"rank{i}.json").read_text())
                                                   for i in range(WORLD)]} for _, out in jobs]


def rank_row(strategy: str, r: dict) -> dict:
    """One table row: this rank's tensor bytes by kind, bytes per model parameter, RSS above the baseline."""
    m = r["models"].values()
    n = sum(x["params"] for x in m)
    parts = {k: sum(x[f"{k}_bytes"] for x in m) for k in ("param", "grad", "optimizer", "buffer")}
    total = parts["param"] + parts["grad"] + parts["optimizer"]
    base, peaks = r["rss"]["after_imports"], [v for v in r["peak"].values() if v is not None]
    return {"strategy": strategy, "rank": r["rank"], "model_params": n, **{f"{k}_bytes": v for k, v in parts.items()},
            "tensor_bytes": total, "bytes_per_param": round(total / n, 3), "baseline_rss": base,
            "peak_rss_minus_baseline": max(peaks) - base,
            "setup_peak_minus_baseline": r["peak"]["setup"] - base,
            **{f"{k}_peak_minus_baseline": None if r["peak"][k] is None else r["peak"][k] - base
               for k in ("first_step", "step")},
            "rss_after_step_minus_baseline": r["rss"]["after_step"] - base}


def per_param(ranks: list[dict]) -> dict:
    """Measured bytes per parameter, per model: per rank (mean over ranks) and summed over ranks; for the
    frozen weights and for the trained parameters' weights + gradients + AdamW states."""
    out = {}
    for name in ("policy", "value"):
        ms = [r["models"][name] for r in ranks]
        n, k = ms[0]["params"], ms[0]["trained_params"]
        frozen = [m["param_bytes"] - m["trained_param_bytes"] for m in ms]
        trained = [m["trained_param_bytes"] + m["grad_bytes"] + m["optimizer_bytes"] for m in ms]
        total = [f + t for f, t in zip(frozen, trained)]
        out[name] = {"params": n, "trained_params": k,
                     "per_rank": round(sum(total) / len(ms) / n, 4), "all_ranks": round(sum(total) / n, 4),
                     "frozen_per_frozen_param": round(sum(frozen) / len(ms) / (n - k), 4) if n > k else None,
                     "state_per_trained_param": round(sum(trained) / len(ms) / k, 4) if k else None}
    return out


def target_counts(lora_r: int) -> dict:
    """Parameter counts of the target models' policy and value model (meta device), and their LoRA adapter
    counts at rank `lora_r` on every trunk linear (the value head trains in full)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification
    out = {}
    for name, shape in TARGETS.items():
        with torch.device("meta"):
            policy = Qwen2ForCausalLM(Qwen2Config(**shape))
            value = Qwen2ForTokenClassification(Qwen2Config(**shape, num_labels=1))
        linears = [m for m in policy.model.layers.modules() if isinstance(m, torch.nn.Linear)]
        adapters = lora_r * sum(m.in_features + m.out_features for m in linears)
        layer = sum(p.numel() for p in policy.model.layers[0].parameters())
        # untied embeddings and LM head are FSDP units of their own (trainer/fsdp.py): the largest one is what
        # stays unsharded outside the blocks
        root = max(policy.get_input_embeddings().weight.numel(), policy.get_output_embeddings().weight.numel())
        out[name] = {"policy": sum(p.numel() for p in policy.parameters()),
                     "value": sum(p.numel() for p in value.parameters()), "lora_adapters_per_model": adapters,
                     "value_head": shape["hidden_size"] + 1, "block_params": layer, "policy_root_params": root}
    return out


def extrapolate(measured: dict, targets: dict) -> list[dict]:
    """GiB per rank of policy + value (weights, gradients, AdamW states) at each world size, from the measured
    bytes per parameter: ddp replicates, fsdp divides the all-rank total by W, lora replicates frozen weights
    plus the adapter states."""
    rows = []
    for model, t in targets.items():
        for s, bpp in measured.items():
            for w in WORLDS:
                if s == "fsdp":
                    b = sum(bpp[m]["all_ranks"] * t[m] for m in ("policy", "value")) / w
                elif s == "lora":
                    adapters = 2 * t["lora_adapters_per_model"] + t["value_head"]
                    frozen = sum(bpp[m]["frozen_per_frozen_param"] * t[m] for m in ("policy", "value"))
                    b = frozen + bpp["policy"]["state_per_trained_param"] * adapters
                else:
                    b = sum(bpp[m]["per_rank"] * t[m] for m in ("policy", "value"))
                rows.append({"model": model, "strategy": s, "world": w, "gib_per_rank": round(b / GiB, 1)})
    return rows


def bf16_arithmetic(targets: dict) -> dict:
    """Per-rank GiB on CUDA with model.dtype = bfloat16 — arithmetic, not measured (no GPU was used)."""
    out = {}
    for model, t in targets.items():
        n = t["policy"] + t["value"]
        # the largest unit outside the blocks (the LM head: untied, its own unit) stays unsharded in bf16 from its
        # forward to its backward; at its reduce-scatter: bf16 gradients + the fp32 input; + ~2 bf16 blocks
        transient = 8 * t["policy_root_params"] + 2 * 2 * t["block_params"]
        out[model] = {"fsdp_persistent": {w: round(16 * n / w / GiB, 1) for w in WORLDS},
                      "fsdp_transient_up_to": round(transient / GiB, 1),
                      "ddp_persistent": round(16 * n / GiB, 1), "ddp_transient_flat_grads": round(4 * t["policy"] / GiB, 1),
                      "autocast_bf16_weight_copies_up_to": round(2 * t["policy"] / GiB, 1),
                      "lora_frozen_fp32": round(4 * n / GiB, 1), "lora_if_bf16_base": round(2 * n / GiB, 1)}
    return out


BF16_NOTE = (
    "Arithmetic, not measured (no GPU was used). FSDP2 with MixedPrecisionPolicy(param bf16, reduce fp32) keeps "
    "fp32 sharded master weights, fp32 gradient shards and fp32 AdamW states: 16/W B per parameter of each trained "
    "model; only the unsharded compute copy is bf16. On top of that, transiently (an upper bound): about two "
    "unsharded bf16 blocks at a time, and the largest unit outside the blocks — the LM head (untied, 152k "
    "vocabulary in Qwen2.5; the input embedding and the LM head are FSDP units of their own) — which stays "
    "unsharded from its forward to its backward and whose reduce-scatter holds its bf16 gradients plus an fp32 "
    "copy, ≈ 8 B per LM-head parameter. DDP here keeps fp32 weights and autocasts: 16 B per "
    "parameter on every rank, plus a flat fp32 copy of one model's gradients during the all-reduce and autocast's "
    "bf16 weight copies kept for backward (up to 2 B per parameter). LoRA: the engine loads the frozen base in "
    "fp32 (4 B per parameter on every rank); a bf16 base would halve that, but the engine does not load one. A "
    "KL reference model (kl_coef > 0, full fine-tuning) adds 4 B per policy parameter (÷ W under fsdp); with "
    "LoRA it costs nothing. Activations (long responses) come on top of all of this.")


# --- output --------------------------------------------------------------------------------------------------

def _mib(x) -> str:
    return "—" if x is None else f"{x / MiB:.0f}"


def print_table(rows: list[dict]) -> None:
    print(f"{'strategy':8} {'rank':>4} {'params MiB':>10} {'grads MiB':>10} {'optim MiB':>10} {'tensors MiB':>11} "
          f"{'B/param':>8} {'peak RSS-base MiB':>17} {'(setup / step 1 / step 2)':>26} {'base MiB':>9}")
    for r in rows:
        phases = " / ".join(_mib(r[f"{k}_peak_minus_baseline"]) for k in ("setup", "first_step", "step"))
        print(f"{r['strategy']:8} {r['rank']:>4} {r['param_bytes'] / MiB:>10.1f} {r['grad_bytes'] / MiB:>10.1f} "
              f"{r['optimizer_bytes'] / MiB:>10.1f} {r['tensor_bytes'] / MiB:>11.1f} {r['bytes_per_param']:>8.2f} "
              f"{r['peak_rss_minus_baseline'] / MiB:>17.0f} {phases:>26} {r['baseline_rss'] / MiB:>9.0f}")


def print_extrapolation(rows: list[dict]) -> None:
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = {(r["strategy"], r["world"]): r["gib_per_rank"] for r in rows if r["model"] == model}
        strategies = list(dict.fromkeys(s for s, _ in cells))
        print(f"{model} policy + value, GiB per rank (weights + grads + AdamW): " + "; ".join(
            f"{s}: " + ", ".join(f"{w} rank{'s' if w > 1 else ''} {cells[s, w]}" for w in WORLDS) for s in strategies))


def plot(path: Path, rows: list[dict]) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    labels = [f"{r['strategy']}\nrank {r['rank']}" for r in rows]
    bottom = [0.0] * len(rows)
    for key, name in (("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_bytes", "AdamW states")):
        vals = [r[key] / MiB for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(labels, [r["peak_rss_minus_baseline"] / MiB for r in rows], "k_", ms=28, mew=2,
            label="peak RSS − baseline")
    ax.set_ylabel("MiB per rank")
    ax.legend(fontsize=8)
    ax.set_title("Tensor memory per rank after the second VAPO step (policy + value), 2 gloo processes",
                 fontsize=10)
    plots.save(fig, path)


def launches(strategies: list[str], smoke: bool) -> list[list[str]]:
    """The strategies of each torchrun launch: one launch each (clean RSS per strategy); --smoke: one for all
    (the tensor counts are exact either way; a smoke's RSS numbers are not measurements)."""
    return [strategies] if smoke else [[s] for s in strategies]


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker)
    from vapo_engine.builtin_model import make_model_dir
    t0, load0 = time.time(), records.load_avg()
    hidden, layers, heads = (64, 2, 2) if args.smoke else (args.hidden, args.layers, args.heads)
    strategies = [s for s in args.strategies.split(",") if s]
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="vapo-bench-memory-") as tmp:
        model_dir = make_model_dir(Path(tmp) / "model", hidden=hidden, layers=layers, heads=heads, seed=0)
        runs = make_runs(Path(tmp), model_dir, strategies)
        lora_r = json.loads((runs[strategies[0]] / "config.json").read_text())["lora"]["r"]
        for group in launches(strategies, args.smoke):
            print(f"{', '.join(group)}: two rollout steps on {WORLD} processes …", flush=True)
            for s, res in zip(group, launch([(runs[s], Path(tmp) / "out" / s) for s in group])):
                results[s] = res
                if not res["ok"]:
                    print(f"{s} FAILED:\n{res['error']}", file=sys.stderr)
                    continue
                rows += [rank_row(s, r) for r in res["ranks"]]
    measured = {s: per_param(r["ranks"]) for s, r in results.items() if r["ok"]}
    targets = target_counts(lora_r)
    record = {"config": {"smoke": args.smoke, "preset": PRESET, "world_size": WORLD, "backend": "gloo",
                         "model": {"hidden": hidden, "layers": layers, "heads": heads,
                                   **({f"{m}_params": v[m]["params"] for v in list(measured.values())[:1]
                                       for m in ("policy", "value")})},
                         "overrides": list(RUN_OVERRIDES), "strategies": {s: STRATEGIES[s] for s in strategies},
                         "lora_r": lora_r, "launches": launches(strategies, args.smoke),
                         "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1 (set by the bench)")},
              "extrapolation_method": __doc__.split("Extrapolation (stated in the record): ")[1].split("\n\n")[0],
              "wall_s_total": round(time.time() - t0, 1), "load_avg_start": load0, "load_avg_end": records.load_avg(),
              "rows": rows, "bytes_per_param": measured, "targets": targets,
              "extrapolation": extrapolate(measured, targets), "bf16_cuda_arithmetic": bf16_arithmetic(targets),
              "bf16_note": BF16_NOTE, "runs": results}
    path = records.write_record("memory", record, Path(args.out) if args.out else None)
    if rows:
        plot(path.with_suffix(".png"), rows)
    print_table(rows)
    print_extrapolation(record["extrapolation"])
    print(f"wrote {path} in {record['wall_s_total']:.0f} s")
    return record


if __name__ == "__main__":
    main()
