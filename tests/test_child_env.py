"""Processes vapo-mcp starts do not inherit the HTTP server's bearer token (vapo_engine/childenv.py): a run's
supervisor and trainer worker lack `VAPO_MCP_TOKEN`, read from the real processes' /proc/<pid>/environ; a run
whose rollout replicas take that token (rollout.backend = server, token_env = VAPO_MCP_TOKEN) keeps it."""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.conftest import ROOT
from vapo_engine.childenv import child_env, run_needs
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs.manager import supervisor_env
from vapo_engine.jobs.threads import worker_env
from vapo_engine.runs import create_run

TOKEN = "tok-Q9w8E7r6T5y4U3i2O1p0"
SERVER_ROLLOUT = ["rollout.backend=server", 'rollout.urls=["http://127.0.0.1:9"]']


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        pairs = [p.split(b"=", 1) for p in fh.read().split(b"\0") if b"=" in p]
    return {k.decode(): v.decode() for k, v in pairs}


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def _worker_env(sup: int) -> dict[str, str] | None:
    """The environment of the supervisor's trainer worker once it has exec'd (before that, /proc shows the
    supervisor's own environment), or None while there is none yet; a worker gone meanwhile counts as none."""
    for kid in _children(sup):
        try:
            with open(f"/proc/{kid}/cmdline", "rb") as fh:
                if b"vapo_engine.trainer" in fh.read():
                    return _environ(kid)
        except OSError:
            continue
    return None


def _started_envs(tmp_path, overrides: list[str]) -> tuple[dict, dict]:
    """Start a real run (supervisor + worker) and read both processes' environments, then kill them. The worker
    is read only after its exec and may exit at any moment (SERVER_ROLLOUT's replica refuses connections)."""
    from vapo_engine.jobs import RunManager
    root = tmp_path / "logs"
    cfg = load_config(ROOT / "config.toml", ["training.total_steps=3", *overrides])
    mgr = RunManager(root)
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), root, run_id="q").run_dir
    mgr.registry.add("q", "exp", [], run_dir)
    mgr.tick()
    sup = mgr.get("q").pid
    try:
        sup_env = _environ(sup)
        deadline = time.time() + 30
        while (worker := _worker_env(sup)) is None and time.time() < deadline:
            time.sleep(0.02)
        assert worker is not None, "the supervisor started no trainer worker within 30 s"
        return sup_env, worker
    finally:
        for pid, kill in [*((kid, os.killpg) for kid in _children(sup)), (sup, os.kill)]:
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc/<pid>/environ")
def test_a_started_run_does_not_inherit_the_server_token(tmp_path, monkeypatch):
    monkeypatch.setenv("VAPO_MCP_TOKEN", TOKEN)
    sup, worker = _started_envs(tmp_path, [])
    assert "VAPO_MCP_TOKEN" not in sup and "VAPO_MCP_TOKEN" not in worker
    assert TOKEN not in repr(sup) + repr(worker)
    assert worker["PYTHONUNBUFFERED"] == "1" and "PATH" in worker  # the rest of the environment is kept


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads /proc/<pid>/environ")
def test_a_run_whose_replicas_take_the_token_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setenv("VAPO_MCP_TOKEN", TOKEN)
    sup, worker = _started_envs(tmp_path, SERVER_ROLLOUT)
    assert sup["VAPO_MCP_TOKEN"] == TOKEN and worker["VAPO_MCP_TOKEN"] == TOKEN


def test_the_env_builders():
    base = {"PATH": "/usr/bin", "VAPO_MCP_TOKEN": TOKEN, "OTHER_KEY": "x"}
    assert child_env(base) == {"PATH": "/usr/bin", "OTHER_KEY": "x"}
    assert "VAPO_MCP_TOKEN" not in worker_env(base=base)
    assert worker_env(base=base, keep=("VAPO_MCP_TOKEN",))["VAPO_MCP_TOKEN"] == TOKEN
    assert run_needs({}) == () and run_needs({"rollout": {"backend": "hf"}}) == ()
    assert run_needs({"rollout": {"backend": "server"}}) == ("VAPO_MCP_TOKEN",)
    assert run_needs({"rollout": {"backend": "vllm", "token_env": "REPLICA_TOKEN"}}) == ()
    assert run_needs({"rollout": "garbage"}) == ()


def test_supervisor_env_reads_the_runs_config(tmp_path):
    base = {"PATH": "/usr/bin", "VAPO_MCP_TOKEN": TOKEN}
    assert supervisor_env(tmp_path / "missing", base) == {"PATH": "/usr/bin", "PYTHONUNBUFFERED": "1"}
