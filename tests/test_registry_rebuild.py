"""The registry is an index over the run directories (docs/design.md §5.5): rebuilt when deleted or damaged;
OS and SQLite failures are messages with a fix (a ToolError over MCP, exit 2 in the CLI)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, write_workspace
from vapo_engine.config import load_config, load_settings
from vapo_engine.errors import StorageError
from vapo_engine.jobs import Registry, RunManager, State
from vapo_engine.jobs.registry import DB_NAME
from vapo_engine.runs import create_run


def _runs(root: Path) -> dict[str, Path]:
    """Three finished runs and a resumed attempt, recorded through the registry (no training needed)."""
    cfg, settings = load_config(ROOT / "config.toml"), load_settings(ROOT / "settings.json")
    reg = Registry(root)
    dirs = {}
    for rid, end, msg in (("a", State.SUCCEEDED, "finished 3 steps"), ("b", State.FAILED, "worker crashed"),
                          ("c", State.STOPPED, "stopped on request")):
        dirs[rid] = create_run(cfg, settings, root, run_id=rid).run_dir
        reg.add(rid, "exp", ["t", rid], dirs[rid], group_id="g" if rid != "c" else None, variant="vapo")
        assert [r.run_id for r in reg.claim_queued(1)] == [rid]
        assert reg.transition(rid, end, msg, exit_code=0)
    reg.add("b-r1", "exp", ["t"], dirs["b"], resumed_from="b", resume=True)
    return dirs


def _snapshot(reg: Registry) -> dict:
    return {r.run_id: (r.state, r.message, r.tags, r.resumed_from, r.group_id, r.variant, str(r.run_dir))
            for r in reg.list(limit=100)}


def test_deleted_registry_is_rebuilt_from_the_run_directories(tmp_path):
    _runs(tmp_path)
    before = _snapshot(Registry(tmp_path))
    assert len(before) == 4
    for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    assert _snapshot(Registry(tmp_path)) == before  # a new server: every run is visible again
    live = Registry(tmp_path)
    (tmp_path / DB_NAME).unlink()  # deleted while a manager is using it
    assert _snapshot(live) == before
    mgr = RunManager(tmp_path)
    assert mgr.get("b").state is State.FAILED and mgr.get("b-r1").resumed_from == "b"


def test_damaged_registry_is_moved_aside_and_rebuilt(tmp_path):
    _runs(tmp_path)
    before = _snapshot(Registry(tmp_path))
    for name in (DB_NAME + "-wal", DB_NAME + "-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / DB_NAME).write_bytes(b"this is not a database" * 100)
    assert _snapshot(Registry(tmp_path)) == before
    assert len(list(tmp_path.glob(DB_NAME + ".damaged-*"))) == 1


def test_run_directory_without_a_state_record_is_derived_from_its_files(tmp_path):
    cfg, settings = load_config(ROOT / "config.toml"), load_settings(ROOT / "settings.json")
    done = create_run(cfg, settings, tmp_path, run_id="old-done").run_dir
    (done / "summary.json").write_text(json.dumps({"status": "succeeded", "steps": 7, "seconds": 1.0}))
    create_run(cfg, settings, tmp_path, run_id="old-dead")
    reg = Registry(tmp_path)
    a, b = reg.get("old-done"), reg.get("old-dead")
    assert a.state is State.SUCCEEDED and "finished 7 steps" in a.message and "rebuilt" in a.message
    assert b.state is State.FAILED and "no checkpoint was written yet; start_training again" in b.message


def test_unusable_log_dir_and_registry_are_clear_errors(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match=r"cannot create the runs folder .*a-file/logs .*runtime.log_dir"):
        Registry(blocker / "logs")
    (tmp_path / "reg").mkdir()
    (tmp_path / "reg" / DB_NAME).mkdir()  # something that is not a database file and cannot be replaced
    with pytest.raises(StorageError, match=r"run registry .*runs.sqlite3 cannot be used .*runtime.log_dir"):
        Registry(tmp_path / "reg")


def test_unwritable_log_dir_over_mcp_and_cli(tmp_path, capsys, monkeypatch):
    """The same StorageError reaches an MCP client as a ToolError with the fix and the CLI as exit 2."""
    import anyio
    from mcp import Client

    from server.app import build_server
    from server.cli import main
    config, settings = write_workspace(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    s = json.loads(settings.read_text())
    s["runtime"]["log_dir"] = str(blocker / "logs")
    settings.write_text(json.dumps(s))
    cli = ["--config", str(config), "--settings", str(settings)]
    assert main(["runs", "list", *cli]) == 2
    err = capsys.readouterr().err
    assert "cannot create the runs folder" in err and "runtime.log_dir" in err and "Traceback" not in err
    monkeypatch.setenv("VAPO_MCP_CONFIG", str(config))
    monkeypatch.setenv("VAPO_MCP_SETTINGS", str(settings))

    async def call():
        async with Client(build_server()) as c:
            return await c.call_tool("list_runs", {})
    res = anyio.run(call)
    text = res.content[0].text
    assert res.is_error and "cannot create the runs folder" in text and "runtime.log_dir" in text
