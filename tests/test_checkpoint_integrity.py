"""Checkpoints load without executing code, and a damaged newest checkpoint falls back to the previous one
(docs/design.md §5.6)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.engine_helpers import make_run
from vapo_engine.metrics import read_metrics
from vapo_engine.rundir import RunDir, verify_checkpoint

OVER = ["training.total_steps=4", "eval.save_interval=2", "eval.eval_interval=100"]


class _Planted:
    """Unpickling this runs `touch <marker>`: what an attacker would plant in a checkpoint (trainer_state.pt)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory, model_dir):
    """A finished 4-step run with complete checkpoints at steps 2 and 4, trained once for this file."""
    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path_factory.mktemp("trained"), model_dir, OVER)
    train(run_dir, log=lambda m: None)
    assert [p.name for p in RunDir(run_dir).checkpoint_dirs()] == ["step-0000002", "step-0000004"]
    return run_dir


@pytest.fixture
def trained(tmp_path, trained_once):
    """A copy of `trained_once` (same layout under tmp_path) for one test to damage."""
    root = trained_once.parents[2]  # make_run's folder: <root>/runs/<experiment>/<run id>
    shutil.copytree(root / "runs", tmp_path / "runs")
    return tmp_path / trained_once.relative_to(root)


def _resume(run_dir, total: int = 6) -> subprocess.CompletedProcess:
    """Raise the step budget and resume with the real worker entry point."""
    import json
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["training"]["total_steps"] = total
    (run_dir / "config.json").write_text(json.dumps(cfg))
    return subprocess.run(check=False, args=[sys.executable, "-m", "vapo_engine.trainer", str(run_dir), "--resume"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_every_checkpoint_file_is_in_the_manifest_and_state_is_not_a_pickle(trained):
    ckpt = RunDir(trained).checkpoint(4)
    assert verify_checkpoint(ckpt) is None
    assert not (ckpt / "trainer_state.pt").exists()
    assert {"trainer_state.json", "trainer_state.safetensors"} <= {p.name for p in ckpt.iterdir()}
    for p in ckpt.rglob("*"):  # no torch.save zip (a pickle inside) and no pickle-format file at all
        if p.is_file():
            assert p.read_bytes()[:4] != b"PK\x03\x04" and p.suffix not in (".pt", ".bin", ".pkl"), p


def test_planted_pickle_is_never_executed(trained, tmp_path):
    from vapo_engine.rundir import write_manifest
    marker = tmp_path / "pwned"
    newest, older = RunDir(trained).checkpoint(4), RunDir(trained).checkpoint(2)
    # 1) a pickle dropped next to the safe files is ignored
    torch.save({"opt_actor": _Planted(marker)}, older / "trainer_state.pt")
    write_manifest(older, 2)
    # 2) step 4's only trainer state is the planted pickle, its manifest re-signed (as an attacker with write
    #    access would): the checkpoint verifies, but there is no trainer state to load, so it is skipped
    for name in ("trainer_state.json", "trainer_state.safetensors"):
        (newest / name).unlink()
    torch.save({"step": 4, "opt_actor": _Planted(marker)}, newest / "trainer_state.pt")
    write_manifest(newest, 4)
    assert verify_checkpoint(newest) is None and verify_checkpoint(older) is None
    r = _resume(trained)
    assert not marker.exists(), "unpickling the planted trainer_state.pt ran code"
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("skipped damaged checkpoint(s): step-0000004 (cannot be loaded: StateFormatError: "
            "trainer_state.json is missing); resumed from step-0000002 instead") in r.stdout
    assert "Traceback" not in r.stderr


def test_load_state_never_unpickles(tmp_path, monkeypatch):
    """The state loader reads JSON and safetensors only: with nothing but a pickle there it refuses, and no
    unpickler (torch.load, pickle) is ever called."""
    import pickle

    from vapo_engine.trainer.state_io import StateFormatError, load_state, save_state
    torch.save({"opt_actor": _Planted(tmp_path / "pwned")}, tmp_path / "trainer_state.pt")

    def refuse(*a, **kw):
        raise AssertionError("an unpickler was called")
    for obj, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(obj, name, refuse)
    with pytest.raises(StateFormatError, match="trainer_state.json is missing"):
        load_state(tmp_path)
    save_state({"step": 3, "w": torch.ones(2), "pair": (1, 2)}, tmp_path)
    st = load_state(tmp_path)
    assert st["step"] == 3 and st["pair"] == (1, 2) and torch.equal(st["w"], torch.ones(2))
    assert not (tmp_path / "pwned").exists()


def test_damaged_newest_checkpoint_resumes_from_the_previous_one(trained):
    weights = RunDir(trained).checkpoint(4) / "policy" / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:  # truncated, DONE still present (a crash mid-copy, a full disk)
        f.truncate(size // 2)
    r = _resume(trained, total=6)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f"skipped damaged checkpoint(s): step-0000004 (policy/model.safetensors has {size // 2} bytes, "
            f"{size} were written); resumed from step-0000002 instead") in r.stdout
    steps = [x["step"] for x in read_metrics(trained / "metrics.jsonl") if x["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 3, 4, 5, 6]  # steps 3-4 redone from step 2, then onwards
    assert verify_checkpoint(RunDir(trained).checkpoint(6)) is None


def test_all_checkpoints_damaged_is_a_clear_error_naming_each(trained):
    for step in (2, 4):
        (RunDir(trained).checkpoint(step) / "value" / "model.safetensors").unlink()
    r = _resume(trained)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no usable checkpoint" in r.stderr and "step-0000004 (value/model.safetensors is missing)" in r.stderr
    assert "step-0000002 (value/model.safetensors is missing)" in r.stderr and "start the run again" in r.stderr


def test_run_manager_resume_names_the_damaged_checkpoint(trained):
    from vapo_engine.jobs import RunError, RunManager, State
    mgr = RunManager(trained.parent.parent / "mgr")
    mgr.registry.add("r", "exp", [], trained)
    mgr.registry.claim_queued(1)
    mgr.registry.transition("r", State.FAILED, "test")
    (RunDir(trained).checkpoint(4) / "trainer_state.safetensors").write_bytes(b"garbage")
    (RunDir(trained).checkpoint(2) / "DONE").unlink()
    with pytest.raises(RunError, match=r"no complete checkpoint.*step-0000004: trainer_state.safetensors has 7 "
                                       r"bytes.*start_training again"):
        mgr.resume("r")


def test_garbage_manifests_and_headers_are_reported_never_raised(tmp_path):
    import json
    folder = tmp_path / "step-0000001"
    (folder / "policy").mkdir(parents=True)
    for manifest in ({"files": {"a": 5}}, {"files": {"../../etc/passwd": {"size": 1}}}, {"files": []}):
        (folder / "DONE").write_text(json.dumps(manifest))
        assert verify_checkpoint(folder)  # a reason, not an exception
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": "x"}}).encode()
    (folder / "policy" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (folder / "policy" / "config.json").write_text("{}")
    (folder / "trainer_state.json").write_text("{}")
    (folder / "DONE").write_text("1")  # no manifest (an old-format marker): refused
    assert verify_checkpoint(folder) == "the DONE manifest is damaged (no file table)"
    (folder / "DONE").write_text(json.dumps({"step": 1, "files": {}}))
    assert "unreadable" in verify_checkpoint(folder)


def test_a_missing_data_file_on_resume_is_not_blamed_on_the_checkpoints(trained, tmp_path):
    import json
    data = tmp_path / "set.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    cfg = json.loads((trained / "config.json").read_text())
    cfg["eval"]["benchmark"] = str(data)
    (trained / "config.json").write_text(json.dumps(cfg))
    data.unlink()  # the data moved away after the run started
    r = _resume(trained)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(data) in r.stderr and "checkpoint" not in r.stderr
