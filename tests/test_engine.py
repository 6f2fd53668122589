"""The engine on a tiny real model: every variant runs, alignment is exact, resume is exact, errors are clear."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.engine_helpers import make_run
from vapo_engine.metrics import CATALOGUE, read_metrics
from vapo_engine.variants import VARIANTS


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_runs_and_writes_metrics_and_checkpoint(tmp_path, model_dir, variant):
    from vapo_engine.config import load_config
    from vapo_engine.trainer.loop import train
    base = load_config(ROOT / "config.toml", preset="cpu-demo")
    run_dir = make_run(tmp_path, model_dir, VARIANTS[variant].apply(base))
    summary = train(run_dir, log=lambda m: None)
    assert summary["status"] == "succeeded" and summary["steps"] == 3
    recs = read_metrics(run_dir / "metrics.jsonl")
    kinds = {r["kind"] for r in recs}
    assert {"train", "eval"} <= kinds
    assert all(k in CATALOGUE for r in recs for k in r if k not in ("step", "kind", "time"))
    train_recs = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train_recs] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in train_recs)
    assert (run_dir / "checkpoints" / "step-0000003" / "DONE").is_file()
    assert (run_dir / "checkpoints" / "step-0000003" / "policy" / "model.safetensors").is_file()
    has_value = variant not in ("grpo", "dapo", "rft")
    assert (run_dir / "checkpoints" / "step-0000003" / "value").is_dir() == has_value
    assert ("critic/value_loss" in train_recs[0]) == has_value  # EV itself is omitted when undefined (all-0 reward)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"


def test_resume_after_kill_continues_identically(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    over = ["training.total_steps=4", "eval.eval_interval=100"]
    full = make_run(tmp_path, model_dir, over, name="full")
    train(full, log=lambda m: None)
    cut = make_run(tmp_path, model_dir, over, name="cut")
    assert train(cut, stop_after=3, log=lambda m: None)["status"] == "interrupted"  # killed after step 3
    assert [p.name for p in (cut / "checkpoints").glob("step-*")] == ["step-0000002"]
    train(cut, resume=True, log=lambda m: None)
    keys = ("rollout/reward_mean", "rollout/response_length", "actor/pg_loss", "critic/value_loss",
            "actor/approx_kl", "vapo/lambda_policy_mean")
    pick = (lambda d: {r["step"]: tuple(r[k] for k in keys) for r in read_metrics(d / "metrics.jsonl")
                       if r["kind"] == "train"})
    a, b = pick(full), pick(cut)
    assert a[3] == b[3] and a[4] == b[4]  # step 3 was redone from the step-2 checkpoint, step 4 continues
    w_full = load_file(full / "checkpoints/step-0000004/policy/model.safetensors")
    w_cut = load_file(cut / "checkpoints/step-0000004/policy/model.safetensors")
    assert w_full.keys() == w_cut.keys() and all(torch.equal(w_full[k], w_cut[k]) for k in w_full)


def test_value_pretraining_reduces_value_loss_on_a_fixed_batch(tmp_path, model_dir):
    from vapo_engine.algo import value_loss
    from vapo_engine.rollout.experience import response_values
    from vapo_engine.trainer.advantages import monte_carlo_returns
    from vapo_engine.trainer.loop import collect
    from vapo_engine.trainer.setup import build_trainer
    from vapo_engine.trainer.update import update_step
    tr = build_trainer(make_run(tmp_path, model_dir, ["vapo.value_learning_rate=1e-3", "training.warmup_steps=0"]),
                       write=False)
    torch.manual_seed(1)
    ro = monte_carlo_returns(collect(tr, "pretrain", tr.pretrain_step)[0])
    ro.scores[: ro.size // 2] = 1.0  # give the fixed batch a learnable signal: first half "correct"
    from dataclasses import replace

    from vapo_engine.rollout.experience import place_rewards
    ro = monte_carlo_returns(replace(ro, token_rewards=place_rewards(ro.scores, ro.response_mask)))

    def loss():
        with torch.no_grad():
            return float(value_loss(response_values(tr.models.value, ro), ro.values, ro.returns,
                                    ro.response_mask)[0])
    before = loss()
    for _ in range(20):  # the fresh head starts at zero: the first steps move mostly the head
        update_step(tr.models, tr.opt_actor, tr.opt_critic, ro, None, tr.spec, train_actor=False)
    assert loss() < 0.5 * before


def test_reward_on_last_valid_token_and_values_aligned(model_dir):
    """Hand-made batch: rows with different prompt and response lengths, left/right padding."""
    from vapo_engine.rollout.experience import (
        from_token_ids,
        place_rewards,
        response_log_probs,
        response_values,
    )
    from vapo_engine.trainer.models import load_models
    m = load_models(model_dir, value_path=model_dir, need_value=True, reference_path=None,
                    device=torch.device("cpu"), autocast_dtype=None)
    pairs = [([5, 6, 7], [8, 9, 10, 11]), ([12], [13, 14]), ([15, 16], [17])]
    ro = from_token_ids(pairs, m.tokenizer.pad_token_id, "cpu")
    rewards = place_rewards(torch.tensor([1.0, 0.5, 2.0]), ro.response_mask)
    assert rewards.tolist() == [[0, 0, 0, 1.0], [0, 0.5, 0, 0], [2.0, 0, 0, 0]]
    with torch.no_grad():
        values, (lps, _) = response_values(m.value, ro), response_log_probs(m.policy, ro)
        for i, (prompt, resp) in enumerate(pairs):
            for t in range(len(resp)):
                prefix = torch.tensor([prompt + resp[:t]])  # the state before response token t, unpadded
                v = m.value(input_ids=prefix).logits[0, -1, 0]
                lp = torch.log_softmax(m.policy(input_ids=prefix).logits[0, -1], -1)[resp[t]]
                assert torch.allclose(values[i, t], v, atol=1e-5), (i, t)
                assert torch.allclose(lps[i, t], lp, atol=1e-5), (i, t)


def test_bad_dataset_and_override_errors_are_clear(tmp_path, model_dir):
    (tmp_path / "settings.json").write_text((ROOT / "settings.json").read_text())
    cli = [sys.executable, "-m", "server.cli", "train", "--config", str(ROOT / "config.toml"),
           "--settings", str(tmp_path / "settings.json"), "--preset", "cpu-demo",
           "--set", f'model.local_path="{model_dir}"', "--set", f'data.data_dir="{tmp_path}"']
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VAPO_MCP_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1"}  # aime_2024 is a registered benchmark: offline, its fetch fails with the fix
    r = subprocess.run(check=False, args=cli + ["--set", "eval.benchmark=aime_2024", "--set", "runtime=1"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "runtime" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(check=False, args=cli + ["--set", "eval.benchmark=aime_2024", "--set", "training.total_steps=1"],
                       cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(tmp_path / "aime_2024.jsonl") in r.stderr
    (tmp_path / "bad.jsonl").write_text('{"problem": "1+1"}\n')
    r = subprocess.run(check=False, args=cli + ["--set", "data.train=bad"], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 2 and "bad.jsonl" in r.stderr and ":1" in r.stderr and "answer" in r.stderr
    assert not (tmp_path / "logs").exists()  # nothing was created for a run that could not start


def test_a_step_logs_where_its_time_went(tmp_path, model_dir):
    """perf/*_time_s split the rollout step into its parts (sampling, old outputs, actor, critic, optimizer):
    each is positive, together they fit in the step, and GRPO has no critic part."""
    from vapo_engine.config import load_config
    from vapo_engine.trainer.loop import train
    parts = ("sample", "old_outputs", "actor", "critic", "optimizer")
    for variant in ("vapo", "grpo"):
        base = load_config(ROOT / "config.toml", preset="cpu-demo")
        run_dir = make_run(tmp_path, model_dir, [*VARIANTS[variant].apply(base), "training.total_steps=2",
                                                 "eval.eval_interval=100"], name=variant)
        train(run_dir, log=lambda m: None)
        recs = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
        assert recs
        for r in recs:
            mine = [p for p in parts if variant == "vapo" or p != "critic"]
            assert all(r[f"perf/{p}_time_s"] > 0 for p in mine), r
            assert sum(r[f"perf/{p}_time_s"] for p in mine) <= r["perf/step_time_s"]
            assert (("perf/critic_time_s" in r) == (variant == "vapo"))


def _scored_rollout(scores: list[float]):
    from vapo_engine.rollout.experience import Rollout
    n, r = len(scores), 3
    mask = torch.ones(n, r)
    return Rollout(input_ids=torch.zeros(n, 2 + r, dtype=torch.long), attention_mask=torch.ones(n, 2 + r),
                   position_ids=torch.arange(2 + r).expand(n, -1), response_mask=mask,
                   scores=torch.tensor(scores), correct=torch.tensor(scores) > 0, token_rewards=torch.zeros(n, r),
                   prompt_len=2, texts=[""] * n, entropy=torch.full((n, r), 0.5),
                   finished=torch.ones(n, dtype=torch.bool), gen_seconds=1.0)


def test_no_signal_groups_is_logged_only_with_two_or_more_samples_per_prompt():
    from vapo_engine.trainer.loop import rollout_metrics
    ro = _scored_rollout([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # groups of 2: equal, mixed, equal
    same = lambda x: x  # one rank: the global sum is this rank's
    assert rollout_metrics(ro, 2, same)["rollout/no_signal_groups"] == pytest.approx(2 / 3)
    assert rollout_metrics(ro, 3, same)["rollout/no_signal_groups"] == 0.0  # both groups of 3 are mixed
    one = rollout_metrics(ro, 1, same)  # every "group" of one sample has equal rewards: the number says nothing
    assert "rollout/no_signal_groups" not in one
    assert one["rollout/accuracy"] == 0.5 and one["actor/entropy"] == pytest.approx(0.5)
