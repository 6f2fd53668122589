"""builtin:word (docs/experiments.md "Word problems for a real model"): word problems from the seed's smoke question outward — deterministic, a held-out split
training never draws from, every kind measured as a bucket, and a checker that reads the final answer (`80`,
`80 km/h`, `\\boxed{80}`, "The answer is 80.") and refuses a final part holding several different numbers."""
from __future__ import annotations

import random

import pytest

from vapo_engine.metrics import CATALOGUE, accuracies
from vapo_engine.tasks import get_task
from vapo_engine.tasks.word import KINDS, word_answer


@pytest.mark.parametrize("response", ["80", "80 km/h", "\\boxed{80}", "The answer is 80.", "Answer: $80.00",
                                      "240 km / 3 h = 80 km/h", "Speed = 240 / 3 = 80.\nThe answer is 80 km/h.",
                                      "\\boxed{80} since \\boxed{80.0} is the same", "It is 1,200 / 15 = 80"])
def test_the_checker_accepts_a_single_final_answer(response):
    assert get_task("builtin:word").reward(response, "80") == 1.0


@pytest.mark.parametrize("response", ["The answer is 80 or 90.", "\\boxed{80} \\boxed{90}", "80 90", "720",
                                      "The answer is 720.", "240 * 3 = 720", "", "no number here",
                                      "The answer is 80 km/h.\nThe answer is 7.", "Answer: 8 0"])
def test_the_checker_refuses_hedges_and_wrong_answers(response):
    assert get_task("builtin:word").reward(response, "80") == 0.0


def test_a_hedge_is_refused_whatever_the_gold_answer():
    assert word_answer("The answer is 80 or 90.") is None and word_answer("\\boxed{3}\\boxed{4}") is None


def test_generation_is_deterministic_and_heldout_is_apart_from_training():
    task = get_task("builtin:word")
    a, b = task.train_batch(200, random.Random(5)), task.train_batch(200, random.Random(5))
    assert [p.prompt for p in a] == [p.prompt for p in b]
    held = task.heldout(60)
    assert [p.prompt for p in held] == [p.prompt for p in task.heldout(60)]
    assert len({p.prompt for p in held}) == len(held) == 60
    assert not {p.prompt for p in held} & {p.prompt for p in task.train_batch(3000, random.Random(1))}
    assert [task.bucket(p) for p in held[:5]] == list(KINDS)  # the kinds in turn


def test_answers_are_right_and_every_bucket_is_a_catalogued_metric():
    task = get_task("builtin:word")
    held = task.heldout(50)
    seed = next(p for p in task.train_batch(2000, random.Random(0)) if p.prompt.startswith("A train covers 240 km"))
    assert seed.answer == "80"  # the smoke question is one of the problems
    for p in held:
        assert task.reward(task.reference_solution(p), p.answer) == 1.0 and int(p.answer) >= 0
    names = accuracies("sampled", task, held, [1.0] * len(held))
    assert set(names) <= set(CATALOGUE), set(names) - set(CATALOGUE)
    assert get_task("builtin:word-speed").heldout(3)[0].prompt.endswith("km/h?")
