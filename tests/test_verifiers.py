"""Verifiers (docs/design.md §3.14, vapo_engine/tasks/verifiers.py): "correct" is decided in one place, every check is bounded by
a timeout, a verifier that raises scores 0, tasks name their default, and an unknown name stops a run at start."""
from __future__ import annotations

import threading
import time

import pytest

from vapo_engine.errors import UserError
from vapo_engine.registry import UnknownNameError
from vapo_engine.tasks import Problem, get_task
from vapo_engine.tasks.verifiers import VERIFIERS, Judge, judged, make_judge, make_verifier, verify

P = Problem("p", "1+1=", "2")


class Stubborn:
    """Hangs on responses that say 'hang' (until released), raises on 'boom', else exact."""

    name = "stubborn"

    def __init__(self):
        self.release = threading.Event()

    def check(self, response, problem):
        if response == "hang":
            self.release.wait(30)
        if response == "boom":
            raise RuntimeError("odd model output")
        return 1.0 if response == f";{problem.answer}" else 0.0


def test_correct_is_full_credit():
    assert judged(1.0).correct and judged(1.5).correct
    assert not judged(0.999).correct and not judged(0.0).correct and judged(0.5).score == 0.5


def test_each_check_has_a_timeout_and_the_rest_of_the_batch_is_scored():
    v = Stubborn()
    t = time.monotonic()
    out = verify(v, [";2", "hang", ";2", "boom", "hang", ";3"], [P] * 6, timeout_s=0.3)
    elapsed = time.monotonic() - t
    v.release.set()
    assert [o.correct for o in out] == [True, False, True, False, False, False]
    assert [o.timed_out for o in out] == [False, True, False, False, True, False]
    assert 0.5 < elapsed < 5  # two timeouts of 0.3 s, not 30 s each


def test_tasks_name_their_default_verifier():
    assert make_verifier("", get_task("builtin:addition")).name == "exact"
    assert make_verifier("", get_task("builtin:crates")).name == "exact"
    assert make_verifier("math", get_task("builtin:chain")).name == "math"

    class OwnTask:
        def reward(self, response, answer):
            return 1.0 if response.endswith(answer) else 0.0
    judge = make_judge("", OwnTask())
    assert judge.verifier.name == "task" and [v.correct for v in judge(["x2", "x3"], [P, P])] == [True, False]
    assert isinstance(make_judge("exact", OwnTask(), 5.0), Judge)


def test_math_verifier_reads_boxed_answers():
    assert verify(make_verifier("math", None), ["so \\boxed{2}", "3"], [P, P]) == [judged(1.0), judged(0.0)]


def test_an_unknown_verifier_names_the_field_and_the_known_ones():
    with pytest.raises(UnknownNameError) as e:
        make_verifier("exactly", get_task("builtin:addition"))
    assert isinstance(e.value, UserError) and str(e.value).startswith("data.verifier: unknown verifier 'exactly'")
    assert all(name in str(e.value) for name in VERIFIERS)


def test_a_run_with_an_unknown_verifier_stops_at_start(tmp_path, model_dir):
    from tests.engine_helpers import make_run
    from vapo_engine.trainer.loop import train
    run = make_run(tmp_path, model_dir, ["data.verifier=exactly"])
    with pytest.raises(UnknownNameError, match="data.verifier: unknown verifier 'exactly'"):
        train(run, log=lambda m: None)


def test_a_new_verifier_and_a_new_episode_are_one_registration_each(tmp_path, model_dir):
    """design.md §10: a verifier or an episode written elsewhere is one `register` line away from a run's
    data.verifier / rollout.episode (here registered from this file, as code outside the package would)."""
    from tests.engine_helpers import make_run
    from vapo_engine.metrics import read_metrics
    from vapo_engine.rollout.episodes import EPISODES, SingleTurn
    from vapo_engine.trainer.loop import train

    class Lenient:  # every response is right
        name = "lenient"

        def check(self, response, problem):
            return 1.0

    class Echo(SingleTurn):  # a single turn whose texts are the prompts (the verifier sees them)
        name = "echo"

        def sample(self, models, prompts, **how):
            gen = super().sample(models, prompts, **how)
            gen.texts = list(prompts)
            return gen
    VERIFIERS.register("lenient", Lenient)
    EPISODES.register("echo", Echo)
    try:
        run = make_run(tmp_path, model_dir, ["data.verifier=lenient", "rollout.episode=echo", "training.total_steps=1"])
        assert train(run, log=lambda m: None)["status"] == "succeeded"
    finally:
        VERIFIERS.pop("lenient")
        EPISODES.pop("echo")
    step = next(r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train")
    assert step["rollout/accuracy"] == 1.0
