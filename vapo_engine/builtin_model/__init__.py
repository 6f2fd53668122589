"""The built-in tiny models of the CPU demos: the model and tokenizer (`model`), the supervised warm-start
(`sft`), the recipes by name (`recipes`, torch-free), the models shipped with the package (`shipped`, torch-free)
and the cached builds (`build`). Worker-side (torch) otherwise; the RL recipe in `vapo_engine.trainer` only asks
for a directory (`builtin_model_dir`). Names resolve lazily, so `from vapo_engine.builtin_model.recipes import
RECIPES` does not import torch."""
from __future__ import annotations

import importlib

_WHERE = {"BUILTIN_VERSION": "recipes", "RECIPES": "recipes", "BuildRecipe": "recipes", "Phase": "recipes",
          "DONE_MARKER": "build", "builtin_model_dir": "build", "cache_root": "build", "is_complete": "build",
          "is_current": "build", "ready_model_dir": "build",
          "SHIPPED_ROOT": "shipped", "shipped_folder": "shipped", "shipped_names": "shipped",
          "build_tokenizer": "model", "make_config": "model", "make_model": "model", "make_model_dir": "model"}

__all__ = ["BUILTIN_VERSION", "DONE_MARKER", "RECIPES", "SHIPPED_ROOT", "BuildRecipe", "Phase", "build_tokenizer",
           "builtin_model_dir", "cache_root", "is_complete", "is_current", "make_config", "make_model",
           "make_model_dir", "ready_model_dir", "shipped_folder", "shipped_names"]
assert sorted(__all__) == sorted(_WHERE)  # one list of the lazy names


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
