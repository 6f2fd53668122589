"""Off-policy samples from real `serve-model` replicas (`rollout.backend = "server"`, uvicorn in a thread on
127.0.0.1): a replica whose answers carry log-probs off by a constant (an ASGI layer in front of the real server
rewrites its /rollout/generate answers) shows in rollout/logprob_diff_* and gets capped importance weights; with
asynchronous rollouts (max_off_policy_steps = 1) or weights pushed every 2 steps, every sample lags at most one
version and none is dropped."""
from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.engine_helpers import make_run, random_value_dir
from tests.serving_helpers import serving
from vapo_engine.metrics import read_metrics


class OffsetLogProbs:
    """ASGI app in front of a serve-model app: adds `offset` to every log-prob of its /rollout/generate answers
    (a server whose numerics differ from the trainer's by a constant); everything else passes through."""

    def __init__(self, app, offset: float):
        self.app, self.offset, self.rewritten = app, offset, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/rollout/generate":
            return await self.app(scope, receive, send)
        start: dict = {}
        body: list[bytes] = []

        async def rewrite(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            data = b"".join(body)
            if start["status"] == 200:
                answer = json.loads(data)
                for choice in answer["choices"]:
                    choice["log_probs"] = [x + self.offset for x in choice["log_probs"]]
                data, self.rewritten = json.dumps(answer).encode(), self.rewritten + 1
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
        await self.app(scope, receive, rewrite)


def _server_train(tmp_path: Path, model_dir: Path, extra: list[str], name: str, *, replicas: int = 1,
                  offset: float | None = None) -> list[dict]:
    """The train records of a short real run whose rollouts come from fresh serve-model replicas (log-probs
    shifted by `offset` when given)."""
    from vapo_engine.trainer.loop import train
    layers = []

    def wrap(app):
        layers.append(OffsetLogProbs(app, offset))
        return layers[-1]
    with ExitStack() as stack:
        urls = [stack.enter_context(serving(model_dir, weight_root=tmp_path,
                                            wrap=wrap if offset is not None else None)).root
                for _ in range(replicas)]
        listed = ", ".join(f'"{u}"' for u in urls)
        run = make_run(tmp_path, model_dir, ['rollout.backend="server"', f"rollout.urls=[{listed}]",
                                             f'rollout.weights_dir="{tmp_path / name / "weights"}"',
                                             "model.top_p=1.0", "eval.num_problems=1", *extra], name=name)
        assert train(run, log=lambda m: None)["status"] == "succeeded"
    assert all(layer.rewritten > 0 for layer in layers)  # the planted answers were the ones trained on
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def test_a_server_with_log_probs_off_by_a_constant_is_measured_and_capped(tmp_path, model_dir):
    # The actor's gradient is the PG term alone (no positive NLL, no KL), with non-zero advantages (a value model
    # with a random head): a uniform importance weight w scales actor/grad_norm by w.
    value = random_value_dir(tmp_path, model_dir)
    common = ["training.total_steps=1", "vapo.positive_lm_coef=0", "vapo.value_pretrain_steps=0",
              f'model.value_path="{value}"']
    honest = _server_train(tmp_path, model_dir, common, "honest")[0]  # is_mode auto = truncate for a server
    assert honest["rollout/logprob_diff_max"] < 1e-4 and honest["rollout/is_clipfrac"] == 0.0
    assert honest["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-3) and honest["actor/grad_norm"] > 0
    # Server log-probs 1 nat lower than the trainer's on every token: ratio e > cap 2, so every weight is 2 on
    # the same tokens (same seeds, same server sampling): the gradient doubles.
    low = _server_train(tmp_path, model_dir, common, "low", offset=-1.0)[0]
    assert low["rollout/logprob_diff_mean"] == pytest.approx(1.0, abs=1e-4)
    assert low["rollout/logprob_diff_max"] == pytest.approx(1.0, abs=1e-4)
    assert low["rollout/is_weight_mean"] == pytest.approx(2.0) and low["rollout/is_clipfrac"] == 1.0
    assert low["rollout/response_length"] == honest["rollout/response_length"]
    assert low["actor/grad_norm"] == pytest.approx(2 * honest["actor/grad_norm"], rel=1e-3)
    # 0.5 nats higher, cap 1.5: ratio e^-0.5 = 0.607 is under 1 (truncation bounds the upper side only) ...
    high = _server_train(tmp_path, model_dir, [*common, "rollout.is_cap=1.5"], "high", offset=0.5)[0]
    assert high["rollout/logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)
    assert high["rollout/is_weight_mean"] == pytest.approx(0.6065, abs=1e-3) and high["rollout/is_clipfrac"] == 0
    # ... and with is_mode = mask it lies outside [1/1.5, 1.5]: every token is masked, no gradient at all.
    masked = _server_train(tmp_path, model_dir, [*common, "rollout.is_cap=1.5", 'rollout.is_mode="mask"'],
                           "masked", offset=0.5)[0]
    assert masked["rollout/is_weight_mean"] == 0.0 and masked["rollout/is_clipfrac"] == 1.0
    assert masked["actor/grad_norm"] == 0.0


def test_async_server_rollouts_lag_at_most_one_version(tmp_path, model_dir):
    value = random_value_dir(tmp_path, model_dir)  # non-zero advantages: every update moves the policy
    recs = _server_train(tmp_path, model_dir, ["rollout.max_off_policy_steps=1", "training.total_steps=4",
                                               "training.learning_rate=5e-4", f'model.value_path="{value}"'],
                         "async", replicas=2)
    lags = [r["rollout/weight_version_lag"] for r in recs]
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and all(r["rollout/dropped_stale"] == 0 for r in recs)
    assert max(lags) <= 1 and lags[1:] == [1, 1, 1], lags  # the first is sampled synchronously
    # A lagging rollout was sampled by the replicas' older weights, which the importance weights see.
    assert all((r["rollout/logprob_diff_max"] > 1e-3) == (lag == 1) for r, lag in zip(recs, lags))


def test_weights_pushed_every_two_steps_lag_one_and_drop_nothing(tmp_path, model_dir):
    recs = _server_train(tmp_path, model_dir, ["rollout.sync_every=2", "training.total_steps=4",
                                               "vapo.value_pretrain_steps=0", "eval.eval_interval=100"], "sync2")
    # versions 0, 0, 2, 2: a replica lags the policy by sync_every - 1 = 1 between pushes, allowed without
    # max_off_policy_steps (trainer/offpolicy.py allowed_lag), so no batch is dropped and sampled again
    assert [r["rollout/weight_version"] for r in recs] == [0, 0, 2, 2]
    assert [r["rollout/weight_version_lag"] for r in recs] == [0, 1, 0, 1]
    assert all(r["rollout/dropped_stale"] == 0 for r in recs)
