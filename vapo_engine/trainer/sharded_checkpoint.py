"""Checkpoints of FSDP2 runs: sharded model and optimizer state through `torch.distributed.checkpoint` (DCP),
plus the same plain Hugging Face exports every checkpoint has.

Layout of `checkpoints/step-NNNNNNN/` under `distributed.strategy = "fsdp"`:
    policy/            plain HF directory (+ tokenizer), gathered on rank 0: serve-model, eval, from_pretrained
    value/             the value model, likewise
    sharded/           DCP: policy + value weights and both AdamW states, each rank writing its own shards
    trainer_state.*    counters, schedulers, RNG, replay (rank 0), `"optimizers": "sharded"`; DONE last
DCP stores tensors with their global shapes, so `load_sharded` restores into any number of processes — the
same FSDP world, another world size, or one plain process (no process group: DCP reads every shard itself).

Loading never runs code from the checkpoint (docs/design.md §7): DCP's own reader unpickles `.metadata` with plain
`pickle`, so `SafeReader` reads it with an unpickler that admits only DCP's metadata classes, torch dtypes and
sizes; a planted pickle is refused (the checkpoint is then named as damaged and skipped). Tensor data is read
as raw bytes; DCP's byte items go through `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .checkpoint import new_tmp, publish
from .fsdp import export_hf

SHARDED = "sharded"
"""Sub-folder of a checkpoint with the DCP shards."""
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
     ("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by an allow-list unpickler (see the module docstring)."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class ShardedLoadError(ValueError):
    """The DCP shards of a checkpoint cannot be read (damaged, planted or incomplete)."""


def _reason(e: BaseException) -> str:
    """The innermost readable reason of a DCP failure (it wraps each rank's traceback in one message)."""
    for line in reversed(str(e).splitlines()):
        if "Error:" in line:
            return line.strip()[:300]
    return f"{type(e).__name__}"


def _states(models, opt_actor, opt_critic) -> dict:
    """DCP state dicts (sharded where the models are) of both models and both optimizers."""
    out = {}
    out["policy"], out["opt_actor"] = get_state_dict(models.policy, opt_actor)
    if models.value is not None and opt_critic is not None:
        out["value"], out["opt_critic"] = get_state_dict(models.value, opt_critic)
    return out


def save_sharded(run_dir: Path, step: int, models, opt_actor, opt_critic, trainer_state: dict, world,
                 keep: int = 2) -> Path | None:
    """Collective: every rank writes its shards; rank 0 the HF exports, the trainer state and DONE. Returns
    the checkpoint folder on rank 0 (None elsewhere)."""
    tmp = new_tmp(run_dir, step, SHARDED) if world.is_main else None
    tmp = Path(world.broadcast_json(str(tmp) if tmp else None))
    for name in ("policy", "value"):
        if getattr(models, name) is not None:
            export_hf(getattr(models, name), tmp / name, world.is_main)
    if world.is_main:
        models.tokenizer.save_pretrained(tmp / "policy")
    dcp.save(_states(models, opt_actor, opt_critic), checkpoint_id=tmp / SHARDED)
    world.barrier()
    final = None
    if world.is_main:
        state = dict(trainer_state, opt_actor=None, opt_critic=None, optimizers=SHARDED)
        final = publish(run_dir, tmp, step, state, keep)
    world.barrier()
    return final


def load_sharded(ckpt: Path, models, opt_actor, opt_critic) -> None:
    """Restore weights and optimizer states of `ckpt` into the models as they are now (sharded over any number
    of ranks, or one plain process). Collective when the models are sharded."""
    reader = SafeReader(Path(ckpt) / SHARDED)
    try:  # read (and check) the metadata here first: DCP would log its own failure with a traceback
        reader.read_metadata()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as e:
        raise ShardedLoadError(f"{SHARDED}/.metadata: {type(e).__name__}: {str(e)[:200]}") from None
    states = _states(models, opt_actor, opt_critic)
    try:
        dcp.load(states, storage_reader=reader)
    except CheckpointException as e:  # a BaseException: made an ordinary error so the checkpoint is skipped
        raise ShardedLoadError(_reason(e)) from None
    set_state_dict(models.policy, opt_actor, model_state_dict=states["policy"], optim_state_dict=states["opt_actor"])
    if "value" in states:
        set_state_dict(models.value, opt_critic, model_state_dict=states["value"],
                       optim_state_dict=states["opt_critic"])
