"""The preflight doctor (vapo_engine.doctor): each finding it must make, with its numbers and its fix, on CPU
without loading weights — an indivisible batch, a 7B model under DDP on a 24 GiB GPU, too little disk, a
tokenizer without a chat template, an unreachable rollout server / API channel — and the same checks through
`vapo-mcp doctor`, the MCP tool, and start_training (which refuses on an error)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mcp import Client

from tests.conftest import write_workspace
from tests.fake_openai import closed_port
from tests.mcp_helpers import names_a_fix, slot_held, text
from vapo_engine.builtin_model.shipped import SHIPPED_ROOT
from vapo_engine.doctor import Host, run_doctor, tcp_problem
from vapo_engine.doctor.host import GiB

pytestmark = pytest.mark.timeout(60)
ROOMY = Host(memory_bytes=64 * GiB, memory_kind="gpu", gpus=8, disk_free_bytes=10_000 * GiB, cores=16)
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
            "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}



def unreachable_backend(name: str) -> int:
    """Register rollout backend `name` whose health check probes a closed loopback port; returns the port."""
    from vapo_engine.rollout.backends import register_backend
    port = closed_port()

    @register_backend(name)
    class Remote:
        @staticmethod
        def health_check(options):
            return tcp_problem("127.0.0.1", port)
    return port


def seven_b(tmp_path: Path, name: str = "Qwen2-7B") -> Path:
    """A 7B Qwen2-shaped model folder: config.json and a tokenizer (the built-in one, no chat template), no
    weights at all."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_7B))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED_ROOT / "tiny-addition-v1" / f, folder / f)
    return folder


def doctor(tmp_path: Path, overrides: list[str], host: Host = ROOMY, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config, _ = write_workspace(tmp_path)
    return run_doctor(config, overrides=["eval.benchmark=builtin:addition", *overrides], log_dir=tmp_path / "logs",
                      host=host, **kw)


def only(report, check: str, severity: str = "error"):
    found = [f for f in report.findings if f.check == check and f.severity == severity]
    assert found, report.text()
    return found


def test_an_indivisible_batch_and_every_other_cross_check_are_reported_at_once(tmp_path):
    rep = doctor(tmp_path, ["training.batch_size=30", "distributed.nproc_per_node=4", "training.micro_batch_size=7"])
    assert not rep.ok
    keys = [f.what.split(":")[0] for f in only(rep, "config")]
    assert keys == ["training.batch_size", "distributed.nproc_per_node", "training.mini_batch_size",
                    "training.micro_batch_size"]
    batch = only(rep, "config")[0]
    assert batch.evidence["batch_size"] == 30 and batch.evidence["group_size"] == 8
    assert "batch_size = 24" in batch.fix
    assert all(names_a_fix("fix: " + f.fix) for f in rep.findings if f.severity == "error")


def test_a_7b_model_under_ddp_on_a_24_gib_gpu_does_not_fit_and_the_fix_says_what_would(tmp_path):
    folder = seven_b(tmp_path)
    gpu24 = Host(memory_bytes=24 * GiB, memory_kind="gpu", gpus=8, disk_free_bytes=10_000 * GiB, cores=16)
    rep = doctor(tmp_path, [f'model.local_path="{folder}"', "distributed.nproc_per_node=2",
                            'distributed.strategy="ddp"', "training.kl_coef=0"], host=gpu24)
    mem = only(rep, "memory")[0]
    ev = mem.evidence
    assert ev["policy_params"] == 7_615_616_512 and ev["value_params"] == 7_070_622_721  # Qwen2.5-7B's counts
    assert ev["strategy"] == "ddp" and ev["bytes_per_param"] == 16.0 and ev["budget_gib"] == 24.0
    assert ev["need_gib_per_rank"] == pytest.approx(218.8, abs=0.1)  # bench/results/memory.json's extrapolation
    assert "218.8 GiB per rank" in mem.what and "24.0 GiB per GPU" in mem.what
    assert "fsdp" in mem.fix and "lora.enabled = true" in mem.fix
    # the same model sharded over enough GPUs fits
    assert "≥ 12 GPUs" in mem.fix
    ok = doctor(tmp_path / "b", [f'model.local_path="{folder}"', "distributed.nproc_per_node=8", "distributed.nnodes=2",
                                 'distributed.strategy="fsdp"', "training.kl_coef=0", "training.batch_size=128"],
                host=gpu24)
    assert ok.ok, ok.text()
    assert only(ok, "memory", "info")[0].evidence["need_gib_per_rank"] == pytest.approx(218.8 / 16, abs=0.1)


def test_too_little_disk_for_the_checkpoints_kept(tmp_path):
    folder = seven_b(tmp_path)
    small = Host(memory_bytes=1000 * GiB, memory_kind="gpu", gpus=8, disk_free_bytes=100 * GiB, cores=16)
    rep = doctor(tmp_path, [f'model.local_path="{folder}"', "training.kl_coef=0"], host=small)
    disk = only(rep, "disk")[0]
    assert disk.evidence["kept"] == 2 and disk.evidence["free_gib"] == 100.0
    assert disk.evidence["need_gib"] == pytest.approx(3 * disk.evidence["checkpoint_gib"], abs=0.05)
    assert disk.evidence["need_gib"] > 100 and "runtime.log_dir" in disk.fix


def test_the_kept_checkpoint_count_is_the_trainers():
    import inspect

    from vapo_engine.doctor.resources import CHECKPOINTS_KEPT
    from vapo_engine.trainer.checkpoint import save_checkpoint
    assert inspect.signature(save_checkpoint).parameters["keep"].default == CHECKPOINTS_KEPT


def test_a_tokenizer_without_a_chat_template_for_chat_prompts(tmp_path):
    folder = seven_b(tmp_path, "Qwen2-7B-Instruct")
    rep = doctor(tmp_path, [f'model.local_path="{folder}"', 'model.prompt_format="chat"'])
    tpl = only(rep, "template")[0]
    assert "needs a chat template" in tpl.what and "prompt_format" in tpl.fix
    # auto on a folder named like an instruct model: plain prompts, with a warning that says so
    auto = doctor(tmp_path / "b", [f'model.local_path="{folder}"'])
    assert "instruct" in only(auto, "template", "warning")[0].what
    assert any(f.check == "template" and "round trip ok" in f.what for f in auto.findings), auto.text()


TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ CONTENT }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.mark.parametrize("content, ok", [("m['content']", True), ("m['content'][:4]", False)])
def test_the_chat_template_round_trip(tmp_path, content, ok):
    """A template that keeps the answer reads back through the task's checker; one that cuts it is an error."""
    folder = seven_b(tmp_path, "Qwen2-7B-Instruct")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE.replace(
        "CONTENT", content)}))
    rep = doctor(tmp_path, [f'model.local_path="{folder}"', 'model.prompt_format="chat"'])
    tpl = [f for f in rep.findings if f.check == "template"]
    assert len(tpl) == 1 and tpl[0].evidence["format"] == "chat", rep.text()
    if ok:
        assert tpl[0].severity == "info" and "round trip ok" in tpl[0].what
    else:
        assert tpl[0].severity == "error" and "answer checker" in tpl[0].what and "prompt_format" in tpl[0].fix


def test_an_unreachable_rollout_server_and_api_channel(tmp_path):
    port = unreachable_backend("doctor_remote")
    rep = doctor(tmp_path, ['rollout.backend="doctor_remote"', "provider_rollouts.enabled=true"],
                 channel_url=f"http://127.0.0.1:{port}/v1")
    net = only(rep, "network")[0]
    assert f"127.0.0.1:{port}" in net.what and 'rollout.backend = "hf"' in net.fix
    channel = only(rep, "network", "warning")[0]
    assert "API channel" in channel.what and channel.evidence["port"] == port
    assert "provider_rollouts.enabled = false" in channel.fix


def test_a_healthy_config_is_ok_and_the_host_is_probed(tmp_path):
    config, _ = write_workspace(tmp_path)
    rep = run_doctor(config, overrides=["eval.benchmark=builtin:addition"], log_dir=tmp_path / "logs")
    assert rep.ok and rep.errors == 0, rep.text()
    assert {f.check for f in rep.findings} >= {"config", "data", "template", "memory", "disk", "threads"}


def test_the_cli(tmp_path, capsys):
    from server.cli import main
    config, settings = write_workspace(tmp_path)
    args = ["doctor", "--config", str(config), "--settings", str(settings), "--set", "eval.benchmark=builtin:addition"]
    assert main([*args, "--set", "training.batch_size=30", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"] and out["findings"][0]["what"].startswith("training.batch_size")
    assert main(args) == 0
    assert "doctor: ok" in capsys.readouterr().out


@pytest.mark.anyio
async def test_the_mcp_tool(proj):
    from server.app import build_server
    async with Client(build_server()) as c:
        res = await c.call_tool("doctor", {"overrides": ["training.batch_size=30", "eval.benchmark=builtin:addition"]})
        assert not res.is_error, text(res)
        rep = res.structured_content
        assert not rep["ok"] and rep["findings"][0]["check"] == "config"
        assert "training.batch_size" in rep["findings"][0]["what"]


def test_start_training_refuses_on_a_doctor_error(proj):
    from tools.paths import ToolInputError, files
    from tools.training import start_training
    port = unreachable_backend("doctor_down")
    with slot_held(proj / "logs"), pytest.raises(ToolInputError) as e:
        start_training(files(), preset="cpu-demo", overrides=['rollout.backend="doctor_down"'])
    assert "preflight" in str(e.value) and f"127.0.0.1:{port}" in str(e.value) and names_a_fix(str(e.value))


@pytest.mark.anyio
async def test_the_tool_confines_paths_for_remote_callers(proj, tmp_path):
    """Over HTTP the doctor reads no file outside the allowed roots: refused before the model folder is read."""
    from server.app import build_server
    from tools.access import Policy
    folder = seven_b(tmp_path)  # outside the project
    async with Client(build_server(Policy("http", ()))) as c:
        res = await c.call_tool("doctor", {"overrides": [f'model.local_path="{folder}"']})
    assert res.is_error and "is outside the allowed roots" in text(res)


@pytest.mark.parametrize("make, what", [(lambda p: None, "does not exist"),
                                        (lambda p: p.write_text("x"), "is a file, not a model directory")])
def test_a_local_path_that_is_not_a_folder_names_the_field_and_the_path(tmp_path, capsys, make, what):
    from server.cli import main
    missing = tmp_path / "models" / "Qwen2.5-32B"
    missing.parent.mkdir()
    make(missing)
    [found] = only(doctor(tmp_path / "ws", [f'model.local_path="{missing}"']), "memory")
    assert found.what == f"model.local_path {missing} {what}: the model cannot be loaded"
    assert "model.local_path" in found.fix and "config.json" in found.fix
    config, settings = tmp_path / "ws" / "config.toml", tmp_path / "ws" / "settings.json"
    code = main(["doctor", "--config", str(config), "--settings", str(settings), "--set",
                 f'model.local_path="{missing}"'])
    out = capsys.readouterr()
    assert code == 2 and f"model.local_path {missing} {what}" in out.out and "Traceback" not in out.out + out.err


def test_the_cli_names_vapo_mcp_check_where_the_finding_names_the_check_channel_tool(tmp_path, capsys):
    """The same finding, two callers: the doctor tool's fix says check_channel, `vapo-mcp doctor` says
    `vapo-mcp check` (tools.hints)."""
    from server.cli import main
    config, settings = write_workspace(tmp_path)
    s = json.loads(settings.read_text())
    s["api"]["base_url"] = f"http://127.0.0.1:{closed_port()}/v1"
    settings.write_text(json.dumps(s))
    args = ["doctor", "--config", str(config), "--settings", str(settings), "--set", "eval.benchmark=builtin:addition",
            "--set", "provider_rollouts.enabled=true"]
    main(args)
    out = capsys.readouterr().out
    assert "API channel for provider samples unreachable" in out and "vapo-mcp check shows the details" in out, out
    assert "check_channel" not in out
