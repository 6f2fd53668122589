"""What a run directory freezes: paths that mean the same from any working directory, and no trace of the
resolved key in any snapshot, whatever the key's shape."""
from __future__ import annotations

import json
import uuid

from tests.conftest import ROOT
from vapo_engine.config import Secret, load_config, load_settings
from vapo_engine.config.path_fields import freeze_paths
from vapo_engine.jobs import RunManager
from vapo_engine.metrics import read_metrics
from vapo_engine.runs import create_run, load_run


def test_relative_jsonl_task_paths_are_frozen_absolute(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    (tmp_path / "here.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(ROOT / "config.toml", ['data.train="here.jsonl"', 'eval.benchmark="mine.jsonl"',
                                             f'data.data_dir="{tmp_path / "data"}"'])
    frozen = freeze_paths(cfg, tmp_path)
    assert frozen.data.train == str(tmp_path / "here.jsonl")  # the working directory first, as get_task does
    assert frozen.eval.benchmark == str(tmp_path / "data" / "mine.jsonl")  # then the data dir


def test_a_key_of_any_shape_never_reaches_a_snapshot(tmp_path):
    key = str(uuid.uuid4())  # no prefix, hyphenated: no pattern recognises it, only its value can
    cfg = load_config(ROOT / "config.toml", [f'model.name="{key}"'])
    settings = load_settings(ROOT / "settings.json")
    exp = settings.experiment.model_copy(update={"tags": ["rl", key]})
    settings = settings.model_copy(update={"experiment": exp})
    info = create_run(cfg, settings, tmp_path, overrides=[f'model.name="{key}"'], secrets=[Secret(key)])
    RunManager(tmp_path)  # indexes the run directory into a fresh registry
    for path in [*info.run_dir.rglob("*"), *tmp_path.glob("runs.sqlite3*")]:
        if path.is_file():
            assert key not in path.read_bytes().decode("utf-8", "replace"), path
    assert key not in json.dumps(list(info.tags))


def test_damaged_metrics_lines_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "kind": "train"}\n\xff\xfe{bad}\n{"kind": "train"}\n{"step": 2, "kind": "eval"}\n')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_a_named_builtin_model_survives_the_snapshot(tmp_path):
    """`builtin:chain@planted-stop` has the shape of `user:password@host`; it is a built-in model's name, and the
    worker must read it back as written (the scrubber once turned it into `builtin:***@planted-stop`)."""
    for name in ("builtin:chain@planted-stop", "builtin:chain@v1"):
        cfg = load_config(ROOT / "config.toml", [f'model.builtin="{name}"'])
        info = create_run(cfg, load_settings(ROOT / "settings.json"), tmp_path / name.replace(":", "_"))
        _, frozen = load_run(info.run_dir)
        assert frozen.model.builtin == name
