"""The critic's held-out EV (`eval/critic_ev`, `eval/critic_ev_start`): measured on exactly the evaluation's
sampled held-out responses, with their rewards, on the shipped addition model."""
from __future__ import annotations

import pytest

from vapo_engine.builtin_model import builtin_model_dir
from vapo_engine.rollout.evaluate import evaluate
from vapo_engine.tasks import get_task
from vapo_engine.trainer.critic import heldout_ev
from vapo_engine.trainer.models import load_models

torch = pytest.importorskip("torch")


def _ev(values: list[float], rewards: list[float]) -> float:
    """1 − Var(r − v) / Var(r), population variances."""
    r, d = torch.tensor(rewards, dtype=torch.float64), torch.tensor(rewards, dtype=torch.float64) - torch.tensor(
        values, dtype=torch.float64)
    return float(1 - d.var(unbiased=False) / r.var(unbiased=False))


def test_heldout_ev_sees_the_sampled_responses_and_their_rewards():
    models = load_models(builtin_model_dir(task="builtin:addition", log=lambda m: None), value_path=None,
                         need_value=True, reference_path=None, device=torch.device("cpu"), autocast_dtype=None)
    task = get_task("builtin:addition")
    seen = []

    def hook(ro, reduce_sum):
        seen.append(ro)
        return heldout_ev(models, 8)(ro, reduce_sum)
    how = {"num_problems": 24, "samples_per_problem": 2, "max_new_tokens": 40, "temperature": 1.0, "top_p": 1.0,
           "seed": 3}
    m = evaluate(models, task, on_sampled=hook, **how)
    p = m["eval/sampled_accuracy"]
    assert 0 < p < 1 and len(seen) == 1 and seen[0].size == 48 and float(seen[0].scores.mean()) == pytest.approx(p)
    assert m["eval/critic_ev"] == m["eval/critic_ev_start"] == 0.0  # a fresh (zero) head: constant predictions
    torch.manual_seed(0)
    with torch.no_grad():  # a head that reads the trunk: EV at the prompt checked row by row, without padding
        models.value.score.weight.normal_(0.0, 0.05)
    m = evaluate(models, task, on_sampled=heldout_ev(models, 8), **how)
    problems = [q for q in task.heldout(24) for _ in range(2)]
    v0 = []
    for q in problems:  # the same sampled responses (the evaluation is seeded); V(prompt) of each, unpadded
        ids = models.tokenizer(q.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            v0.append(float(models.value(input_ids=ids).logits[0, -1, 0]))
    assert m["eval/sampled_accuracy"] == p
    assert m["eval/critic_ev_start"] == pytest.approx(_ev(v0, seen[0].scores.tolist()), abs=1e-4)
    assert m["eval/critic_ev"] != m["eval/critic_ev_start"]
