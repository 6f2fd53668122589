"""Experiment trackers as metric sinks (vapo_engine/sinks/mlflow.py, wandb.py): a run read back through MLflow's
own client has the values of metrics.jsonl; a missing package or an unreachable tracker is a warning in the
worker log, and the run succeeds."""
from __future__ import annotations

import json
import math
import socket
import sys

import pytest

from tests.engine_helpers import make_run
from vapo_engine.metrics import read_metrics
from vapo_engine.sinks import metric_items

EXPERIMENT = "vapo-aime-qwen32b"  # the repository's settings.json, which make_run uses


@pytest.fixture
def mlflow_env(monkeypatch):
    """No tracking URI from the environment; MLFLOW_ALLOW_FILE_STORE as the sink leaves it is undone after."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def _series(pairs):
    """(step, value) pairs, sorted, NaN made comparable."""
    return sorted((s, "nan" if math.isnan(v) else v) for s, v in pairs)


def test_an_mlflow_run_reads_back_through_mlflows_client_with_the_values_of_metrics_jsonl(tmp_path, model_dir,
                                                                                          mlflow_env):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path, model_dir, ['logging.sinks=["jsonl", "mlflow"]'])
    lines: list[str] = []
    assert train(run_dir, log=lines.append)["status"] == "succeeded"
    assert not [ln for ln in lines if "WARNING" in ln], lines

    client = MlflowClient(tracking_uri=(tmp_path / "runs" / "mlruns").as_uri())  # the default: <log_dir>/mlruns
    [run] = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.tags["vapo.run_id"] == "run" and {"vapo", "reasoning", "rl"} <= set(run.data.tags)
    config = json.loads((run_dir / "config.json").read_text())
    assert run.data.params["training.total_steps"] == "3" and run.data.params["logging.sinks"] == '["jsonl", "mlflow"]'
    assert run.data.params["model.local_path"] == config["model"]["local_path"]

    expected: dict[str, list] = {}
    for rec in read_metrics(run_dir / "metrics.jsonl"):
        for name, value in metric_items(rec):
            expected.setdefault(name, []).append((rec["step"], value))
    assert "rollout/reward_mean" in expected and "eval/greedy_accuracy" in expected
    assert set(run.data.metrics) == set(expected)  # the same names, "/" and all
    for name, pairs in expected.items():
        got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
        assert _series(got) == _series(pairs), name
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"report.png", "summary.json"}


def test_without_the_mlflow_package_a_warning_and_the_run_succeeds(tmp_path, model_dir, monkeypatch, mlflow_env):
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")] + ["mlflow"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import mlflow` raises ImportError, as when not installed
    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path, model_dir, ['logging.sinks=["jsonl", "console", "mlflow"]'])
    lines: list[str] = []
    assert train(run_dir, log=lines.append)["status"] == "succeeded"
    [warning] = [ln for ln in lines if "WARNING" in ln]
    assert warning.startswith("WARNING: metric sink 'mlflow' disabled: the mlflow package is not installed")
    assert "pip install 'vapo-mcp[mlflow]'" in warning and "the run goes on" in warning
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3]
    assert not (tmp_path / "runs" / "mlruns").exists()


def test_an_unreachable_tracker_is_a_warning_and_the_run_goes_on(tmp_path, model_dir, monkeypatch, mlflow_env):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once instead of backing off for minutes
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path, model_dir, ['logging.sinks=["jsonl", "mlflow"]'])
    lines: list[str] = []
    assert train(run_dir, stop_after=1, log=lines.append)["status"] == "interrupted"
    [warning] = [ln for ln in lines if "WARNING" in ln]
    assert warning.startswith("WARNING: metric sink 'mlflow' disabled: cannot open the tracker") and "the run goes on" in warning
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"] == [1]


def test_a_tracking_uri_with_credentials_is_refused_with_the_fix():
    from tests.conftest import ROOT
    from vapo_engine.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="logging.mlflow_tracking_uri") as e:
        load_config(ROOT / "config.toml", ['logging.mlflow_tracking_uri="https://me:pw@mlflow.example/"'])
    assert "MLFLOW_TRACKING_PASSWORD" in str(e.value)
    cfg = load_config(ROOT / "config.toml", ['logging.mlflow_tracking_uri="http://127.0.0.1:5000"'])
    assert cfg.logging.mlflow_tracking_uri == "http://127.0.0.1:5000"


def test_a_wandb_run_is_written_offline_under_the_run_directory(tmp_path, model_dir, monkeypatch):
    pytest.importorskip("wandb")  # not in the dev extra: pip install -e '.[wandb]' to run this test
    for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path, model_dir, ['logging.sinks=["jsonl", "wandb"]'])
    lines: list[str] = []
    assert train(run_dir, log=lines.append)["status"] == "succeeded"
    assert not [ln for ln in lines if "WARNING" in ln], lines
    [offline] = (run_dir / "wandb").glob("offline-run-*-run")  # offline, id = the run id
    log = (offline / "run-run.wandb").read_bytes()  # W&B's own record log (`wandb sync` uploads it)
    names = {name for rec in read_metrics(run_dir / "metrics.jsonl") for name, _ in metric_items(rec)}
    assert {"rollout/reward_mean", "eval/greedy_accuracy", "critic/pretrain_value_loss"} <= names
    missing = [n for n in sorted(names) if n.encode() not in log]
    assert not missing, missing  # every metric under its catalogue name (W&B keeps no readable copy offline)
    assert all(s in log for s in (b"report.png", b"summary.json", b"reasoning", b"total_steps"))
