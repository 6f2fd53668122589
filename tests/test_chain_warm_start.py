"""The chain models' warm-start recipes: v3 (the default) and v2 (the planted stop) continue the cached v1 model
(which keeps its folder); the noisy teacher's and the stop-early teacher's solutions; a miniature recipe of each
kind builds on its cached start model (tiny sizes, seconds)."""
from __future__ import annotations

import json
import random

from vapo_engine.builtin_model import RECIPES, BuildRecipe, builtin_model_dir
from vapo_engine.builtin_model.build import Phase
from vapo_engine.builtin_model.teacher import NoisyTeacher, StopEarlyTeacher
from vapo_engine.tasks.chain import ChainTask

TINY = {"hidden": 32, "layers": 1, "heads": 2, "batch_size": 4, "val_size": 4, "report_size": 14}


def test_chain_versions_keep_their_folders():
    assert RECIPES["builtin:chain@v1"].folder_name() == "tiny-chain-v1"  # caches built before v2 stay valid
    assert RECIPES["builtin:chain@planted-stop"].folder_name() == "tiny-chain-v2"
    assert RECIPES["builtin:chain"].folder_name() == "tiny-chain-v3"
    assert RECIPES["builtin:chain"].start == RECIPES["builtin:chain@planted-stop"].start == "builtin:chain@v1"
    assert [p.noise for p in RECIPES["builtin:chain"].phases] == [0.1]
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


def test_noisy_teacher_flips_signs_at_random_lines_and_carries_the_wrong_total():
    task, teacher = ChainTask(), NoisyTeacher(ChainTask(), 0.2, seed=3)
    problems = task.train_batch(400, random.Random(1))
    flipped = lines = wrong_answers = 0
    for p in problems:
        ref = teacher.reference_solution(p)
        ops, rows = p.prompt.split()[1:], ref.split("\n")[:-1]
        assert len(rows) == len(ops) and task.steps_of(p.prompt) == len(ops)
        total = int(p.prompt.split()[0])
        for row, op in zip(rows, ops):
            label, start, sign, d, new = row[0], int(row[2:4]), row[4], int(row[5]), int(row[7:9])
            assert (label, start, d) == (op[0], total, int(op[2])) and 0 <= new <= 99
            assert new == (start + d if sign == "+" else start - d)  # the arithmetic is always right
            flipped += sign != op[1]
            total = new
        lines += len(ops)
        assert ref.endswith(f";{total:02d}")  # the answer is the (possibly wrong) running total
        wrong_answers += task.reward(ref, p.answer) == 0.0
    assert 0.15 < flipped / lines < 0.2  # p = 0.2, less where a wrong sign would leave 0-99
    assert wrong_answers > 0.3 * len(problems)
    assert teacher.train_batch(3, random.Random(2)) == task.train_batch(3, random.Random(2))  # true answers


def test_v3_recipe_learns_from_the_noisy_teacher(tmp_path, monkeypatch):
    start = BuildRecipe(task="builtin:chain", max_steps=2, eval_every=2, **TINY)
    monkeypatch.setitem(RECIPES, "builtin:chain@tiny", start)
    phases = (Phase("noisy", max_steps=2, lr=1e-3, target=(1.1, 1.0), val_buckets=("long",), eval_every=2,
                    noise=0.1),)
    logs: list[str] = []
    out = builtin_model_dir(tmp_path, task="builtin:chain", log=logs.append, start="builtin:chain@tiny",
                            phases=phases, **TINY)
    m = json.loads((out / "sft_metrics.json").read_text())
    assert m["noisy_steps"] == 2 and m["recipe"]["phases"][0]["noise"] == 0.1
    assert any("NoisyTeacher(p=0.1" in line for line in logs)


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
