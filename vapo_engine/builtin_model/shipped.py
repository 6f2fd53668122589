"""The built-in models that ship with the package (`shipped/<folder>/`), so a run starts without building one.

Each shipped folder is a finished build of its recipe (weights, tokenizer, `sft_metrics.json`), plus
`recipe.json` (the recipe name, the recipe and its hash, `BuildRecipe.recipe_hash`) and `heldout_band.json` (the
held-out greedy accuracy measured on the shipped weights, the band a re-evaluation must land in, and the command
that measured it). A shipped folder is used only while its recorded hash equals the current recipe's: a changed
recipe falls back to the cache (`build.builtin_model_dir`). Shipped folders are only ever read. Torch-free except
`heldout_accuracy`, which imports torch when called.
"""
from __future__ import annotations

import json
from pathlib import Path

from .recipes import RECIPES, BuildRecipe

SHIPPED_ROOT = Path(__file__).resolve().with_name("shipped")
"""The package folder that holds one folder per shipped model, named like its cache folder."""
RECIPE_FILE = "recipe.json"
BAND_FILE = "heldout_band.json"
BAND_COMMAND = ".venv/bin/python -m scripts.ship_builtin_model {name}"
"""The command that copies a cached build into `shipped/` and measures its band (recorded in BAND_FILE)."""


def recipe_record(name: str, recipe: BuildRecipe) -> dict:
    """The contents of RECIPE_FILE for `recipe` under the name `name`."""
    return {"name": name, "folder": recipe.folder_name(), "recipe_hash": recipe.recipe_hash(),
            "recipe": recipe.identity()}


def read_json(path: Path) -> dict | None:
    """The JSON object in `path`, or None when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def shipped_folder(recipe: BuildRecipe) -> Path | None:
    """The shipped folder built from exactly `recipe` (same recipe hash, weights present), else None."""
    folder = SHIPPED_ROOT / recipe.folder_name()
    recorded = read_json(folder / RECIPE_FILE)
    if recorded is None or recorded.get("recipe_hash") != recipe.recipe_hash():
        return None
    return folder if (folder / "model.safetensors").is_file() else None


def shipped_names() -> list[str]:
    """The names in RECIPES whose shipped folder matches the current recipe."""
    return [name for name, recipe in RECIPES.items() if shipped_folder(recipe) is not None]


def heldout_accuracy(folder: Path, task_name: str, size: int) -> dict[str, float]:
    """Greedy accuracy (overall and per difficulty bucket) of the model in `folder` on the first `size`
    problems of `task_name`'s held-out split: the same evaluation a build records (`heldout_greedy_acc*` in
    sft_metrics.json). Loads with trust_remote_code=False and writes nothing."""
    import torch
    from transformers import AutoModelForCausalLM

    from vapo_engine.metrics import accuracies
    from vapo_engine.rollout.evaluate import scores
    from vapo_engine.rollout.tokenizer import load_tokenizer
    from vapo_engine.tasks import get_task

    task = get_task(task_name)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(folder)
    heldout = task.heldout(size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # greedy decoding draws nothing; fixed anyway
        rewards, _ = scores(model, tokenizer, task, heldout, max_new_tokens=task.max_new_tokens)
    by_bucket = accuracies("greedy", task, heldout, rewards)
    return {k.replace("eval/greedy_accuracy", "heldout_greedy_acc"): float(v) for k, v in by_bucket.items()}
