"""Data parallelism for the trainer: process group, rank-aware devices, global reductions, gradient sync.

Under `torchrun` (WORLD_SIZE > 1) every rank samples its own share of prompt groups, and everything that
crosses samples is made global here: token/sequence counts of the losses, advantage-whitening moments,
explained-variance statistics, logged metrics. Gradients are synchronised once per optimizer step by a
SUM all-reduce (the losses are already divided by the global counts, so the sum is the full-batch
gradient — what DDP computes). A single process gets the null versions of all of this. What differs between
one process, ddp and fsdp (saving, evaluation, lock-step, metric combining) is `parallel.Parallel`'s.

Tensor collectives only: object collectives (`broadcast_object_list`, `all_gather_object`, …) unpickle what a
peer sends, so a process that joined the group could run code here (docs/design.md §7). Structured data crosses ranks
as JSON bytes in a uint8 tensor (`broadcast_json`); name lists are compared by digest (`agree`).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce SUM of a tensor (returns a new tensor; identity for one process)."""
        if not self.enabled:
            return t
        out = t.detach().clone()
        if not out.is_floating_point():
            out = out.double()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(t.dtype)

    def max_int(self, n: int) -> int:
        """The largest `n` over all ranks (e.g. a count of forward passes every rank must run in lock-step)."""
        if not self.enabled:
            return n
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce MAX of a float64 copy of a tensor (identity for one process)."""
        if not self.enabled:
            return t
        out = t.detach().to(torch.float64).clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return out

    def sync_gradients(self, model: torch.nn.Module) -> None:
        """SUM the gradients of all ranks (one flat all-reduce)."""
        if not self.enabled:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def broadcast_parameters(self, model: torch.nn.Module | None) -> None:
        """Make every rank start from rank 0's weights (e.g. a freshly initialised value head), as DDP does."""
        if not self.enabled or model is None:
            return
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def agree(self, names: list[str]) -> bool:
        """Whether every rank holds the same list of names (a digest compared with MIN/MAX all-reduces)."""
        if not self.enabled:
            return True
        digest = hashlib.sha256("\x00".join(names).encode()).digest()[:7]
        lo = torch.tensor([int.from_bytes(digest, "big")], dtype=torch.int64)
        hi = lo.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        return bool(lo == hi)

    def broadcast_json(self, obj):
        """Rank 0's JSON-serialisable `obj` on every rank, sent as a byte tensor and parsed with `json`:
        tensor collectives only, so a peer can never make this process unpickle (run) anything."""
        if not self.enabled:
            return obj
        data = json.dumps(obj).encode() if self.is_main else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0)
        buf = torch.zeros(int(size), dtype=torch.uint8)
        if self.is_main:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buf, src=0)
        return json.loads(bytes(buf.tolist()).decode())


def init_world(backend: str = "auto", device_pref: str = "auto") -> World:
    """Join the process group when launched by torchrun; else a one-process world."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and device_pref != "cpu"
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl":  # the small CPU-side collectives here (metrics, JSON, counts) need gloo beside nccl
        backend = "cpu:gloo,cuda:nccl"
    if cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return World(rank, size, local)


def shutdown(world: World) -> None:
    if world.enabled and dist.is_initialized():
        dist.destroy_process_group()


def end_rank(code: int) -> None:
    """End this rank of a multi-process run now: the atexit handlers run (metric sinks, logging), interpreter
    finalization does not. Under fsdp the process group outlives `destroy_process_group` (DTensor's caches keep
    its device mesh), so finalization would tear it down, and a gloo worker thread still releasing a collective's
    tensors there needs the GIL, is ended by the finalizing interpreter, and the rank aborts ("terminate called
    without an active exception", SIGABRT)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
