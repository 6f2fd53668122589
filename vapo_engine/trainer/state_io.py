"""Trainer state on disk without pickles: tensors in safetensors, everything else in JSON.

Loading a checkpoint must never execute code (docs/design.md §7), so the optimizer, scheduler, RNG and replay state are
split into `trainer_state.safetensors` (every tensor, by a generated key) and `trainer_state.json` (the
structure, with `{"__tensor__": key}` where a tensor was). JSON cannot say "tuple" or "dict with int keys",
so those are tagged (`__tuple__`, `__items__`); the encoder refuses any other type instead of guessing.
Nothing else in a checkpoint folder is read as trainer state: a pickle there (say a planted `trainer_state.pt`)
is never loaded.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STATE_JSON, STATE_TENSORS = "trainer_state.json", "trainer_state.safetensors"
_TAGS = ("__tensor__", "__tuple__", "__items__", "__float__")


class StateFormatError(ValueError):
    """The trainer state has a value this format does not store, or the files disagree."""


def save_state(state: dict, folder: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors)
    save_file({k: t.detach().to("cpu").contiguous().clone() for k, t in tensors.items()},
              str(folder / STATE_TENSORS))
    (folder / STATE_JSON).write_text(json.dumps(tree), encoding="utf-8")


def load_state(folder: Path) -> dict:
    """The trainer state of a checkpoint folder (JSON + safetensors: nothing is unpickled)."""
    if not (folder / STATE_JSON).is_file():
        raise StateFormatError(f"{STATE_JSON} is missing")
    tensors = load_file(str(folder / STATE_TENSORS)) if (folder / STATE_TENSORS).is_file() else {}
    return _decode(json.loads((folder / STATE_JSON).read_text(encoding="utf-8")), tensors)


def _encode(obj, tensors: dict):
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj
        return {"__tensor__": key}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(x, tensors) for x in obj]}
    if isinstance(obj, list):
        return [_encode(x, tensors) for x in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    raise StateFormatError(f"cannot store a {type(obj).__name__} in the trainer state (tensors, numbers, "
                           "strings, lists, tuples and dicts only)")


def _decode(obj, tensors: dict):
    if isinstance(obj, list):
        return [_decode(x, tensors) for x in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        if obj["__tensor__"] not in tensors:
            raise StateFormatError(f"tensor {obj['__tensor__']!r} is missing from {STATE_TENSORS}")
        return tensors[obj["__tensor__"]]
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__tuple__" in obj:
        return tuple(_decode(x, tensors) for x in obj["__tuple__"])
    if "__items__" in obj:
        return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key
