"""Preflight checks of what a run consumes: memory per rank, disk for checkpoints, CPU threads.

Memory: the measured bytes per parameter (sizes.bytes_per_param) applied to the model's parameter counts for
the run's strategy, against one accelerator's memory (or, on CPU, the RAM all ranks of the node share). Disk:
one checkpoint × (the kept ones + the one being written) against the free space under the log dir.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from vapo_engine.jobs.threads import THREAD_VARS, max_concurrent, worker_env

from .findings import Finding, error, info, warning
from .host import GiB, Host
from .sizes import Shape, bytes_per_param, checkpoint_bytes, memory_need

CHECKPOINTS_KEPT = 2
"""Complete checkpoints a run keeps (trainer/checkpoint.py `save_checkpoint(keep=2)`); one more exists while
the newest is written."""
HEADROOM = 0.8
"""Weights and optimizer states above this share of the budget leave too little room for activations."""


def _gib(n: float) -> float:
    return round(n / GiB, 2)


def _size(n: float) -> str:
    """Bytes in words: GiB from 1 GiB up, MiB below."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 1024 ** 2:.0f} MiB"


def memory_findings(cfg, shape: Shape, host: Host) -> list[Finding]:
    """Per-rank memory of the run's strategy against the accelerator (or the node's RAM)."""
    bpp, origin = bytes_per_param()
    need = memory_need(cfg, shape, bpp)
    nproc = cfg.distributed.nproc_per_node
    gpu = host.memory_kind == "gpu"
    used = need.per_rank if gpu else need.per_rank * nproc
    budget = host.memory_bytes or 0
    ev = {"policy_params": shape.policy, "value_params": shape.value if cfg.decisions.uses_critic else 0,
          "strategy": need.strategy, "world_size": cfg.distributed.world_size, "precision": cfg.model.dtype,
          "bytes_per_param": need.bytes_per_param, "bytes_per_param_from": origin,
          "need_gib_per_rank": _gib(need.per_rank), "budget_gib": _gib(budget),
          "budget_of": "one GPU" if gpu else f"RAM shared by {nproc} rank(s)"}
    out = []
    if gpu and host.gpus is not None and host.gpus < nproc:
        out.append(error("memory", f"distributed.nproc_per_node = {nproc} needs one GPU per process and "
                         f"{host.gpus} are visible", f"set distributed.nproc_per_node ≤ {host.gpus}",
                         gpus=host.gpus, nproc_per_node=nproc))
    what = (f"{need.strategy}: weights, gradients and optimizer states need {_size(need.per_rank)} per rank"
            + ("" if gpu else f" ({_size(used)} for {nproc} rank(s) on this node)")
            + f"; {_size(budget)} {'per GPU' if gpu else 'RAM available'}")
    if used > budget:
        out.append(error("memory", what + " — it does not fit", _memory_fix(cfg, shape, bpp, budget, gpu), **ev))
    elif used > HEADROOM * budget:
        out.append(warning("memory", what + f" — over {HEADROOM:.0%}, little room left for activations",
                           "set training.gradient_checkpointing = true and a smaller training.micro_batch_size "
                           "(or training.micro_batch_tokens)", **ev))
    else:
        out.append(info("memory", what + " (activations come on top)", **ev))
    return out


def _memory_fix(cfg, shape: Shape, bpp: dict, budget: int, gpu: bool) -> str:
    """What would fit: FSDP over enough GPUs, LoRA, or a smaller model — with the numbers."""
    lora = cfg.model_copy(update={"lora": cfg.lora.model_copy(update={"enabled": True}), "distributed":
                                  cfg.distributed.model_copy(update={"strategy": "ddp"})})
    lora_need = _size(memory_need(lora, shape, bpp).per_rank)
    ways = []
    if gpu and budget:
        one = cfg.model_copy(update={"lora": cfg.lora.model_copy(update={"enabled": False}), "distributed":
                                     cfg.distributed.model_copy(update={"strategy": "ddp", "nproc_per_node": 1,
                                                                        "nnodes": 1})})
        full = memory_need(one, shape, bpp).per_rank  # fsdp divides this total over the ranks
        ranks = max(2, math.ceil(full / (HEADROOM * budget)))
        ways.append(f"shard the models: distributed.strategy = \"fsdp\" with nproc_per_node × nnodes ≥ {ranks} "
                    f"GPUs (≈ {_size(full / ranks)} per rank)")
    ways.append(f"lora.enabled = true with strategy \"ddp\" (≈ {lora_need} per rank)")
    ways.append("a smaller model (model.local_path)")
    return "; or ".join(ways) + "; activations come on top"


def disk_findings(cfg, shape: Shape, host: Host, log_dir: Path) -> list[Finding]:
    """Checkpoints kept (plus the one being written) against the free space of the log dir."""
    one = checkpoint_bytes(cfg, shape)
    need = one * (CHECKPOINTS_KEPT + 1)
    free = host.disk_free_bytes or 0
    ev = {"checkpoint_gib": _gib(one), "kept": CHECKPOINTS_KEPT, "need_gib": _gib(need), "free_gib": _gib(free),
          "log_dir": str(log_dir)}
    what = (f"checkpoints need {_size(need)} ({CHECKPOINTS_KEPT} kept + 1 being written, {_size(one)} each); "
            f"{_size(free)} free under the log dir")
    if need > free:
        return [error("disk", what, "free space there, or set runtime.log_dir in settings.json to a disk with "
                      f"≥ {_size(need)} free", **ev)]
    if need > 0.9 * free:
        return [warning("disk", what + " — nearly full", "free space there or move runtime.log_dir", **ev)]
    return [info("disk", what, **ev)]


def thread_findings(cfg, host: Host) -> list[Finding]:
    """The CPU thread budget of the run's worker processes (vapo_engine.jobs.threads)."""
    nproc, concurrent, cores = cfg.distributed.nproc_per_node, max_concurrent(), host.cores or 1
    env = worker_env(nproc, concurrent)
    try:
        threads = int(env["OMP_NUM_THREADS"])
    except ValueError:
        threads = 1
    ev = {"cores": cores, "processes_per_run": nproc, "concurrent_runs": concurrent, "threads_per_process": threads}
    user = [v for v in THREAD_VARS if v in os.environ]
    if nproc * concurrent > cores and host.memory_kind != "gpu":
        return [warning("threads", f"{nproc} process(es) × {concurrent} concurrent run(s) on {cores} core(s): "
                        "processes share cores and every step slows down", f"set distributed.nproc_per_node ≤ "
                        f"{max(1, cores // concurrent)} (or lower VAPO_MCP_MAX_CONCURRENT)", **ev)]
    if user and nproc * concurrent * threads > cores:
        return [warning("threads", f"{'/'.join(user)} from the environment gives {threads} thread(s) per process: "
                        f"{nproc * concurrent * threads} threads on {cores} core(s)", "unset it (the run manager "
                        f"sizes it) or set it to {max(1, cores // (nproc * concurrent))}", **ev)]
    return [info("threads", f"{threads} thread(s) per worker process ({nproc} per run, {concurrent} run(s) at "
                 f"once, {cores} core(s))", **ev)]
