"""Provider samples in training ([provider_rollouts], docs/design.md §8) against a real loopback OpenAI-style server that
solves the prompts: 429 storms during a run, a provider that rejects the key, and the answer cache on resume."""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, write_workspace
from tests.engine_helpers import FAST
from tests.fake_openai import FakeOpenAI, Reply
from tests.run_helpers import wait_for
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs.threads import SETTINGS_ENV
from vapo_engine.runs import create_run
from vapo_engine.tasks import get_task

KEY_ENV, KEY = "VAPO_TEST_PROVIDER_KEY", "sk-9Qx7Lm2Pz8Rt4Vw6Yb3NcK5J"
CHAT = "POST /v1/chat/completions"
PROVIDER = ["provider_rollouts.enabled=true", "provider_rollouts.samples_per_prompt=2",
            "provider_rollouts.max_tokens=64", "provider_rollouts.concurrency=2"]


def solver():
    """The provider's model: the reference solution of the addition prompt in the user message."""
    task = get_task("builtin:addition", ROOT)
    return lambda body: task.solve(body["messages"][-1]["content"])


def point_settings_at(settings_path, srv: FakeOpenAI) -> None:
    s = json.loads(settings_path.read_text())
    s["api"] = {"base_url": srv.base_url, "api_key_env": KEY_ENV, "default_headers": {}}
    s["models"] = {"reasoning": "qwen-32b", "fallback": None}
    settings_path.write_text(json.dumps(s))


def provider_run(tmp_path, model_dir, srv, monkeypatch, extra=(), name="run"):
    """A run directory (created as start_training does) using `srv`, for a worker started the way the run
    manager starts one: with the server's settings.json in the environment."""
    (tmp_path / "ws").mkdir()
    _, settings_path = write_workspace(tmp_path / "ws")
    point_settings_at(settings_path, srv)
    monkeypatch.setenv(SETTINGS_ENV, str(settings_path))
    over = [*FAST, f'model.local_path="{model_dir}"', *PROVIDER, *extra]
    cfg = load_config(ROOT / "config.toml", over, preset="cpu-demo")
    return create_run(cfg, load_settings(settings_path), tmp_path / "runs", run_id=name).run_dir


def train_records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if json.loads(x).get("kind") == "train"]


def assert_no_key(run_dir):
    for f in run_dir.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".log", ".txt", ""):
            assert KEY not in f.read_text(errors="replace"), f


def test_429_storm_lowers_then_restores_concurrency_and_positives_still_arrive(tmp_path, model_dir, monkeypatch):
    from vapo_engine.trainer.loop import train
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAI(key=KEY, answer_fn=solver()) as srv:
        storm = Reply.error(429, "Rate limit reached for requests", "rate_limit_exceeded",
                            type_="requests", headers={"retry-after-ms": "150"})
        srv.script(CHAT, *[storm] * 6)
        run_dir = provider_run(tmp_path, model_dir, srv, monkeypatch, ["training.total_steps=5"])
        summary = train(run_dir, log=lambda *a: None)
        sent = srv.count(CHAT)
    assert summary["status"] == "succeeded"
    # the run's totals when the worker stopped (on a slow machine the storm may outlast these 5 quick steps, so
    # the last logged step may precede the answers; that they reach the replay buffer is checked on resume below)
    state = json.loads((run_dir / "provider.json").read_text())
    final = state["final"]
    assert "down" not in state and final["provider/down"] == 0
    assert final["provider/rate_limited"] == 6 and final["provider/last_retry_after_s"] == pytest.approx(0.15)
    assert final["provider/concurrency_low"] == 1, "repeated 429s halve the limit (2 -> 1)"
    assert final["provider/concurrency"] == 2, "successes after the storm restore it"
    assert final["provider/ok"] > 0 and final["provider/correct"] > 0 and final["provider/accuracy"] == 1.0
    assert 0 < final["provider/requests"] <= sent  # attempts cancelled by the stop reached the server uncounted
    cached = [json.loads(x) for x in (run_dir / "provider_cache.jsonl").read_text().splitlines()]
    assert cached and all(1 <= len(c["contents"]) <= 2 for c in cached)  # a 429 past its retries: one answer
    assert_no_key(run_dir)


def test_cached_answers_are_not_paid_twice_on_resume(tmp_path, model_dir, monkeypatch):
    from vapo_engine.trainer.loop import train
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAI(key=KEY, answer_fn=solver()) as srv:
        run_dir = provider_run(tmp_path, model_dir, srv, monkeypatch, ["training.total_steps=3",
                                                                       "eval.save_interval=2"])
        # killed after step 3 (checkpoint at step 2): step 3's prompts were answered and cached, not checkpointed
        assert train(run_dir, stop_after=3, log=lambda *a: None)["status"] == "interrupted"
        before = srv.count(CHAT)
        assert before == 3 * 4 * 2  # 3 steps x 4 prompts x 2 answers
        summary = train(run_dir, resume=True, log=lambda *a: None)  # re-runs step 3 with the same prompts
        assert srv.count(CHAT) == before, "cached prompts are not asked again"
    assert summary["status"] == "succeeded"
    resumed = train_records(run_dir)[-1]
    assert resumed["step"] == 3 and resumed["provider/cache_hits"] == 4 and resumed["provider/sent"] >= 8
    # cached answers are ready at once: correct ones reach the positive replay buffer in that same step
    assert resumed["provider/positives_added"] > 0 and resumed["vapo/replay_provider"] > 0


def test_provider_401_run_continues_and_status_and_diagnosis_say_why(runs_env, model_dir, monkeypatch):
    from tools.diagnose import diagnose_error
    from tools.report import report_metrics
    from tools.training import ProviderSamplesArgs, run_status, start_training
    files, mgr = runs_env
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeOpenAI(key="sk-the-one-the-server-expects-0000", answer_fn=solver()) as srv:
        point_settings_at(files.settings, srv)
        provider = ProviderSamplesArgs(samples_per_prompt=2, max_tokens=64, concurrency=2)  # as the MCP tool
        run_id = start_training(files, preset="cpu-demo", overrides=[*FAST, f'model.local_path="{model_dir}"'],
                                provider=provider).run.run_id
        wait_for(lambda: mgr.get(run_id).state.value in ("succeeded", "failed"), what="the run to finish")
        assert srv.count(CHAT) >= 1
    assert mgr.get(run_id).state.value == "succeeded", "a provider that is down never ends the run"
    st = run_status(files, run_id)
    assert st.provider_down and st.provider_down.startswith("auth:") and KEY_ENV in st.provider_down
    assert KEY not in st.model_dump_json()
    found = diagnose_error(run_dir=mgr.get(run_id).run_dir, env={}, limit=50)
    ids = [f.rule_id for f in found.findings]
    assert "train-provider-down" in ids
    assert KEY not in found.model_dump_json()
    rep = report_metrics(files, run_id, plot=False)
    assert rep.latest["provider/down"] == 1 and rep.latest["provider/requests"] >= 1
    assert "provider/positives_added" in rep.series and KEY not in rep.model_dump_json()
    assert_no_key(mgr.get(run_id).run_dir)
