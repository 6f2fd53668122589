"""The tools' security model (tools/access.py, docs/design.md §7) through the real MCP server in memory: an HTTP client
reads and probes nothing outside the allowed roots (one refusal for existing, missing, file, folder and
symlinked paths), config paths from overrides or preset files are confined too, and no tool call moves a run's
rendezvous. Loader-level: preset names cannot traverse, TOML syntax errors quote nothing from the file."""
from __future__ import annotations

import os
import shutil

import pytest
from mcp import Client

from tests.mcp_helpers import names_a_fix, slot_held, starts_refuse, text
from vapo_engine.builtin_model.shipped import SHIPPED_ROOT

pytestmark = pytest.mark.anyio
SECRET = "TOPSECRET-4242"


@pytest.fixture
def outside(tmp_path):
    """A folder outside the project with things worth stealing: a log, a TOML, a JSONL set, code with a key."""
    out = tmp_path / "outside"
    (out / "code").mkdir(parents=True)
    (out / "secret.log").write_text(f"Error code: 401 - {{'error': {{'message': 'Incorrect API key {SECRET}'}}}}\n")
    (out / "secret.toml").write_text(f'[training]\ntotal_steps = "{SECRET}"\n')
    (out / "secret.jsonl").write_text(f'{{"problem": "{SECRET}", "answer": "1"}}\n')
    (out / "code" / "x.py").write_text('api_key = "sk-proj-Q9w8E7r6T5y4U3i2O1p0A9s8D7f6"\n')
    return out


def _server(*allow):
    from server.app import build_server
    from tools.access import Policy
    return build_server(Policy("http", tuple(allow)))


async def test_http_refusal_is_the_same_for_every_outside_path(proj, outside):
    (proj / "link.log").symlink_to(outside / "secret.log")
    (proj / "dangling.log").symlink_to(outside / "missing.log")
    (proj / "dirlink").symlink_to(outside / "code")
    (proj / "link.toml").symlink_to(outside / "secret.toml")
    calls = [("diagnose_error", "log_path", p) for p in (
        outside / "secret.log", outside / "missing.log", outside / "code", outside / "no-dir/", proj / "link.log",
        proj / "dangling.log", "../outside/secret.log", proj / "dirlink" / "x.py", "~/.ssh/id_rsa",
        "~nosuchuser42/x.log", "a\x00b")]
    calls += [("diagnose_error", "code_path", p) for p in (outside / "code", outside / "nothing", proj / "dirlink")]
    calls += [("start_training", "preset", p) for p in (outside / "secret.toml", outside / "missing.toml",
                                                         proj / "link.toml", "../outside/secret.toml")]
    seen = set()
    async with Client(_server()) as c:
        for tool, arg, value in calls:
            extra = {"check_config": False} if tool == "diagnose_error" else {}
            res = await c.call_tool(tool, {arg: str(value), **extra})
            msg = text(res)
            assert res.is_error and SECRET not in msg and "--allow-path DIR" in msg, (value, msg)
            seen.add(msg.split(": ", 1)[1].replace(repr(str(value)), "<P>"))
    assert len(seen) == 1, seen  # nothing in the answer depends on what exists outside
    assert names_a_fix(seen.pop())


async def test_http_code_scan_refuses_a_symlinked_file_that_points_out(proj, outside):
    (proj / "src").mkdir()
    (proj / "src" / "ok.py").write_text("import os\nkey = os.environ['TAOTOKEN_API_KEY']\n")
    (proj / "src" / "leak.py").symlink_to(outside / "code" / "x.py")
    async with Client(_server()) as c:
        res = await c.call_tool("diagnose_error", {"code_path": "src", "check_config": False})
        assert res.is_error and "outside the allowed roots" in text(res), text(res)
        (proj / "src" / "leak.py").unlink()
        res = await c.call_tool("diagnose_error", {"code_path": "src", "check_config": False})
        assert not res.is_error, text(res)


async def test_http_paths_inside_the_roots_and_allow_path_folders_work(proj, outside):
    (proj / "logs").mkdir(exist_ok=True)
    (proj / "logs" / "train.log").write_text("openai.AuthenticationError: Error code: 401 - invalid api key\n")
    async with Client(_server()) as c:
        res = await c.call_tool("diagnose_error", {"log_path": "logs/train.log", "check_config": False})
        assert not res.is_error and res.structured_content["findings"], text(res)
    async with Client(_server(outside)) as c:
        res = await c.call_tool("diagnose_error", {"log_path": str(outside / "secret.log"), "check_config": False})
        assert not res.is_error, text(res)


async def test_http_config_paths_outside_the_roots_are_refused(proj, outside):
    (proj / "sneaky.toml").write_text(f'[data]\ndata_dir = "{outside}"\n')
    attempts = [("cpu-demo", [f'model.local_path="{outside}"']), ("cpu-demo", [f'model.value_path="{outside}"']),
                ("cpu-demo", [f'data.data_dir="{outside}"']),
                ("cpu-demo", [f'eval.benchmark="{outside / "secret.jsonl"}"']),
                ("cpu-demo", ['data.train="../../outside/secret"']), ("sneaky.toml", [])]
    with slot_held(proj / "logs"):
        async with Client(_server()) as c:
            for preset, overrides in attempts:
                res = await c.call_tool("start_training", {"preset": preset, "overrides": overrides})
                msg = text(res)
                assert res.is_error and "is outside the allowed roots" in msg and SECRET not in msg, (overrides, msg)
            shutil.copytree(SHIPPED_ROOT / "tiny-addition-v1", proj / "models" / "mine")  # a model: doctor checks it
            ok = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": [
                f'model.local_path="{proj / "models" / "mine"}"']})
            assert not ok.is_error, text(ok)


async def test_tools_cannot_move_the_rendezvous(proj):
    from server.app import build_server
    (proj / "listen.toml").write_text('[distributed]\nrdzv_endpoint = "0.0.0.0:29500"\n')
    attempts = [("cpu-demo", ["distributed.nnodes=2"]), ("cpu-demo", ["distributed.nnodes=2", "distributed.node_rank=1"]),
                ("cpu-demo", ["distributed.rdzv_endpoint=0.0.0.0:29500"]), (str(proj / "listen.toml"), [])]
    with slot_held(proj / "logs"):
        async with Client(build_server()) as c:  # stdio: the local user's agent
            for preset, overrides in attempts:
                res = await c.call_tool("start_training", {"preset": preset, "overrides": overrides})
                msg = text(res)
                assert res.is_error and "only config.toml or the CLI" in msg.replace("Only", "only"), msg
                assert "vapo-mcp train --set distributed." in msg and names_a_fix(msg)


def test_listener_rules_compare_with_config_toml_and_spare_the_cli(proj):
    from tools.access import Policy, applied
    from tools.paths import files
    from tools.training import prepare_config
    with applied(Policy("stdio")):
        assert prepare_config(files(), "cpu-demo", ["distributed.nproc_per_node=2"]).distributed.world_size == 2
    cfg = prepare_config(files(), "cpu-demo", ["distributed.nnodes=2", "distributed.node_rank=1"])  # the CLI
    assert cfg.distributed.nnodes == 2
    cfg_file = proj / "config.toml"
    cfg_file.write_text(cfg_file.read_text().replace('rdzv_endpoint = "127.0.0.1:29500"',
                                                     'rdzv_endpoint = "127.0.0.1:29611"'))
    with applied(Policy("stdio")):  # config.toml's own value is not a change
        assert prepare_config(files(), "cpu-demo", []).distributed.rdzv_endpoint == "127.0.0.1:29611"


def test_preset_names_cannot_leave_the_presets_folder(proj, outside):
    from vapo_engine.config import ConfigError, load_config
    from vapo_engine.config.loader import PRESETS_DIR
    sneaky = os.path.relpath(outside / "secret", PRESETS_DIR)  # '../../…/outside/secret' (+ '.toml' appended)
    with pytest.raises(ConfigError) as e:
        load_config(proj / "config.toml", preset=sneaky)
    assert "unknown preset" in str(e.value) and SECRET not in str(e.value)


def test_toml_syntax_errors_name_the_line_not_the_text(tmp_path):
    from vapo_engine.config import ConfigError, load_config
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[{SECRET.replace('-', '_')}]\nx = 1\n[{SECRET.replace('-', '_')}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    msg = str(e.value)
    assert "bad.toml:3:" in msg and "declared twice" in msg and SECRET.replace("-", "_") not in msg, msg


def test_a_bad_value_from_a_preset_file_names_the_preset_file(proj):
    from vapo_engine.config import ConfigError, load_config
    (proj / "mine.toml").write_text('[training]\ntotal_steps = "many"\n')
    with pytest.raises(ConfigError) as e:
        load_config(proj / "config.toml", ["vapo.alpha=-1"], preset=str(proj / "mine.toml"))
    msg = str(e.value)
    assert f"{proj / 'mine.toml'}: training.total_steps" in msg and "--set: vapo.alpha" in msg, msg


def test_tools_cannot_ask_for_more_processes_than_cores(proj):
    from tools.access import Policy, applied
    from tools.paths import ToolInputError, files
    from tools.training import prepare_config
    from vapo_engine.jobs.threads import usable_cores
    n = usable_cores() + 1
    over = [f"distributed.nproc_per_node={n}", f"training.batch_size={8 * n}", "vapo.group_size=1",
            f"training.mini_batch_size={8 * n}", "training.micro_batch_size=8"]
    with applied(Policy("stdio")), pytest.raises(ToolInputError, match="more processes than this machine has cores"):
        prepare_config(files(), "cpu-demo", over)
    assert prepare_config(files(), "cpu-demo", over).distributed.nproc_per_node == n  # the CLI may


def test_tool_calls_cannot_point_the_rollout_token_elsewhere(proj):
    from tools.access import Policy, applied
    from tools.paths import ToolInputError, files
    from tools.training import prepare_config
    evil = ['rollout.backend="server"', 'rollout.urls=["http://203.0.113.9:8001"]']
    with applied(Policy("stdio")):
        for over in (evil, ['rollout.token_env="TAOTOKEN_API_KEY"']):
            with pytest.raises(ToolInputError, match=r"rollout\.(urls|token_env) differs from config.toml's.*"
                                                     r"config.toml or the CLI"):
                prepare_config(files(), "cpu-demo", over)
    assert prepare_config(files(), "cpu-demo", evil).rollout.urls == ["http://203.0.113.9:8001"]  # the CLI may
    cfg_file = proj / "config.toml"
    cfg_file.write_text(cfg_file.read_text() + '\n[rollout]\nbackend = "server"\nurls = ["http://127.0.0.1:8001"]\n')
    with applied(Policy("stdio")):  # config.toml's own replicas are not a change
        assert prepare_config(files(), "cpu-demo", []).rollout.urls == ["http://127.0.0.1:8001"]


async def test_tool_calls_cannot_redirect_the_metric_tracker(proj):
    """logging.mlflow_tracking_uri gets the run's metrics and the environment's tracker credentials: a tool call
    (override or preset file, start_training / ablate / doctor's shared check) may not change it; the CLI may."""
    from tools.paths import files
    from tools.training import prepare_config
    (proj / "track.toml").write_text('[logging]\nmlflow_tracking_uri = "http://203.0.113.9:5000"\n')
    evil = ['logging.sinks=["jsonl","mlflow"]', 'logging.mlflow_tracking_uri="http://203.0.113.9:5000"']
    # stdio: the local user's agent
    await starts_refuse(proj, evil, proj / "track.toml", "logging.mlflow_tracking_uri", "config.toml or the CLI")
    assert prepare_config(files(), "cpu-demo", evil).logging.mlflow_tracking_uri == "http://203.0.113.9:5000"  # CLI
    cfg_file = proj / "config.toml"
    cfg_file.write_text(cfg_file.read_text() + '\n[logging]\nmlflow_tracking_uri = "http://127.0.0.1:5000"\n')
    from tools.access import Policy, applied
    with applied(Policy("stdio")):  # config.toml's own tracker is not a change
        assert prepare_config(files(), "cpu-demo", []).logging.mlflow_tracking_uri == "http://127.0.0.1:5000"
