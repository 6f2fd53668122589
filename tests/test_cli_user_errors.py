"""User mistakes at the `vapo-mcp` command line: each is one clear message naming the path, flag or run id and
the fix, exit code 2, no traceback (in-process `main`, like tests/test_channel_cli.py; no run is trained)."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_workspace

from server.cli import main


@pytest.fixture
def ws(tmp_path, clean_env) -> list[str]:
    """--config/--settings of a temp workspace whose runs go to tmp_path/logs."""
    config, settings = write_workspace(tmp_path)
    return ["--config", str(config), "--settings", str(settings)]


def cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _add_run(ws: list[str], run_id: str, state: str = "failed", message: str = "test: never trained") -> None:
    """A registered run that never trained (no metrics, no log): the state a queued or crashed run is in."""
    from vapo_engine.config import load_config, load_settings
    from vapo_engine.jobs import RunManager, State
    from vapo_engine.runs import create_run, runs_root
    config, settings_path = Path(ws[1]), Path(ws[3])
    settings = load_settings(settings_path)
    root = runs_root(settings, settings_path)
    mgr = RunManager(root)
    run_dir = create_run(load_config(config), settings, root, run_id=run_id).run_dir
    mgr.registry.add(run_id, "exp", [], run_dir)
    if State(state) is State.SUCCEEDED:  # only a running run can succeed
        mgr.registry.transition(run_id, State.RUNNING, "training")
    mgr.registry.transition(run_id, State(state), message)


# --- missing files ------------------------------------------------------------------------------------------

def test_a_missing_config_file_is_one_line_naming_it_and_the_fix(capsys, ws, tmp_path):
    missing = tmp_path / "nope.toml"
    code, _, err = cli(capsys, "train", "--config", missing, "--settings", ws[3])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(missing) in err and "file not found" in err and "--config" in err and "config.toml" in err


def test_a_missing_preset_file_names_it_and_the_presets(capsys, ws, tmp_path):
    missing = tmp_path / "mine.toml"
    code, _, err = cli(capsys, "train", *ws, "--preset", missing)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(missing) in err and "preset file not found" in err and "cpu-demo" in err and "--preset" in err


def test_a_folder_as_config_says_so_and_names_the_file_inside(capsys, ws, tmp_path):
    code, out, _ = cli(capsys, "doctor", "--config", tmp_path, "--settings", ws[3])  # a finding, on stdout
    assert code == 2 and "is a folder, not a file" in out and str(tmp_path / "config.toml") in out
    code, _, err = cli(capsys, "train", "--config", tmp_path, "--settings", ws[3])
    assert code == 2 and "is a folder, not a file" in err and len(err.strip().splitlines()) == 1


# --- config check: local paths ------------------------------------------------------------------------------

def test_config_check_reports_each_missing_local_path_with_its_field_and_fix(capsys, ws, tmp_path):
    code, _, err = cli(capsys, "config", "check", *ws, "--set", "model.local_path=Qwen/Qwen2.5-0.5B",
                       "--set", f"model.value_path={tmp_path / 'no-value'}", "--set", f"data.data_dir={tmp_path / 'nd'}",
                       "--set", "data.train=mine", "--set", f"eval.benchmark={tmp_path / 'held.jsonl'}")
    assert code == 2 and "4 error(s)" in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    local, value, train, bench = (next(x for x in lines if key in x) for key in
                                  ("model.local_path", "model.value_path", "data.train", "eval.benchmark"))
    assert "looks like a Hugging Face Hub id" in local and "hf download Qwen/Qwen2.5-0.5B" in local
    assert f"{tmp_path / 'no-value'} does not exist" in value and "Fix:" in value
    assert f"{tmp_path / 'nd' / 'mine.jsonl'} does not exist" in train and "builtin:addition" in train
    assert f"{tmp_path / 'held.jsonl'} does not exist" in bench


def test_config_check_accepts_builtins_registered_benchmarks_and_real_folders(capsys, ws, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code, out, err = cli(capsys, "config", "check", *ws, "--set", f"model.value_path={model}",
                         "--set", f"data.data_dir={tmp_path / 'not-yet'}", "--set", "data.train=builtin:addition",
                         "--set", "eval.benchmark=math500")
    assert code == 0 and "OK: configuration is valid" in out, err
    code, _, err = cli(capsys, "config", "check", *ws, "--set", f"model.local_path={tmp_path}")
    assert code == 2 and f"{tmp_path} is not a Hugging Face model folder (no config.json)" in err


# --- runs, report -------------------------------------------------------------------------------------------

def test_runs_list_with_no_runs_says_so(capsys, ws):
    code, out, _ = cli(capsys, "runs", "list", *ws)
    assert code == 0 and "no runs yet" in out and "vapo-mcp train" in out


def test_runs_list_filters_by_state_and_limits(capsys, ws):
    _add_run(ws, "r-failed", "failed")
    _add_run(ws, "r-stopped", "stopped")
    code, out, _ = cli(capsys, "runs", "list", *ws, "--state", "failed")
    assert code == 0 and "r-failed" in out and "r-stopped" not in out
    code, out, _ = cli(capsys, "runs", "list", *ws, "--state", "running")
    assert code == 0 and "no runs match --state running" in out
    code, out, _ = cli(capsys, "runs", "list", *ws, "--limit", "1")
    assert code == 0 and len(out.strip().splitlines()) == 1
    code, _, err = cli(capsys, "runs", "list", *ws, "--state", "bogus")
    assert code == 2 and "invalid choice" in err
    code, _, err = cli(capsys, "runs", "list", *ws, "--limit", "0")
    assert code == 2 and "out of range" in err


@pytest.mark.parametrize("argv", [["runs", "status"], ["runs", "stop"], ["runs", "resume"], ["report"],
                                  ["train", "--resume"]])
def test_an_unknown_run_id_names_runs_list(capsys, ws, argv):
    code, _, err = cli(capsys, *argv, "no-such-run", *ws)
    assert code == 2 and "unknown run id 'no-such-run'" in err and "vapo-mcp runs list" in err
    assert "list_runs" not in err


def test_report_of_a_run_without_steps_says_so(capsys, ws):
    _add_run(ws, "r-empty")
    code, out, _ = cli(capsys, "report", "r-empty", *ws)
    assert code == 0 and "no training steps yet" in out
    assert "0.000" not in out and "step 0" not in out


@pytest.mark.parametrize("state, commands", [
    ("stopped", ["vapo-mcp runs resume r-x"]),
    ("failed", ["vapo-mcp diagnose --log ", "vapo-mcp runs resume r-x"]),
    ("running", ["vapo-mcp runs status r-x", "vapo-mcp report r-x", "vapo-mcp runs stop r-x"]),
])
def test_runs_status_suggests_cli_commands_not_tool_calls(capsys, ws, state, commands):
    _add_run(ws, "r-x", state)
    code, out, _ = cli(capsys, "runs", "status", "r-x", *ws)
    nxt = next(line for line in out.splitlines() if line.strip().startswith("next:"))
    assert code == 0 and all(c in nxt for c in commands), nxt
    assert not any(t in nxt for t in ("resume_run", "stop_run", "run_status", "report_metrics", "diagnose_error")), nxt


def test_the_run_status_tool_still_suggests_tool_calls(ws):
    from tools import access
    from tools.paths import files
    from tools.training import run_status
    _add_run(ws, "r-y", "stopped")
    with access.applied(access.Policy("stdio")):
        nxt = run_status(files(ws[1], ws[3]), "r-y").next_steps
    assert nxt == ["resume_run('r-y') to continue"]


STOPPED = "stopped on request; resume_run continues from the checkpoint at step 2"
TOOL_CALLS = ("resume_run", "stop_run", "run_status", "list_runs", "report_metrics", "start_training")


def test_runs_status_and_list_show_the_state_message_with_cli_commands(capsys, ws):
    _add_run(ws, "r-s", "stopped", STOPPED)
    code, out, _ = cli(capsys, "runs", "status", "r-s", *ws)
    assert code == 0 and "vapo-mcp runs resume r-s continues from the checkpoint at step 2" in out, out
    code, out, _ = cli(capsys, "runs", "status", "r-s", "--json", *ws)
    assert code == 0 and "vapo-mcp runs resume r-s continues" in out
    code, out, _ = cli(capsys, "runs", "list", *ws)
    assert code == 0 and "vapo-mcp runs resume" in out
    code, out, _ = cli(capsys, "runs", "list", "--json", *ws)
    assert code == 0 and "vapo-mcp runs resume r-s continues" in out
    for t in TOOL_CALLS:
        assert t not in out, out


@pytest.mark.parametrize("state, says", [("stopped", "vapo-mcp runs resume r-f continues it"),
                                         ("succeeded", "vapo-mcp report r-f shows its results")])
def test_runs_stop_on_a_finished_run_names_cli_commands(capsys, ws, state, says):
    _add_run(ws, "r-f", state)
    code, _, err = cli(capsys, "runs", "stop", "r-f", *ws)
    assert code == 2 and f"already {state}, so there is nothing to stop" in err and says in err, err
    assert "vapo-mcp runs list --state running shows the runs that can be stopped" in err
    assert not any(t in err for t in TOOL_CALLS), err


def test_train_resume_without_a_checkpoint_names_vapo_mcp_train(capsys, ws):
    _add_run(ws, "r-nock", "stopped")
    code, _, err = cli(capsys, "train", "--resume", "r-nock", *ws)
    assert code == 2 and "no complete checkpoint" in err and "vapo-mcp train again" in err, err
    assert not any(t in err for t in TOOL_CALLS), err


def test_train_follow_prints_the_end_message_with_cli_commands(capsys, ws, tmp_path):
    """The end of `vapo-mcp train`: the followed run's message (the run manager's, in tool-call words) is
    printed with the vapo-mcp commands, as text and as --json."""
    from server.cli.train_cmd import _follow, finish
    from vapo_engine.config import load_settings
    from vapo_engine.jobs import RunManager
    from vapo_engine.runs import runs_root
    _add_run(ws, "r-end", "stopped", STOPPED)
    mgr = RunManager(runs_root(load_settings(Path(ws[3])), Path(ws[3])))
    rec = _follow(mgr, "r-end", tmp_path / "worker.log", quiet=True)
    for as_json in (False, True):
        assert finish(rec, as_json=as_json) == 0
        out, _ = capsys.readouterr()
        assert "vapo-mcp runs resume r-end continues from the checkpoint at step 2" in out, out
        assert "resume_run" not in out


def test_run_tools_keep_the_tool_call_wording(ws):
    """The same messages as MCP tool results (an agent calls tools): resume_run('ID'), list_runs."""
    from tools import access
    from tools.paths import ToolInputError, files
    from tools.training import list_runs, run_status, stop_run
    from vapo_engine.jobs import RunError
    _add_run(ws, "r-t", "stopped", STOPPED)
    f = files(ws[1], ws[3])
    with access.applied(access.Policy("stdio")):
        assert run_status(f, "r-t").run.message == STOPPED
        assert list_runs(f).runs[0].message == STOPPED
        with pytest.raises(RunError) as stop:
            stop_run(f, "r-t")
        with pytest.raises((RunError, ToolInputError)) as unknown:
            run_status(f, "nope")
    assert "resume_run('r-t') continues it" in str(stop.value) and "list_runs(state='running')" in str(stop.value)
    assert "(list_runs shows all)" in str(unknown.value)


# --- train --resume -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, named", [(["--set", "vapo.alpha=0.5"], "--set"), (["--preset", "cpu-demo"], "--preset"),
                                          (["--tag", "x"], "--tag")])
def test_resume_refuses_set_preset_and_tag(capsys, ws, extra, named):
    _add_run(ws, "r-stopped", "stopped")
    code, _, err = cli(capsys, "train", *ws, "--resume", "r-stopped", *extra)
    assert code == 2 and named in err and "--resume" in err and "keeps the config" in err


# --- Ctrl-C while `train` follows a run ----------------------------------------------------------------------

def _ctrl_c_manager(ws: list[str]):
    """The workspace's real run manager, except that the user presses Ctrl-C whenever the follow loop waits."""
    from vapo_engine.config import load_settings
    from vapo_engine.jobs import RunManager
    from vapo_engine.runs import runs_root

    class CtrlC(RunManager):
        def tick(self):
            raise KeyboardInterrupt

    settings_path = Path(ws[3])
    return CtrlC(runs_root(load_settings(settings_path), settings_path))


def test_ctrl_c_twice_while_following_detaches_cleanly_and_says_how_to_follow_and_stop(capsys, ws, tmp_path):
    """The follow loop of `vapo-mcp train` with a real run manager; the user's Ctrl-C arrives in its wait (where
    a person's keypress lands almost always). The first asks for a graceful stop, the second detaches: no
    error line, and the commands to follow, stop and continue the run."""
    from server.cli.train_cmd import _follow
    _add_run(ws, "r-live", "running")
    mgr = _ctrl_c_manager(ws)
    assert _follow(mgr, "r-live", tmp_path / "worker.log", quiet=False) is None
    out, err = capsys.readouterr()
    assert "error" not in (out + err).lower() and err == ""
    assert "stopping run r-live after a checkpoint" in out and "detached: run r-live goes on in the background" in out
    for command in ("vapo-mcp runs status r-live", "vapo-mcp runs stop r-live --force",
                    "vapo-mcp train --resume r-live"):
        assert command in out


def test_ctrl_c_on_a_queued_run_cancels_it_and_ends_the_follow(capsys, ws, tmp_path):
    from server.cli.train_cmd import _follow
    _add_run(ws, "r-wait", "queued")
    mgr = _ctrl_c_manager(ws)
    rec = _follow(mgr, "r-wait", tmp_path / "worker.log", quiet=False)
    out, _ = capsys.readouterr()
    assert rec is not None and rec.state.value == "stopped" and "Ctrl-C cancels this run" in out


# --- diagnose, data, command groups -------------------------------------------------------------------------

def test_diagnose_code_with_a_missing_path(capsys, ws, tmp_path):
    code, _, err = cli(capsys, "diagnose", "--code", tmp_path / "nope", *ws)
    assert code == 2 and str(tmp_path / "nope") in err and "code path not found" in err


def test_data_dir_that_is_a_file(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv in (["data", "list"], ["data", "fetch", "math500"]):
        code, _, err = cli(capsys, *argv, "--data-dir", afile)
        assert code == 2 and f"--data-dir {afile}: not a folder" in err


@pytest.mark.parametrize("group, subcommands", [("runs", ["list", "status", "stop", "resume"]),
                                                ("config", ["check"]), ("data", ["list", "fetch"])])
def test_a_command_group_alone_prints_its_subcommands(capsys, group, subcommands):
    code, out, err = cli(capsys, group)
    assert code == 2 and f"usage: vapo-mcp {group}" in out and all(s in out for s in subcommands)
    assert "error" not in out + err


def test_ablate_help_explains_the_arms_with_an_example(capsys):
    code, out, _ = cli(capsys, "ablate", "--help")
    assert code == 0 and "--variants no_decoupled_gae" in out and "space-separated" in out
    from vapo_engine.variants import VARIANTS
    assert all(f"  {name} " in out for name in VARIANTS)


def test_eval_help_says_which_flags_apply_to_which_backend(capsys):
    code, out, _ = cli(capsys, "eval", "--help")
    text = " ".join(out.split())
    assert code == 0
    for phrase in ("--step STEP with --run, local only", "--concurrency CONCURRENCY with --channel",
                   "--device {auto,cpu,cuda} local models only", "--model MODEL with --channel",
                   "0 = greedy only", "falling back to models.fallback"):
        assert phrase in text, phrase
