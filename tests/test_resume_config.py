"""Resuming checks the run's saved config.json the same way on every front end (a run directory is data): the
resume_run tool and `vapo-mcp runs resume` / `vapo-mcp train --resume` refuse a config.json that moves the
rendezvous, the rollout replicas or the metric tracker; only the CLI's --trust-run-config skips that check."""
from __future__ import annotations

import pytest
from mcp import Client

from tests.mcp_helpers import names_a_fix, text
from vapo_engine.config import load_config, load_settings
from vapo_engine.jobs import RunManager, State
from vapo_engine.runs import create_run, runs_root

pytestmark = pytest.mark.anyio
PLANTED = ["distributed.rdzv_endpoint=0.0.0.0:29500", 'logging.mlflow_tracking_uri="http://203.0.113.9:5000"']


def _stopped_run(proj, run_id: str, overrides: list[str]) -> None:
    """A registered, stopped run (no checkpoint) whose config.json was frozen with `overrides`."""
    cfg = load_config(proj / "config.toml", overrides, preset="cpu-demo")
    settings = load_settings(proj / "settings.json")
    mgr = RunManager(runs_root(settings, proj / "settings.json"))
    info = create_run(cfg, settings, mgr.root, run_id=run_id)
    mgr.registry.add(run_id, info.experiment, info.tags, info.run_dir)
    mgr.registry.claim_queued(1)
    mgr.registry.transition(run_id, State.STOPPED, "stopped on request")


def _cli(capsys, *argv) -> tuple[int, str]:
    from server.cli import main
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize("command", [("runs", "resume", "planted"), ("train", "--resume", "planted")])
def test_cli_resume_checks_the_saved_config_unless_trusted(proj, capsys, command):
    _stopped_run(proj, "planted", PLANTED)
    rc, out = _cli(capsys, *command)
    assert rc == 2 and "run planted's config.json" in out and "distributed.rdzv_endpoint" in out, out
    assert "--trust-run-config" in out and "Traceback" not in out and names_a_fix(out)
    rc, out = _cli(capsys, *command, "--trust-run-config")  # the user vouches for it: the check is skipped
    assert rc == 2 and "no complete checkpoint" in out and "config.json" not in out, out


def test_cli_resume_refuses_a_saved_tracker_uri(proj, capsys):
    _stopped_run(proj, "tracked", PLANTED[1:])
    rc, out = _cli(capsys, "runs", "resume", "tracked")
    assert rc == 2 and "logging.mlflow_tracking_uri" in out and "--trust-run-config" in out, out


def test_cli_resume_of_an_ordinary_run_needs_no_flag(proj, capsys):
    _stopped_run(proj, "plain", [])
    rc, out = _cli(capsys, "runs", "resume", "plain")
    assert rc == 2 and "no complete checkpoint" in out and "config.json" not in out, out


async def test_the_resume_tool_refuses_the_same_config_and_has_no_trust_flag(proj):
    from server.app import build_server
    _stopped_run(proj, "planted", PLANTED)
    async with Client(build_server()) as c:
        res = await c.call_tool("resume_run", {"run_id": "planted"})
        msg = text(res)
        assert res.is_error and "run planted's config.json" in msg and "distributed.rdzv_endpoint" in msg, msg
        assert "--trust-run-config" not in msg
        res = await c.call_tool("resume_run", {"run_id": "planted", "trust_run_config": True})
        assert res.is_error and "trust_run_config" in text(res)
