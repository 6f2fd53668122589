"""Copy a finished build of a built-in model into the package (vapo_engine/builtin_model/shipped/<folder>/) and
record its recipe hash and held-out band there. For maintainers, after changing a recipe:

    .venv/bin/vapo-mcp build-model builtin:chain           # build it into the cache (minutes)
    .venv/bin/python -m scripts.ship_builtin_model builtin:chain [--from DIR] [--tolerance 0.03]

The build must be of the current recipe (its recorded recipe matches, num_threads aside). The band is the greedy
accuracy of the shipped weights, overall and per difficulty bucket, measured here once, +- `--tolerance` (a
bucket: at least +- 2 problems): on the task's held-out set as the build measured it ("full": its report_size
problems, the numbers of its sft_metrics.json), and on the first problems of that set ("test": TEST_SIZE), the
evaluation tests/test_shipped_models.py repeats and checks against the band.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from vapo_engine.builtin_model.build import DONE_MARKER, cache_root
from vapo_engine.builtin_model.recipes import RECIPES
from vapo_engine.builtin_model.shipped import (
    BAND_COMMAND,
    BAND_FILE,
    RECIPE_FILE,
    SHIPPED_ROOT,
    heldout_accuracy,
    recipe_record,
)

TEST_SIZE = {"builtin:addition": 200, "builtin:chain": 42, "builtin:crates": 100}
"""The first problems of the held-out set that tests/test_shipped_models.py evaluates (seconds on one core);
42 chains are 3 of each length."""
FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "sft_metrics.json", DONE_MARKER]


def group_sizes(task_name: str, size: int) -> dict[str, int]:
    """How many held-out problems each accuracy of `heldout_accuracy` averages over."""
    from vapo_engine.tasks import get_task
    task = get_task(task_name)
    heldout = task.heldout(size)
    buckets = [task.bucket(p) for p in heldout] if hasattr(task, "bucket") else []
    return {"heldout_greedy_acc": len(heldout)} | {f"heldout_greedy_acc_{b}": buckets.count(b) for b in buckets}


def _measure(folder: Path, task_name: str, size: int, tolerance: float) -> dict:
    """Held-out greedy accuracies of the model in `folder` on `size` problems and their band: +- `tolerance`,
    and at least +- 2 problems of the group an accuracy averages over."""
    measured = heldout_accuracy(folder, task_name, size)
    sizes = group_sizes(task_name, size)
    half = {k: max(tolerance, 2 / sizes[k]) for k in measured}
    return {"heldout_size": size, "group_sizes": sizes, "measured": measured,
            "band": {k: [round(max(0.0, v - half[k]), 4), round(min(1.0, v + half[k]), 4)]
                     for k, v in measured.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=sorted(RECIPES))
    p.add_argument("--from", dest="source", help="the finished build (default: its cache folder)")
    p.add_argument("--tolerance", type=float, default=0.03, help="half-width of the band (default 0.03)")
    p.add_argument("--test-size", type=int, help="problems of the test's smaller check (default: per task)")
    args = p.parse_args()
    recipe = RECIPES[args.name]
    source = Path(args.source) if args.source else cache_root() / recipe.folder_name()
    metrics = json.loads((source / "sft_metrics.json").read_text())
    built = {k: v for k, v in metrics["recipe"].items() if k != "num_threads"}
    wanted = {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(recipe))).items() if k != "num_threads"}
    if built != wanted:
        print(f"error: {source} was built from another recipe than the current {args.name}", file=sys.stderr)
        return 2
    if recipe.start and metrics.get("start") != RECIPES[recipe.start].folder_name():
        print(f"error: {source} continues {metrics.get('start')!r}, not {recipe.start}", file=sys.stderr)
        return 2
    dest = SHIPPED_ROOT / recipe.folder_name()
    tmp = dest.with_name(f".tmp-{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(source / name, tmp / name)
        (tmp / name).chmod(0o644)
    (tmp / RECIPE_FILE).write_text(json.dumps(recipe_record(args.name, recipe), indent=2) + "\n")
    full = _measure(tmp, recipe.task, recipe.report_size, args.tolerance)
    test = _measure(tmp, recipe.task, args.test_size or TEST_SIZE[recipe.task], args.tolerance)
    band = {"name": args.name, "task": recipe.task, "decoding": "greedy", "seed": 0, "tolerance": args.tolerance,
            "full": full, "test": test,
            "build_recorded": {k: metrics[k] for k in full["measured"] if k in metrics},
            "command": BAND_COMMAND.format(name=args.name)}
    (tmp / BAND_FILE).write_text(json.dumps(band, indent=2) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"{args.name}: shipped {dest} (held-out greedy {full['measured']['heldout_greedy_acc']:.3f} on "
          f"{recipe.report_size}, build recorded {metrics['heldout_greedy_acc']:.3f}; the test's "
          f"{test['heldout_size']}: {test['measured']['heldout_greedy_acc']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
