"""Run-directory files are data (docs/security.md): a symlink or FIFO planted where a run file goes is never
written through nor read (vapo_engine/datafiles.py). Appends (metrics.jsonl, worker.log, runner.log,
provider_cache.jsonl), JSON written atomically (through a random temporary name), the report plot, and what the
tools and resources read (run_status, report_metrics, vapo://runs/… including the plot) — and a run folder that
is itself a symlink is refused by the run tools."""
from __future__ import annotations

import base64
import json
import os
import threading
import time

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.conftest import ROOT
from tests.mcp_helpers import slot_held, text
from vapo_engine import datafiles
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs import Registry, State
from vapo_engine.rundir import RunDir, write_json_atomic
from vapo_engine.runs import create_run

PNG = b"\x89PNG\r\n\x1a\n"
RECORDS = [{"step": s, "kind": "train", "time": 1.0, "rollout/reward_mean": s / 10, "rollout/response_length": 5.0}
           for s in (1, 2, 3)] + [{"step": 3, "kind": "eval", "time": 2.0, "eval/greedy_accuracy": 0.5}]


@pytest.fixture
def victim(tmp_path):
    """A file outside the run that a planted link points at (what an attacker wants read or overwritten)."""
    p = tmp_path / "victim.txt"
    p.write_text("VICTIM-CONTENT sk-proj-Q9w8E7r6T5y4U3i2O1p0A9s8D7f6\n")
    return p


def _fifo(path):
    os.mkfifo(path)
    return path


def _within(seconds: float, fn):
    """fn() in a thread; fail (instead of hanging the test run) when it blocks longer than `seconds`."""
    out: dict = {}

    def call():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} blocked (a FIFO was opened)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# --- the helper ---------------------------------------------------------------------------------------------------
def test_appends_never_follow_a_symlink_or_open_a_fifo(tmp_path, victim):
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(victim)
    with pytest.raises(datafiles.NotRegularFile, match="never read or written through links"):
        datafiles.open_append(link)
    assert victim.read_text().startswith("VICTIM-CONTENT")
    dangling = tmp_path / "worker.log"
    dangling.symlink_to(tmp_path / "created-through-link.log")
    with pytest.raises(datafiles.NotRegularFile):
        datafiles.open_append(dangling, binary=True)
    assert not (tmp_path / "created-through-link.log").exists()
    with pytest.raises(datafiles.NotRegularFile):
        _within(5, lambda: datafiles.open_append(_fifo(tmp_path / "fifo.log")))
    with datafiles.open_append(tmp_path / "real.jsonl") as f:  # a regular file (created) is appended to
        f.write("a\n")
    with datafiles.open_append(tmp_path / "real.jsonl") as f:
        f.write("b\n")
    assert (tmp_path / "real.jsonl").read_text() == "a\nb\n"


def test_reads_refuse_symlinks_and_fifos_without_blocking(tmp_path, victim):
    (tmp_path / "link").symlink_to(victim)
    fifo = _fifo(tmp_path / "fifo")
    for p in (tmp_path / "link", fifo, tmp_path):
        with pytest.raises(OSError):
            _within(5, lambda p=p: datafiles.read_bytes(p))
    (tmp_path / "ok").write_bytes(b"hello")
    assert datafiles.read_bytes(tmp_path / "ok") == b"hello" and datafiles.read_text(tmp_path / "ok", 2) == "he"


def test_atomic_json_uses_a_random_temporary_name_and_replaces_a_planted_link(tmp_path, victim):
    target = tmp_path / "config.json"
    # every name the old writer would have used (".<name>.<pid>.tmp") is a link to the victim
    (tmp_path / f".config.json.{os.getpid()}.tmp").symlink_to(victim)
    target.symlink_to(victim)
    write_json_atomic(target, {"ok": 1})
    assert victim.read_text().startswith("VICTIM-CONTENT")
    assert not target.is_symlink() and json.loads(target.read_text()) == {"ok": 1}
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".config.json.{os.getpid()}.tmp", "config.json",
                                                          "victim.txt"]  # no temporary file left behind


# --- run directories: writers ---------------------------------------------------------------------------------------
def _run(root, run_id: str = "r1", records=RECORDS):
    cfg = load_config(ROOT / "config.toml", ["training.total_steps=3"])
    reg = Registry(root)
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), root, run_id=run_id).run_dir
    reg.add(run_id, "exp", ["t"], run_dir)
    reg.claim_queued(1)
    reg.transition(run_id, State.SUCCEEDED, "done for the test")
    if records is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_run_writers_refuse_planted_links(tmp_path, victim):
    from vapo_engine.sinks.base import SinkContext
    from vapo_engine.sinks.jsonl import JsonlSink
    from vapo_engine.trainer.provider_samples import _append_cache, _read_cache
    run_dir = _run(tmp_path / "logs", records=None)
    (run_dir / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(OSError, match="never read or written through links"):
        JsonlSink(SinkContext(RunDir(run_dir), load_config(ROOT / "config.toml"), print))
    (run_dir / "provider_cache.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        _append_cache(run_dir / "provider_cache.jsonl", "k", ["answer"])
    assert _read_cache(run_dir / "provider_cache.jsonl") == {}  # the victim is not read as a cache either
    (run_dir / ".state.lock").unlink(missing_ok=True)
    (run_dir / ".state.lock").symlink_to(tmp_path / "lock-made-through-link")
    with pytest.raises(Exception, match="cannot write"):
        RunDir(run_dir).record_attempt("r1", {"state": "x"})
    assert not (tmp_path / "lock-made-through-link").exists()
    assert victim.read_text() == "VICTIM-CONTENT sk-proj-Q9w8E7r6T5y4U3i2O1p0A9s8D7f6\n"


def test_a_supervisor_does_not_log_through_a_planted_link(tmp_path, victim):
    from vapo_engine.jobs import RunManager
    from vapo_engine.rundir import RUNNER_LOG
    root = tmp_path / "logs"
    cfg = load_config(ROOT / "config.toml", ["training.total_steps=3"])
    mgr = RunManager(root)
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), root, run_id="q").run_dir
    (run_dir / RUNNER_LOG).symlink_to(victim)
    mgr.registry.add("q", "exp", [], run_dir)
    with pytest.raises(Exception, match="cannot write"):
        mgr.tick()
    assert mgr.get("q").state is State.FAILED and victim.read_text().startswith("VICTIM-CONTENT")


# --- run directories: what the tools and resources read -----------------------------------------------------------
@pytest.mark.anyio
async def test_tools_and_resources_read_only_regular_run_files_and_plots_still_work(proj, victim):
    from server.app import build_server
    from tools.paths import files
    from tools.training import views_for
    with slot_held(proj / "logs"):
        from tools import training
        rid = training.start_training(files(), preset="cpu-demo").run.run_id
        rd = views_for(files()).get(rid).rundir
        (rd.file("metrics.jsonl")).write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
        async with Client(build_server()) as c:
            # plots work on an ordinary run: the resource (in memory) and report_metrics (report.png + image)
            png = (await c.read_resource(f"vapo://runs/{rid}/plot.png")).contents[0]
            assert png.mime_type == "image/png" and base64.b64decode(png.blob)[:8] == PNG
            res = await c.call_tool("report_metrics", {"run_id": rid})
            assert not res.is_error and any(getattr(x, "mime_type", None) == "image/png" for x in res.content)
            assert rd.file("report.png").read_bytes()[:8] == PNG and not rd.file("report.png").is_symlink()
            # report.png planted as a link: replaced, never written through; the image still comes back
            rd.file("report.png").unlink()
            rd.file("report.png").symlink_to(victim)
            res = await c.call_tool("report_metrics", {"run_id": rid})
            assert not res.is_error and any(getattr(x, "mime_type", None) == "image/png" for x in res.content)
            assert victim.read_text().startswith("VICTIM-CONTENT") and not rd.file("report.png").is_symlink()

            # worker.log a link to the victim, config/settings links: nothing of the victim comes back
            rd.file("worker.log").unlink(missing_ok=True)
            rd.file("worker.log").symlink_to(victim)
            for name in ("config.json", "settings.json"):
                rd.file(name).unlink()
                rd.file(name).symlink_to(victim)
            status = await c.call_tool("run_status", {"run_id": rid, "log_lines": 50})
            assert not status.is_error and "VICTIM" not in text(status), text(status)
            for part in ("", "/log", "/config"):
                contents = (await c.read_resource(f"vapo://runs/{rid}{part}")).contents[0]
                assert "VICTIM" not in (getattr(contents, "text", "") or ""), part

            # metrics.jsonl / worker.log as FIFOs: every read answers at once (no hang), with no metrics
            for name in ("metrics.jsonl", "worker.log"):
                rd.file(name).unlink()
                _fifo(rd.file(name))
            t0 = time.monotonic()
            status = await c.call_tool("run_status", {"run_id": rid})
            assert not status.is_error and status.structured_content["run"]["step"] == 0
            res = await c.call_tool("report_metrics", {"run_id": rid})
            assert not res.is_error and res.structured_content["run"]["step"] == 0
            assert (await c.read_resource(f"vapo://runs/{rid}/log")).contents[0].text == ""
            with pytest.raises(MCPError, match="no metrics yet"):
                await c.read_resource(f"vapo://runs/{rid}/plot.png")
            assert time.monotonic() - t0 < 30


@pytest.mark.anyio
async def test_a_run_folder_that_is_a_symlink_is_refused_by_the_run_tools(proj, tmp_path):
    from server.app import build_server
    from tools.paths import files
    from tools.training import views_for
    with slot_held(proj / "logs"):
        from tools import training
        rid = training.start_training(files(), preset="cpu-demo").run.run_id
        real = views_for(files()).get(rid).rundir.path
        moved = tmp_path / "elsewhere"
        real.rename(moved)
        real.symlink_to(moved, target_is_directory=True)
        async with Client(build_server()) as c:
            for tool, args in (("run_status", {}), ("report_metrics", {}), ("resume_run", {})):
                res = await c.call_tool(tool, {"run_id": rid, **args})
                msg = text(res)
                assert res.is_error and "is a symbolic link" in msg and "run folder" in msg, (tool, msg)
            with pytest.raises(MCPError, match="symbolic link"):
                await c.read_resource(f"vapo://runs/{rid}/log")
            listed = await c.call_tool("list_runs", {})
            assert not listed.is_error and rid in text(listed)


def test_a_supervisor_refuses_a_worker_log_that_is_a_link(tmp_path, victim):
    from vapo_engine.jobs.runner import supervise
    root = tmp_path / "logs"
    cfg = load_config(ROOT / "config.toml", ["training.total_steps=3"])
    reg = Registry(root)
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), root, run_id="w").run_dir
    (run_dir / "worker.log").symlink_to(victim)
    reg.add("w", "exp", [], run_dir)
    reg.claim_queued(1)
    import signal

    from vapo_engine.jobs.manager import FORCE_SIGNAL
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, FORCE_SIGNAL)}
    try:
        assert supervise(root, "w") == 1  # no trainer started
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    rec = reg.get("w")
    assert rec.state is State.FAILED and "cannot write" in rec.message and "worker.log" in rec.message
    assert victim.read_text().startswith("VICTIM-CONTENT")


def test_checkpoint_verification_does_not_block_on_a_fifo(tmp_path, model_dir):
    """A FIFO named like a weights file in a checkpoint folder (resume_run and diagnose_error verify checkpoints)
    makes the checkpoint unusable instead of hanging the caller."""
    import shutil

    from vapo_engine.rundir import verify_checkpoint, write_manifest
    ckpt = tmp_path / "step-0000002"
    shutil.copytree(model_dir, ckpt / "policy")
    write_manifest(ckpt, 2)
    assert verify_checkpoint(ckpt) is None
    _fifo(ckpt / "policy" / "extra.safetensors")
    why = _within(10, lambda: verify_checkpoint(ckpt))
    assert why and "extra.safetensors" in why, why


# --- subfolders the trainer writes --------------------------------------------------------------------------------
def _linked_run(tmp_path, sub: str):
    """A run "q" whose `sub` folder is a symlink to a folder outside the run."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "logs"
    reg = Registry(root)
    run_dir = create_run(load_config(ROOT / "config.toml", ["training.total_steps=3"]),
                         load_settings(ROOT / "settings.json"), root, run_id="q").run_dir
    (run_dir / sub).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / sub).symlink_to(outside, target_is_directory=True)
    return root, reg, run_dir, outside


@pytest.mark.parametrize("sub", ["checkpoints", "tb", "rollout_weights", "checkpoints/step-0000002"])
def test_resume_refuses_a_run_whose_written_subfolder_is_a_link(tmp_path, sub):
    from vapo_engine.jobs import RunManager
    from vapo_engine.rundir import LinkedSubfolder
    root, reg, run_dir, _ = _linked_run(tmp_path, sub)
    reg.add("q", "exp", [], run_dir)
    reg.transition("q", State.FAILED, "crashed")
    with pytest.raises(LinkedSubfolder, match="symbolic link") as e:
        RunManager(root).resume("q")
    assert str(run_dir / sub) in str(e.value) and "real folder" in str(e.value)
    assert [r.run_id for r in reg.list()] == ["q"]  # no attempt was queued


def test_the_trainer_refuses_to_start_with_a_linked_checkpoints_folder(tmp_path):
    import subprocess
    import sys
    _, _, run_dir, outside = _linked_run(tmp_path, "checkpoints")
    p = subprocess.run([sys.executable, "-m", "vapo_engine.trainer", str(run_dir)], capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"error: run directory {run_dir}" in p.stderr and str(run_dir / "checkpoints") in p.stderr
    assert "Traceback" not in p.stderr and list(outside.iterdir()) == []
