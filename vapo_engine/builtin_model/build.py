"""The cached, SFT-warm-started built-in models that the CPU demos train, one per built-in task.

`builtin_model_dir(task)` returns the model directory for a built-in training task, building it the first
time under `$VAPO_MCP_CACHE` or `~/.cache/vapo-mcp`. Builds go to a temporary folder with a done-marker written
last and are `os.replace`d into place under a lock, so a killed build never leaves a half directory and two
concurrent builders cannot corrupt the cache. Each task has its own recipe (`RECIPES`): model size, the SFT
sampling of problems, the stopping band.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .model import build_tokenizer, make_model

BUILTIN_VERSION = 1
"""Bump whenever the tokenizer, architecture or an SFT recipe changes: it is part of the cache folder name."""
DONE_MARKER = "BUILD_COMPLETE.json"
"""Written last inside a finished build; a folder without it is ignored and rebuilt."""


@dataclasses.dataclass(frozen=True)
class Phase:
    """A further warm-start phase (after phases 1-2, or after the `start` model): SFT on the task's RL
    distribution with its own learning rate and stopping band, from the task's reference or from a teacher that
    stops after `teacher_lines` lines (`teacher.StopEarlyTeacher`; its band then measures answers given the
    teacher's way)."""

    name: str
    max_steps: int
    lr: float
    target: tuple[float, float]
    val_buckets: tuple[str, ...] = ()
    eval_every: int = 20
    seed: int = 0
    warmup_steps: int = 20
    teacher_lines: int = 0


@dataclasses.dataclass(frozen=True)
class BuildRecipe:
    """Everything that determines a built-in model; values other than the task's recipe in `RECIPES` get
    their own cache folder."""

    seed: int = 0
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    task: str = "builtin:addition"
    max_steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 25
    val_size: int = 256
    target_greedy: tuple[float, float] = (0.60, 0.75)
    """Stop at >= the lower bound of greedy accuracy on the validation draw (the warm-start RL needs)."""
    report_size: int = 500
    length_buckets: bool = False
    """Batch problems of similar length together (for tasks whose answers vary in length)."""
    val_buckets: tuple[str, ...] = ()
    """Difficulty buckets of the validation draw that the stopping rule looks at (all when empty)."""
    phase2_max_steps: int = 0
    """A second warm-start phase on the RL distribution (`task.train_batch`) of at most this many steps; 0 = none."""
    phase2_val_buckets: tuple[str, ...] = ()
    """Buckets the second phase's stopping rule looks at."""
    phase2_target: tuple[float, float] = (0.10, 0.20)
    """The second phase stops once greedy accuracy on its buckets reaches the lower bound."""
    phase2_eval_every: int = 20
    """Validation interval of the second phase (fine: accuracy on long chains can jump within 100 steps)."""
    num_threads: int = 0
    """torch threads during the build (0 = all available cores); restored afterwards."""
    version: int = BUILTIN_VERSION
    """Part of the folder name: a task's recipe that changes what it builds gets a new version."""
    start: str = ""
    """Key in `RECIPES` of a model this one continues (built and cached first): phases 1-2 are then skipped."""
    phases: tuple[Phase, ...] = ()
    """Further phases, run in order after phases 1-2 (or on the `start` model)."""

    def folder_name(self) -> str:
        base = next((r for r in RECIPES.values() if (r.task, r.version) == (self.task, self.version)),
                    None) or BuildRecipe(task=self.task, version=self.version)
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(base, f.name) and f.name != "num_threads"}
        name = f"tiny-{self.task.removeprefix('builtin:')}-v{self.version}"
        if not changed:
            return name
        return name + "-" + hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:10]


_CHAIN_V1 = BuildRecipe(task="builtin:chain", max_steps=3000, eval_every=100, val_size=96, target_greedy=(0.95, 1.0),
                        val_buckets=("short",), report_size=140, length_buckets=True, phase2_max_steps=3000,
                        phase2_val_buckets=("long",), phase2_target=(0.10, 0.20))
RECIPES: dict[str, BuildRecipe] = {
    "builtin:addition": BuildRecipe(),
    "builtin:chain@v1": _CHAIN_V1,
    "builtin:chain": BuildRecipe(
        task="builtin:chain", version=2, start="builtin:chain@v1", val_size=96, report_size=140, length_buckets=True,
        phases=(Phase("solve", max_steps=900, lr=2e-4, target=(0.85, 1.0), val_buckets=("long",), eval_every=50,
                      seed=11),
                Phase("stop_early", max_steps=600, lr=2e-4, target=(0.85, 1.0), val_buckets=("long",),
                      eval_every=10, seed=12, warmup_steps=5, teacher_lines=8))),
}
"""The recipe of each built-in task's model (keys are task names; `@vN` keys are earlier versions that a recipe
starts from). builtin:chain v1, two phases: mostly short chains (`ChainTask.sft_batch`) until short ones are
solved (≥ 95% greedy), then the RL distribution until long chains reach 10% greedy. Its long end fails on a
skill (reading a sign from far back in a long prompt, bench/chain_lookup.py) that RL did not teach in 160 steps
while 200 supervised steps did (0.11 → 0.85). v2 continues it: the RL distribution until long chains are solved
(≥ 85% greedy on the validation draw), then a teacher that stops after 8 lines (`teacher.StopEarlyTeacher`)
until 85% of long chains are answered its way: RL starts with short and mid chains solved, long ones at ~0%
greedy and ~3% sampled (sparse reward), and what it must learn — keep going past line 8 — reward can teach."""


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$VAPO_MCP_CACHE`, else `~/.cache/vapo-mcp`."""
    if cache_dir is None:
        cache_dir = os.environ.get("VAPO_MCP_CACHE") or Path.home() / ".cache" / "vapo-mcp"
    return Path(cache_dir).expanduser()


def is_complete(model_dir: str | Path) -> bool:
    """True when `model_dir` holds a finished build (its done-marker exists)."""
    return (Path(model_dir) / DONE_MARKER).is_file()


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
    from .teacher import StopEarlyTeacher

    t0 = time.perf_counter()
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    tokenizer = build_tokenizer()
    task = get_task(recipe.task)
    common = {"batch_size": recipe.batch_size, "lr": recipe.lr, "eval_every": recipe.eval_every,
              "val_size": recipe.val_size, "length_buckets": recipe.length_buckets, "log": log}
    if start is not None:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(start)
        sft = {"start": start.name, "start_build_seconds": json.loads((start / "sft_metrics.json").read_text())
               .get("build_seconds")}
    else:
        model = make_model(tokenizer, hidden=recipe.hidden, layers=recipe.layers, heads=recipe.heads,
                           seed=recipe.seed)
        sft = _phases_1_2(model, tokenizer, task, recipe, common, log)
    for phase in recipe.phases:
        log(f"warm-start phase {phase.name!r}" + (f": a teacher that stops after {phase.teacher_lines} lines"
                                                   if phase.teacher_lines else ""))
        taught = StopEarlyTeacher(task, phase.teacher_lines) if phase.teacher_lines else task
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
    (tmp / DONE_MARKER).write_text(json.dumps({"version": recipe.version, "time": time.time()}))
    return metrics


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
                      log: Callable[[str], None] = print, **sft_kwargs) -> Path:
    """The cached SFT-warm-started tiny model directory of a built-in `task`, built the first time (minutes on
    2 CPU cores; see README for the measured times).

    `sft_kwargs` override fields of the task's recipe (e.g. `max_steps=5, hidden=16` in tests); a non-default
    recipe is cached in its own folder. Unfinished folders (no done-marker) are ignored and rebuilt.
    """
    recipe = dataclasses.replace(RECIPES.get(task) or BuildRecipe(task=task), **sft_kwargs)
    return _cached_build(cache_root(cache_dir), recipe, log)


def _cached_build(root: Path, recipe: BuildRecipe, log: Callable[[str], None]) -> Path:
    """The finished folder of `recipe` under `root`, building it (and first its `start` model) when missing."""
    final = root / recipe.folder_name()
    if is_complete(final):
        return final
    start = _cached_build(root, RECIPES[recipe.start], log) if recipe.start else None
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f"{final.name}.lock"):
        if is_complete(final):  # another process finished while we waited
            return final
        for stale in [final, *root.glob(f".tmp-{final.name}.*")]:
            shutil.rmtree(stale, ignore_errors=True)  # leftovers of a killed build: we hold the lock
        tmp = root / f".tmp-{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"  # '.': no other recipe matches
        tmp.mkdir()
        log(f"building the built-in tiny model in {final} (first use only) ...")
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
