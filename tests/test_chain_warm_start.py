"""The chain model's warm-start recipe: v2 continues the cached v1 model (which keeps its folder), then a phase
from the reference and a phase from a teacher that stops after k lines (tiny sizes, seconds)."""
from __future__ import annotations

import json
import random

from vapo_engine.builtin_model import RECIPES, BuildRecipe, builtin_model_dir
from vapo_engine.builtin_model.build import Phase
from vapo_engine.builtin_model.teacher import StopEarlyTeacher
from vapo_engine.tasks.chain import ChainTask

TINY = {"hidden": 32, "layers": 1, "heads": 2, "batch_size": 4, "val_size": 4, "report_size": 14}


def test_chain_versions_keep_their_folders():
    assert RECIPES["builtin:chain@v1"].folder_name() == "tiny-chain-v1"  # caches built before v2 stay valid
    assert RECIPES["builtin:chain"].folder_name() == "tiny-chain-v2"
    assert RECIPES["builtin:chain"].start == "builtin:chain@v1"
    assert BuildRecipe().folder_name() == "tiny-addition-v1"


def test_stop_early_teacher_writes_k_lines_and_answers_the_total_so_far():
    task = ChainTask()
    teacher = StopEarlyTeacher(task, 3)
    problems = teacher.train_batch(40, random.Random(0))
    for p in problems:
        ref = teacher.reference_solution(p)
        n = task.steps_of(p.prompt)
        assert ref.count("\n") == min(n, 3)  # k lines, then the answer line
        assert task.reward(ref, p.answer) == 1.0
        assert task.solve(p.prompt).startswith(ref.rsplit("\n", 1)[0])  # its lines are the reference's
        full = task.solve(p.prompt)
        assert (ref == full) == (n <= 3)  # short chains: the teacher is the reference
    assert any(task.steps_of(p.prompt) > 3 for p in problems)


def test_v2_recipe_builds_on_the_cached_start_model(tmp_path, monkeypatch):
    start = BuildRecipe(task="builtin:chain", max_steps=2, eval_every=2, **TINY)
    monkeypatch.setitem(RECIPES, "builtin:chain@tiny", start)
    phases = (Phase("solve", max_steps=2, lr=1e-3, target=(1.1, 1.0), val_buckets=("long",), eval_every=2),
              Phase("stop_early", max_steps=3, lr=1e-3, target=(1.1, 1.0), val_buckets=("long",), eval_every=3,
                    warmup_steps=1, teacher_lines=8))
    logs: list[str] = []
    out = builtin_model_dir(tmp_path, task="builtin:chain", log=logs.append, start="builtin:chain@tiny",
                            phases=phases, **TINY)
    start_dir = tmp_path / start.folder_name()
    assert (start_dir / "sft_metrics.json").is_file() and out != start_dir
    m = json.loads((out / "sft_metrics.json").read_text())
    assert m["start"] == start_dir.name and m["solve_steps"] == 2 and m["stop_early_steps"] == 3
    assert "phase1_steps" not in m  # the start model's phases are not run again
    assert {"heldout_greedy_acc_short", "heldout_greedy_acc_mid", "heldout_greedy_acc_long"} <= set(m)
    assert any("stops after 8 lines" in line for line in logs)
    logs.clear()  # both cached now: nothing is rebuilt
    assert builtin_model_dir(tmp_path, task="builtin:chain", log=logs.append, start="builtin:chain@tiny",
                             phases=phases, **TINY) == out and not logs
