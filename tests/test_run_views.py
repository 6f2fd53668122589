"""The read model of runs (vapo_engine/jobs/views.py): what the tools show of a run — state, progress, latest
metrics from the end of metrics.jsonl — and its history only on request."""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs import Registry, RunError, RunManager, RunViews, State
from vapo_engine.jobs import views as views_module
from vapo_engine.rundir import PROVIDER_JSON, RunDir
from vapo_engine.runs import create_run


def _run(root, run_id: str, records: list[dict], group_id: str | None = None):
    cfg = load_config(ROOT / "config.toml", ["training.total_steps=7"])
    reg = Registry(root)
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), root, run_id=run_id).run_dir
    reg.add(run_id, "exp", ["t"], run_dir, group_id=group_id)
    reg.claim_queued(1)
    reg.transition(run_id, State.SUCCEEDED, "done for the test")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


RESUMED = [{"step": 1, "kind": "train", "rollout/reward_mean": 0.1},
           {"step": 2, "kind": "train", "rollout/reward_mean": 0.2},
           {"step": 2, "kind": "eval", "eval/greedy_accuracy": 0.25, "eval/response_length": 9.0},
           {"step": 3, "kind": "train", "rollout/reward_mean": 0.3},
           {"step": 2, "kind": "train", "rollout/reward_mean": 0.22},  # resumed from the step-1 checkpoint
           {"step": 2, "kind": "eval", "eval/greedy_accuracy": 0.5, "eval/response_length": 8.0},
           {"step": 3, "kind": "train", "rollout/reward_mean": 0.33}]


def test_a_snapshot_shows_progress_and_latest_metrics_without_parsing_the_whole_file(tmp_path, monkeypatch):
    _run(tmp_path, "a", RESUMED)
    monkeypatch.setattr(views_module, "read_metrics", lambda p: pytest.fail("a full parse to show a run"))
    views = RunViews(RunManager(tmp_path))
    snap = views.get("a")
    assert (snap.run_id, snap.record.state, snap.step, snap.total_steps) == ("a", State.SUCCEEDED, 3, 7)
    assert snap.latest["train"]["rollout/reward_mean"] == 0.33
    assert snap.latest_eval == {"eval/greedy_accuracy": 0.5, "eval/response_length": 8.0}
    assert [s.run_id for s in views.list()] == ["a"] and views.skipped() == []


def test_the_history_keeps_the_newest_record_of_each_step_in_order(tmp_path):
    _run(tmp_path, "a", RESUMED)
    hist = RunViews(RunManager(tmp_path)).get("a").history
    assert [(r["step"], r["rollout/reward_mean"]) for r in hist["train"]] == [(1, 0.1), (2, 0.22), (3, 0.33)]
    assert [r["eval/greedy_accuracy"] for r in hist["eval"]] == [0.5]


def test_runs_are_listed_by_group_and_an_unknown_id_is_a_clear_error(tmp_path):
    _run(tmp_path, "a", [], group_id="abl-1")
    _run(tmp_path, "b", [])
    views = RunViews(RunManager(tmp_path))
    assert [s.run_id for s in views.list(group_id="abl-1")] == ["a"]
    snap = views.get("b")
    assert (snap.step, snap.latest, snap.latest_eval, snap.history) == (0, {}, {}, {})
    with pytest.raises(RunError, match="unknown run id 'nope'"):
        views.get("nope")


def test_provider_down_and_the_log_tail_come_from_the_run_directory(tmp_path):
    run_dir = _run(tmp_path, "a", [])
    views = RunViews(RunManager(tmp_path))
    assert views.get("a").provider_down() is None
    RunDir(run_dir).write_json(PROVIDER_JSON, {"down": {"kind": "auth", "reason": "401", "fix": "set the key"}})
    (run_dir / "worker.log").write_text("one\ntwo\nthree\n")
    snap = views.get("a")
    assert snap.provider_down() == {"kind": "auth", "reason": "401", "fix": "set the key"}
    assert snap.log_tail(2).splitlines() == ["two", "three"]
