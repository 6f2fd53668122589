"""The SFT-warm-started built-in models that the CPU demos train, one per built-in task: shipped, or built.

`builtin_model_dir(task)` returns the model directory for a built-in training task: the folder shipped with the
package (`shipped.py`) while it was built from the current recipe, else a build of the recipe under
`$VAPO_MCP_CACHE` or `~/.cache/vapo-mcp`, built the first time (or again with `rebuild=True`). Builds go to a
temporary folder with a done-marker (carrying the recipe hash) written last and are `os.replace`d into place
under a lock, so a killed build never leaves a half directory and two concurrent builders cannot corrupt the
cache. Each task has its own recipe (`RECIPES`): model size, the SFT
sampling of problems, the stopping band.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from vapo_engine.cachedir import cache_root

from .model import build_tokenizer, make_model
from .recipes import RECIPES, BuildRecipe, Phase
from .shipped import RECIPE_FILE, read_json, recipe_record, shipped_folder

DONE_MARKER = "BUILD_COMPLETE.json"
"""Written last inside a finished build; a folder without it is ignored and rebuilt."""


def is_complete(model_dir: str | Path) -> bool:
    """True when `model_dir` holds a finished build (its done-marker exists)."""
    return (Path(model_dir) / DONE_MARKER).is_file()


def is_current(model_dir: str | Path, recipe: BuildRecipe) -> bool:
    """True when `model_dir` holds a finished build of `recipe`: its done-marker exists and the recipe hash
    in it (builds older than the hash have none: accepted) is `recipe`'s."""
    marker = read_json(Path(model_dir) / DONE_MARKER)
    if marker is None:
        return is_complete(model_dir)
    return marker.get("recipe_hash", recipe.recipe_hash()) == recipe.recipe_hash()


@contextlib.contextmanager
def _build_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX flock); elsewhere, "rename wins" alone keeps the cache sound."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _build_into(tmp: Path, recipe: BuildRecipe, log: Callable[[str], None], start: Path | None = None) -> dict:
    """Create (or load `start`), SFT-train, evaluate and save the model in `tmp`; the done-marker is the last
    file written."""
    from vapo_engine.metrics import accuracies
    from vapo_engine.rollout.evaluate import scores
    from vapo_engine.tasks import get_task

    from .sft import evaluate, sft_warm_start

    t0 = time.perf_counter()
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    tokenizer = build_tokenizer()
    task = get_task(recipe.task)
    common = {"batch_size": recipe.batch_size, "lr": recipe.lr, "eval_every": recipe.eval_every,
              "val_size": recipe.val_size, "length_buckets": recipe.length_buckets, "log": log}
    if start is not None:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(start, trust_remote_code=False)
        sft = {"start": start.name, "start_build_seconds": json.loads((start / "sft_metrics.json").read_text())
               .get("build_seconds")}
    else:
        model = make_model(tokenizer, hidden=recipe.hidden, layers=recipe.layers, heads=recipe.heads,
                           seed=recipe.seed)
        sft = _phases_1_2(model, tokenizer, task, recipe, common, log)
    for phase in recipe.phases:
        taught = _teacher(task, phase)
        log(f"warm-start phase {phase.name!r}" + (f": {taught!r}" if taught is not task else ""))
        out = sft_warm_start(model, tokenizer, taught, max_steps=phase.max_steps, target_greedy=phase.target,
                             val_buckets=phase.val_buckets, seed=phase.seed, draw=taught.train_batch,
                             warmup_steps=phase.warmup_steps,
                             **(common | {"lr": phase.lr, "eval_every": phase.eval_every}))
        sft |= {f"{phase.name}_{k}": v for k, v in out.items() if k != "losses"}
    heldout = task.heldout(recipe.report_size)
    rewards, _ = scores(model, tokenizer, task, heldout, max_new_tokens=task.max_new_tokens)
    by_bucket = accuracies("greedy", task, heldout, rewards)  # one greedy pass: overall and per bucket
    greedy = by_bucket.pop("eval/greedy_accuracy")
    sampled = evaluate(model, tokenizer, task, heldout, max_new_tokens=task.max_new_tokens, greedy=False)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    metrics = {k: v for k, v in sft.items() if k != "losses"}
    metrics.update(heldout_greedy_acc=greedy, heldout_sampled_acc=sampled, heldout_size=len(heldout),
                   build_seconds=time.perf_counter() - t0, recipe=dataclasses.asdict(recipe),
                   version=recipe.version, torch_threads=torch.get_num_threads())
    metrics |= {k.replace("eval/greedy_accuracy", "heldout_greedy_acc"): v for k, v in by_bucket.items()}
    (tmp / "sft_metrics.json").write_text(json.dumps(metrics, indent=2))
    name = next((k for k, v in RECIPES.items() if v.recipe_hash() == recipe.recipe_hash()), recipe.task)
    (tmp / RECIPE_FILE).write_text(json.dumps(recipe_record(name, recipe), indent=2))
    (tmp / DONE_MARKER).write_text(json.dumps({"version": recipe.version, "time": time.time(),
                                               "recipe_hash": recipe.recipe_hash()}))
    return metrics


def _teacher(task, phase: Phase):
    """What a phase learns from: the task's reference solutions, or one of the teachers of teacher.py."""
    from .teacher import NoisyTeacher, StopEarlyTeacher
    if phase.teacher_lines:
        return StopEarlyTeacher(task, phase.teacher_lines)
    return NoisyTeacher(task, phase.noise, seed=phase.seed) if phase.noise else task


def _phases_1_2(model, tokenizer, task, recipe: BuildRecipe, common: dict, log: Callable[[str], None]) -> dict:
    """The first phase (the task's warm-start distribution) and the optional second (its RL distribution)."""
    from .sft import sft_warm_start

    sft = sft_warm_start(model, tokenizer, task, max_steps=recipe.max_steps, target_greedy=recipe.target_greedy,
                         val_buckets=recipe.val_buckets, seed=recipe.seed, **common)
    if recipe.phase2_max_steps:
        log("warm-start phase 2: the RL distribution, until the target buckets reach the band")
        phase2 = sft_warm_start(model, tokenizer, task, max_steps=recipe.phase2_max_steps,
                                target_greedy=recipe.phase2_target, val_buckets=recipe.phase2_val_buckets,
                                seed=recipe.seed + 1, draw=task.train_batch,
                                **(common | {"eval_every": recipe.phase2_eval_every}))
        sft = {**{f"phase1_{k}": v for k, v in sft.items() if k != "losses"}, **phase2}
    return sft


def builtin_model_dir(cache_dir: str | Path | None = None, *, task: str = "builtin:addition",
                      log: Callable[[str], None] = print, rebuild: bool = False, **sft_kwargs) -> Path:
    """The SFT-warm-started tiny model directory of a built-in `task` (a RECIPES name): the shipped folder
    when it was built from the current recipe (read it, never write into it), else the cached build under
    `cache_dir`, built the first time (minutes on 2 CPU cores) or again when `rebuild`.

    `sft_kwargs` override fields of the task's recipe (e.g. `max_steps=5, hidden=16` in tests); a non-default
    recipe is cached in its own folder. Unfinished folders (no done-marker) and builds of another recipe (another
    recipe hash in the done-marker) are ignored and rebuilt.
    """
    recipe = dataclasses.replace(RECIPES.get(task) or BuildRecipe(task=task), **sft_kwargs)
    shipped = None if rebuild else shipped_folder(recipe)
    return shipped or _cached_build(cache_root(cache_dir), recipe, log, rebuild)


def ready_model_dir(cache_dir: str | Path | None = None, *, task: str = "builtin:addition") -> Path | None:
    """The folder `builtin_model_dir(task=task)` returns without building anything (the shipped folder, else a
    current cache build), or None where that call would build."""
    recipe = RECIPES.get(task) or BuildRecipe(task=task)
    cached = cache_root(cache_dir) / recipe.folder_name()
    return shipped_folder(recipe) or (cached if is_current(cached, recipe) else None)


def _cached_build(root: Path, recipe: BuildRecipe, log: Callable[[str], None], rebuild: bool = False) -> Path:
    """The finished folder of `recipe` under `root`, building it when missing, stale or `rebuild`; its `start`
    model is the shipped one when that matches its recipe, else built (once) in the cache first."""
    final = root / recipe.folder_name()
    if not rebuild and is_current(final, recipe):
        return final
    start = None
    if recipe.start:
        start_recipe = RECIPES[recipe.start]
        start = shipped_folder(start_recipe) or _cached_build(root, start_recipe, log)
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f"{final.name}.lock"):
        if not rebuild and is_current(final, recipe):  # another process finished while we waited
            return final
        for stale in [final, *root.glob(f".tmp-{final.name}.*")]:
            shutil.rmtree(stale, ignore_errors=True)  # leftovers of a killed build: we hold the lock
        tmp = root / f".tmp-{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"  # '.': no other recipe matches
        tmp.mkdir()
        log(f"building the built-in tiny model in {final} (no shipped model of this recipe, or a rebuild) ...")
        try:
            with _torch_threads(recipe.num_threads):
                metrics = _build_into(tmp, recipe, log, start)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            os.replace(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if is_complete(final):  # "rename wins": a builder without our lock got there first
                return final
            raise
        log(f"built-in tiny model ready: held-out greedy {metrics['heldout_greedy_acc']:.2f}, sampled "
            f"{metrics['heldout_sampled_acc']:.2f}, {metrics['build_seconds']:.0f}s")
    return final
