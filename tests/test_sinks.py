"""Metric sinks (vapo_engine/sinks): one interface, chosen by config.toml's `logging.sinks`; a sink registered
from outside the trainer receives every record of a real run; the default sinks write what runs always wrote."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from typing import ClassVar

import pytest

from tests.conftest import ROOT
from tests.engine_helpers import make_run
from vapo_engine.metrics import read_metrics
from vapo_engine.sinks import SINKS, NullLogger, UnknownSinkError, open_sinks, register_sink
from vapo_engine.sinks.console import format_record


class MemorySink:
    """A sink a user could write: keeps what it is given."""
    opened: ClassVar[list[MemorySink]] = []

    def __init__(self, ctx):
        self.ctx, self.records, self.closed = ctx, [], 0
        MemorySink.opened.append(self)

    def write(self, record: dict) -> None:
        self.records.append(json.loads(json.dumps(record)))

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def memory_sink():
    MemorySink.opened.clear()
    register_sink("memory", MemorySink)
    yield MemorySink
    SINKS.pop("memory", None)


def _config(tmp_path, model_dir, extra=()):
    from vapo_engine.runs import load_run
    run_dir = make_run(tmp_path, model_dir, list(extra))
    return run_dir, load_run(run_dir)[1]


def test_a_sink_registered_outside_the_trainer_receives_every_record_of_a_run(tmp_path, model_dir, memory_sink):
    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path, model_dir, ['logging.sinks=["jsonl", "memory"]'])
    assert train(run_dir, stop_after=2, log=lambda m: None)["status"] == "interrupted"
    [sink] = memory_sink.opened
    written = read_metrics(run_dir / "metrics.jsonl")
    assert sink.records == written and sink.closed == 1
    assert [r["step"] for r in written if r["kind"] == "train"] == [1, 2]
    assert {"pretrain", "train", "eval"} <= {r["kind"] for r in written}
    assert sink.ctx.run_dir.path == run_dir and sink.ctx.config.logging.sinks == ["jsonl", "memory"]
    assert not (run_dir / "tb").exists()  # tensorboard was not named


def test_the_default_sinks_write_metrics_jsonl_tensorboard_and_a_progress_line(tmp_path, model_dir):
    run_dir, cfg = _config(tmp_path, model_dir)
    assert cfg.logging.sinks == ["jsonl", "tensorboard", "console"]
    lines: list[str] = []
    logger = open_sinks(run_dir, cfg, log=lines.append)
    rec = logger.log(3, "train", {"rollout/reward_mean": 0.5, "critic/explained_var": float("nan")})
    logger.close()
    assert rec["step"] == 3 and rec["kind"] == "train" and isinstance(rec["time"], float)
    assert rec["rollout/reward_mean"] == 0.5 and rec["critic/explained_var"] == "nan"
    text = (run_dir / "metrics.jsonl").read_text()
    assert text == json.dumps(rec) + "\n"  # one JSON line per record, the record as returned
    assert lines == [format_record(rec, cfg.training.total_steps)] and lines[0].startswith("train  step     3/3:")
    pytest.importorskip("tensorboard")
    assert any((run_dir / "tb").iterdir())


def test_names_outside_the_catalogue_are_refused(tmp_path, model_dir):
    run_dir, cfg = _config(tmp_path, model_dir)
    logger = open_sinks(run_dir, cfg, log=lambda m: None)
    with pytest.raises(KeyError, match="not in vapo_engine.metrics.CATALOGUE"):
        logger.log(1, "train", {"rollout/made_up": 1.0})
    logger.close()
    assert read_metrics(run_dir / "metrics.jsonl") == []


def test_ranks_that_do_not_write_get_a_null_logger(tmp_path, model_dir, memory_sink):
    run_dir, cfg = _config(tmp_path, model_dir, ['logging.sinks=["jsonl", "memory"]'])
    logger = open_sinks(run_dir, cfg, write=False)
    assert isinstance(logger, NullLogger) and logger.log(1, "eval", {"x": 1.0}) == {"step": 1, "kind": "eval", "x": 1.0}
    assert memory_sink.opened == [] and not (run_dir / "metrics.jsonl").exists()


def test_an_unknown_sink_is_refused_with_the_known_names(tmp_path, model_dir, project, clean_env):
    run_dir, cfg = _config(tmp_path, model_dir, ['logging.sinks=["jsonl", "wandb_typo"]'])
    for write in (True, False):  # every rank refuses alike
        with pytest.raises(UnknownSinkError, match="'wandb_typo'; known metric sinks: console, jsonl, mlflow, tensorboard, wandb"):
            open_sinks(run_dir, cfg, write=write)
    assert not (run_dir / "metrics.jsonl").exists()  # nothing opened
    from tools.paths import Files
    from tools.training import prepare_config
    f = Files(project / "config.toml", project / "settings.json")
    with pytest.raises(UnknownSinkError, match="known metric sinks: console, jsonl, mlflow, tensorboard, wandb"):
        prepare_config(f, None, ['logging.sinks=["jsonl","wandb_typo"]'])


def test_the_config_keeps_metrics_jsonl_and_each_name_once():
    from vapo_engine.config import ConfigError, load_config
    for sinks, why in (('["console"]', 'keep "jsonl"'), ('["jsonl", "jsonl"]', "named twice"),
                       ('["Jsonl!"]', "should match pattern")):
        with pytest.raises(ConfigError, match="logging.sinks") as e:
            load_config(ROOT / "config.toml", [f"logging.sinks={sinks}"])
        assert why in str(e.value)
    cfg = load_config(ROOT / "config.toml", ['logging.sinks=["jsonl","console"]'])
    assert cfg.logging.sinks == ["jsonl", "console"]


def test_register_sink_refuses_a_bad_or_taken_name():
    with pytest.raises(ValueError, match="must match"):
        register_sink("Bad Name", MemorySink)
    with pytest.raises(ValueError, match="already registered"):
        register_sink("jsonl", MemorySink)


def test_a_failing_sink_does_not_keep_the_others_open(tmp_path, model_dir, memory_sink):
    def broken(ctx):
        raise OSError("disk gone")
    register_sink("broken", broken)
    try:
        run_dir, cfg = _config(tmp_path, model_dir, ['logging.sinks=["jsonl", "memory", "broken"]'])
        with pytest.raises(OSError, match="disk gone"):
            open_sinks(run_dir, cfg)
        assert [s.closed for s in memory_sink.opened] == [1]
    finally:
        SINKS.pop("broken", None)


def test_tensorboard_is_imported_in_one_file():
    hits = []
    for folder in ("vapo_engine", "tools", "server", "bench", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or "", *(a.name for a in node.names)] \
                    if isinstance(node, ast.ImportFrom) and not node.level else []  # not the project's own module
                if any("tensorboard" in n.split(".") or n == "SummaryWriter" for n in names):
                    hits.append(str(path.relative_to(ROOT)))
    assert hits == ["vapo_engine/sinks/tensorboard.py"]


def test_the_worker_prints_one_progress_line_per_record(tmp_path, model_dir):
    run_dir = make_run(tmp_path, model_dir, ["training.total_steps=2"])
    out = subprocess.run([sys.executable, "-m", "vapo_engine.trainer", str(run_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = read_metrics(run_dir / "metrics.jsonl")
    lines = out.stdout.splitlines()
    progress = [ln for ln in lines if ln.startswith(("train  step", "eval   step", "value-pretrain"))]
    assert progress == [format_record(r, 2) for r in recs]
    assert lines[-1] == "done: succeeded after 2 steps"


def test_the_eval_line_shows_the_critics_held_out_ev_when_measured():
    rec = {"step": 10, "kind": "eval", "eval/greedy_accuracy": 0.6, "eval/sampled_accuracy": 0.55,
           "eval/response_length": 64.0}
    assert "critic" not in format_record(rec)  # the start evaluation (untrained critic) and critic-free runs
    line = format_record(rec | {"eval/critic_ev": 0.8123, "eval/critic_ev_start": 0.7})
    assert line.endswith("critic held-out ev +0.81 (at the prompt +0.70)")


def test_the_train_line_says_undefined_where_the_critics_ev_is():
    rec = {"step": 14, "kind": "train", "rollout/reward_mean": 0.0}  # every return 0: no variance to explain
    assert " ev undefined " in format_record(rec, 24) and "nan" not in format_record(rec, 24)
    assert " ev +0.08 (within -0.17) " in format_record(rec | {"critic/explained_var": 0.081,
                                                                 "critic/explained_var_within_prompt": -0.17}, 24)
