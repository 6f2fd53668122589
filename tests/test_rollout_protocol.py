"""The rollout protocol's routes on a real `serve-model` (in-thread uvicorn on 127.0.0.1, token-protected): input
checks answer OpenAI-shaped 400s naming the field, weights load only from inside --weight-root and only when they
fit, pause holds requests and abort ends them, seeds reproduce, and the pool's token never shows."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.serving_helpers import serving

TOKEN = "rollout-test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("weights")
    with serving(model_dir, token=TOKEN, weight_root=root) as s:
        yield s, root


def body(**over) -> dict:
    return {"model": "model", "prompt_ids": [5, 6, 7], "n": 2, "max_tokens": 6, "temperature": 1.0, "top_p": 1.0,
            "top_k": 0, "stop_token_ids": [2], "seed": 7, **over}


def post(s, path: str, data, headers=AUTH) -> httpx.Response:
    return httpx.post(s.root + path, json=data, headers=headers, timeout=60)


def test_generate_answers_ids_log_probs_and_version(server):
    s, _ = server
    assert httpx.get(s.root + "/rollout/info", timeout=30).status_code == 401  # the token guards the protocol
    info = httpx.get(s.root + "/rollout/info", headers=AUTH, timeout=30).json()
    assert info["protocol"] == 1 and info["model"] == "model" and "full vocabulary" in info["log_probs"]
    assert httpx.get(s.root + "/health", timeout=30).json()["weight_version"] == info["weight_version"]
    one, two = (post(s, "/rollout/generate", body()).json() for _ in range(2))
    assert one["choices"] == two["choices"]  # the same seed draws the same tokens
    for c in one["choices"]:
        assert len(c["token_ids"]) == len(c["log_probs"]) <= 6 and all(lp <= 0 for lp in c["log_probs"])
        assert c["finish_reason"] in ("stop", "length")
        assert (c["token_ids"][-1] == 2) == (c["finish_reason"] == "stop")
    greedy = post(s, "/rollout/generate", body(temperature=0, seed=None)).json()["choices"]
    assert greedy[0]["token_ids"] == greedy[1]["token_ids"]


@pytest.mark.parametrize("over, param, status", [
    ({"temperature": None}, "temperature", 400), ({"top_k": None}, "top_k", 400), ({"top_p": 0}, "top_p", 400),
    ({"prompt_ids": [5, 10**6]}, "prompt_ids", 400), ({"prompt_ids": []}, "prompt_ids", 400),
    ({"n": 0}, "n", 400), ({"max_tokens": 10**6}, "max_tokens", 400), ({"stop_token_ids": []}, "stop_token_ids", 400),
    ({"model": "other"}, "model", 404), ({"seed": "x"}, "seed", 400), ({"temperature": 1e-300}, "temperature", 400),
    ({"temperature": 5e-6}, "temperature", 400),
])
def test_bad_generate_requests_get_clear_errors(server, over, param, status):
    s, _ = server
    r = post(s, "/rollout/generate", {k: v for k, v in body(**over).items() if v is not None})
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert param in r.json()["error"]["message"]


def test_load_weights_only_from_inside_the_root_and_only_if_they_fit(server, tmp_path, model_dir):
    from vapo_engine.builtin_model import make_model_dir
    s, root = server
    r = post(s, "/rollout/load_weights", {"path": str(model_dir), "version": 1})
    assert r.status_code == 403 and r.json()["error"]["code"] == "outside_weight_root"
    wider = make_model_dir(root / "wider", hidden=48, layers=2, heads=2, seed=0)
    r = post(s, "/rollout/load_weights", {"path": str(wider), "version": 1})
    assert r.status_code == 400 and "shape" in r.json()["error"]["message"]
    assert post(s, "/rollout/load_weights", {"path": str(root / "nope"), "version": 1}).status_code == 400
    assert post(s, "/rollout/load_weights", {"path": str(root)}).status_code == 400  # no version
    same = make_model_dir(root / "same", hidden=32, layers=2, heads=2, seed=1)  # other values, same shapes
    before = post(s, "/rollout/generate", body(temperature=0, seed=None)).json()["choices"][0]["log_probs"]
    assert post(s, "/rollout/load_weights", {"path": str(same), "version": 5}).json() == {"weight_version": 5}
    after = post(s, "/rollout/generate", body(temperature=0, seed=None)).json()
    assert after["weight_version"] == 5 and after["choices"][0]["log_probs"] != before


def test_pause_holds_requests_and_abort_ends_them(server):
    s, _ = server
    assert post(s, "/rollout/pause", {}).json() == {"paused": True}
    out: list = []
    t = threading.Thread(target=lambda: out.append(post(s, "/rollout/generate", body(request_id="r1")).json()))
    t.start()
    time.sleep(0.5)
    assert not out and httpx.get(s.root + "/rollout/info", headers=AUTH, timeout=30).json()["paused"]
    assert post(s, "/rollout/abort", {"request_id": "r1"}).json() == {"aborted": 1}
    t.join(30)
    assert [c["finish_reason"] for c in out[0]["choices"]] == ["abort", "abort"]
    assert post(s, "/rollout/resume", {}).json() == {"paused": False}
    assert post(s, "/rollout/generate", body()).json()["choices"][0]["finish_reason"] != "abort"


def test_the_pool_sends_the_token_from_the_env_and_never_shows_it(server, model_dir, monkeypatch, capsys):
    import torch

    from vapo_engine.config.train_model import RolloutConfig
    from vapo_engine.rollout.backends.replicas import ReplicaRefused
    from vapo_engine.rollout.generate import sampling_params
    from vapo_engine.trainer.models import load_models
    s, _ = server
    monkeypatch.setenv("ROLLOUT_TOKEN_T", TOKEN)
    models = load_models(model_dir, value_path=None, need_value=False, reference_path=None,
                         device=torch.device("cpu"), autocast_dtype=None,
                         rollout=RolloutConfig(backend="server", urls=[s.root], token_env="ROLLOUT_TOKEN_T"))
    params = sampling_params(models.policy, models.tokenizer, max_new_tokens=4)
    gen = models.backend.generate(models, [[5, 6], [7]], params)
    assert gen.response_ids.shape[0] == 2 and gen.log_probs is not None and gen.weight_version is not None
    monkeypatch.setenv("ROLLOUT_TOKEN_T", "a-wrong-token-but-long-enough")
    wrong = load_models(model_dir, value_path=None, need_value=False, reference_path=None,
                        device=torch.device("cpu"), autocast_dtype=None,
                        rollout=RolloutConfig(backend="server", urls=[s.root], token_env="ROLLOUT_TOKEN_T"))
    with pytest.raises(ReplicaRefused, match=r"HTTP 401.*\$ROLLOUT_TOKEN_T") as e:
        wrong.backend.generate(wrong, [[5, 6]], params)
    shown = str(e.value) + capsys.readouterr().out
    assert TOKEN not in shown and "a-wrong-token" not in shown
