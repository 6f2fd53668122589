"""Child process of `scripts/gpu_check.py`: one engine job of a prepared run directory in a process of its own,
so that a crash, an out-of-memory error or a poisoned CUDA context stays inside one check, and the peak memory
it reports is that job's own.

    python -m scripts.gpu_step env   -       OUT.json   # versions, devices, bf16 support, nccl, a bf16 matmul
    python -m scripts.gpu_step value MODEL   OUT_DIR    # MODEL's value model with a random head ("-": built-in)
    python -m scripts.gpu_step train RUN_DIR OUT.json   # the run's `vapo-mcp train` (engine's train(), in-process)
    python -m scripts.gpu_step step  RUN_DIR OUT.pt [RUN_DIR2 OUT2.pt ...]   # one rollout step (of each run in
                                            # turn), rank 0's metrics and synced gradients
    python -m scripts.gpu_step bf16  RUN_DIR OUT.json   # one rollout step + old log-probs under autocast vs fp32

`step` is tests/dist_step.py (plain process or under torchrun, ddp or fsdp as the run's config says) plus, per
rank, `OUT.rank<r>.json` with that rank's peak memory; the gradients are saved on the CPU. Several runs share one
launch (`gpu_check --quick`), each with its own outputs, written as soon as its step is done; the CUDA peak is
reset between them, while the peak RSS is the process's so far. Every mode writes its peak memory:
`torch.cuda.max_memory_allocated` when the job used CUDA, else the process's peak RSS (ru_maxrss).
Checks nothing itself: gpu_check compares and judges.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch


def peak_memory() -> dict:
    """This process's peak memory in MiB: CUDA allocated (and reserved) when CUDA was used, else peak RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        dev = torch.cuda.current_device()
        return {"kind": "cuda", "device": dev, "peak_mib": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1),
                "reserved_mib": round(torch.cuda.max_memory_reserved(dev) / 2**20, 1)}
    return {"kind": "rss", "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, default=float) + "\n", encoding="utf-8")


def _floats(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def env_mode(_: str, out: Path) -> None:
    """Versions and devices, probed here rather than in gpu_check, so that its own process never holds a CUDA
    context (a GPU in exclusive-process mode would refuse every later child)."""
    import platform
    from importlib.metadata import version

    import torch.distributed as dist
    info = {"torch": torch.__version__, "transformers": version("transformers"), "python": platform.python_version(),
            "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0, "devices": [],
            "bf16_supported": None, "nccl_available": dist.is_nccl_available(), "nccl_version": None,
            "bf16_matmul_ok": None}
    if info["cuda_available"]:
        for i in range(info["device_count"]):
            p = torch.cuda.get_device_properties(i)
            info["devices"].append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                                    "capability": f"{p.major}.{p.minor}"})
        info["bf16_supported"] = torch.cuda.is_bf16_supported()
        if info["nccl_available"]:
            v = torch.cuda.nccl.version()
            info["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
        info["bf16_matmul_ok"] = bool(torch.isfinite((a @ a).float()).all())
        torch.cuda.synchronize()
    _write_json(out, info)


def value_mode(model: str, out: Path) -> None:
    """A value-model directory with a random scalar head (`random_head_value_dir`): a parity step then
    has gradients even when every reward of its batch is equal (all-zero gradients would prove nothing)."""
    from bench.lib.runs import random_head_value_dir
    from vapo_engine.trainer.models import resolve_model_path
    random_head_value_dir(resolve_model_path(None if model == "-" else model), out)


def train_mode(run_dir: str, out: Path) -> None:
    from vapo_engine.trainer.loop import train
    t0 = time.perf_counter()
    summary = train(run_dir, log=lambda m: print(m, flush=True))
    _write_json(out, {"summary": summary, "wall_s": round(time.perf_counter() - t0, 2), "memory": peak_memory()})


def step_mode(run_dir: str, out: Path, *more: str) -> None:
    """One rollout step of `run_dir`, then of each further RUN_DIR OUT pair in `more`, in these processes."""
    from vapo_engine.trainer.distributed import shutdown
    world = None
    for run, dest in [(run_dir, out), *zip(more[0::2], map(Path, more[1::2]))]:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        world = _step(run, dest)  # the trainer is dropped here: its process group can go at shutdown
    world.barrier()
    shutdown(world)  # the process then ends without finalizing (see the end of this file)


def _step(run_dir: str, out: Path):
    from vapo_engine.trainer.fsdp import full_grads
    from vapo_engine.trainer.loop import rollout_step
    from vapo_engine.trainer.setup import build_trainer
    tr = build_trainer(run_dir, write=False, log=lambda m: None)
    t0 = time.perf_counter()
    metrics = rollout_step(tr)
    step_s = time.perf_counter() - t0
    grads = full_grads(tr.models.policy)
    vgrads = full_grads(tr.models.value) if tr.models.value is not None else torch.zeros(0)
    if tr.world.is_main:
        torch.save({"metrics": _floats(metrics), "grads": grads, "vgrads": vgrads}, out)
    _write_json(Path(f"{out}.rank{tr.world.rank}.json"), {"rank": tr.world.rank, "world": tr.world.world_size,
                                                          "step_s": round(step_s, 3), "memory": peak_memory()})
    return tr.world


def bf16_mode(run_dir: str, out: Path) -> None:
    """One rollout step with the run's autocast dtype; while its old log-probs are attached, the same rows'
    log-probs are also computed without autocast (fp32 weights) and the two are compared on response tokens."""
    from vapo_engine.rollout.experience import response_log_probs
    from vapo_engine.trainer import batches, loop
    from vapo_engine.trainer.setup import build_trainer
    tr = build_trainer(run_dir, write=False, log=lambda m: None)
    original, diffs = batches.old_outputs, []

    def attach(models, ro, micro, *args, **kw):
        ro, first = original(models, ro, micro, *args, **kw)
        with torch.no_grad():
            fp32 = torch.cat([response_log_probs(models.policy, ro.rows(slice(s, s + micro)))[0]
                              for s in range(0, ro.size, micro)])
        d = (ro.old_log_probs.float() - fp32).abs()[ro.response_mask > 0]
        diffs.append((float(d.mean()), float(d.max()), int(d.numel())))
        return ro, first

    batches.old_outputs = attach
    try:
        t0 = time.perf_counter()
        metrics = _floats(loop.rollout_step(tr))
        step_s = time.perf_counter() - t0
    finally:
        batches.old_outputs = original
    n = sum(t for _, _, t in diffs)
    _write_json(out, {"autocast": str(tr.models.autocast_dtype), "device": str(tr.models.device),
                      "step_s": round(step_s, 3), "metrics": metrics,
                      "logprob_abs_diff_mean": sum(m * t for m, _, t in diffs) / max(n, 1),
                      "logprob_abs_diff_max": max((x for _, x, _ in diffs), default=0.0), "tokens": n,
                      "memory": peak_memory()})


MODES = {"env": env_mode, "value": value_mode, "train": train_mode, "step": step_mode, "bf16": bf16_mode}

if __name__ == "__main__":
    mode, run, dest, *rest = sys.argv[1:]
    MODES[mode](run, Path(dest), *rest)  # only `step` takes more (RUN_DIR OUT pairs)
    # Every output is written and closed: end without interpreter finalization, during which a process group
    # that fsdp's DTensor caches keep alive past destroy_process_group would be torn down, and a gloo worker that
    # still releases a collective's tensors aborts the rank (vapo_engine.trainer.distributed.end_rank)
    from vapo_engine.trainer.distributed import end_rank
    end_rank(0)
