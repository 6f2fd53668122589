"""scripts/gpu_check.py: skips cleanly without CUDA, and its quick CPU mode (environment row + the 2-process gloo
parity of ddp and fsdp against one process, on the tiny random model; both 2-process steps in one launch) passes
and prints one table and a JSON record; its judging helpers on hand-made inputs (no processes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SCRIPT = ["-m", "scripts.gpu_check"]


def _env(**extra) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **extra)


def _gpu_check():
    from scripts import gpu_check
    return gpu_check


def test_without_cuda_it_skips_and_exits_zero():
    r = subprocess.run([sys.executable, *SCRIPT], env=_env(CUDA_VISIBLE_DEVICES=""), cwd=ROOT, timeout=120, check=False,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == ("no CUDA device: GPU self-check skipped (run with --device cpu to exercise the "
                                "checks on CPU/gloo)")


@pytest.mark.two_processes
def test_quick_cpu_run_passes_and_prints_the_table(tmp_path, model_dir):
    out = tmp_path / "gpu_check.json"
    r = subprocess.run([sys.executable, *SCRIPT, "--device", "cpu", "--quick", "--tiny-model", str(model_dir),
                        "--json", str(out), "--log", str(tmp_path / "gpu_check.log")],
                       env=_env(), cwd=ROOT, timeout=600, check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| check | result | numbers | status |" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| check")]
    assert [ln.split(" | ")[0] for ln in rows] == ["| environment", "| 2-proc parity, ddp", "| 2-proc parity, fsdp"]
    assert all(ln.endswith("| pass |") for ln in rows), rows
    record = json.loads(out.read_text())
    assert record["passed"] is True and record["device"] == "cpu" and record["machine"]["torch"]
    ddp = record["rows"][1]["data"]
    assert ddp["vs_one"]["grads"]["max_abs"] > 0  # a real comparison, not zeros against zeros
    assert len(ddp["ranks"]) == 2 and all(rk["memory"]["peak_mib"] > 0 for rk in ddp["ranks"])
    fsdp = record["rows"][2]["data"]
    assert fsdp["vs_one"]["grads"]["max_abs"] > 0 and fsdp["vs_ddp"]["grads"]["max_abs"] > 0
    assert len(fsdp["ranks"]) == 2 and all(rk["memory"]["peak_mib"] > 0 for rk in fsdp["ranks"])
    log = (tmp_path / "gpu_check.log").read_text()
    assert log.count("=====") >= 4 and "===== parity-ddp+fsdp" in log  # env, value head, one, ddp+fsdp


def _step(grads, vgrads=None, **metrics) -> dict:
    base = {"rollout/response_length": 10.0, "rollout/reward_mean": 0.5, "actor/pg_loss": 0.1, "actor/entropy": 0.5}
    return {"grads": torch.tensor(grads), "vgrads": torch.tensor(vgrads if vgrads is not None else grads),
            "metrics": {**base, **metrics}}


def test_compare_judges_gradients_rollouts_and_token_means():
    g = _gpu_check()
    ref = _step([1.0, -2.0])
    assert g.compare(_step([1.0, -2.0]), ref, cuda=False)[0] == []
    problems, _ = g.compare(_step([1.0, -2.001]), ref, cuda=False)
    assert problems and problems[0].startswith("grads max abs Δ 1.0")
    assert g.compare(_step([1.0, -2.001]), ref, cuda=True)[0] == []  # looser on CUDA (rtol 1e-3)
    problems, _ = g.compare(_step([1.0, -2.0], **{"rollout/response_length": 11.0}), ref, cuda=False)
    assert problems[0].startswith("rollouts differ")
    problems, _ = g.compare(_step([1.0, -2.0], **{"actor/entropy": 0.51}), ref, cuda=False)
    assert problems == ["actor/entropy 0.51 vs 0.5"]  # a global token mean: judged like the rest
    zeros = _step([0.0, 0.0])
    assert "all zero" in g.compare(zeros, zeros, cuda=False)[0][0]


def test_last_error_names_the_ranks_error_not_torchruns_summary():
    g = _gpu_check()
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "vapo_engine.trainer.models.ModelLoadError: cannot load model from '/m'\n"
            "E1201 13:00:00 torch/distributed/elastic/multiprocessing/api.py failed\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "============================================================\n")
    assert g.last_error(text) == "vapo_engine.trainer.models.ModelLoadError: cannot load model from '/m'"
    assert g.last_error("just a line\n") == "just a line"


def test_engine_check_is_one_skip_row_on_the_cpu():
    r = subprocess.run([sys.executable, *SCRIPT, "--device", "cpu", "--checks", "engine"], env=_env(), cwd=ROOT,
                       timeout=120, check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| check")]
    assert rows == [("| rollout engine | n/a on CPU: vLLM and SGLang serve on CUDA (run scripts/gpu_check.py on a "
                     "GPU machine) |  | skip |")]


def test_engine_check_without_the_engine_says_how_to_install_it():
    from scripts.gpu_engine_check import installed_engine, launch_command, skip_reason
    assert "vLLM or SGLang is not installed" in skip_reason(True, None) and "pip install vllm" in skip_reason(True, None)
    assert skip_reason(True, None, "sglang").startswith("skipped: sglang is not installed")
    assert skip_reason(True, "vllm") is None and skip_reason(False, "vllm").startswith("n/a on CPU")
    assert installed_engine("json") == "json" and installed_engine("no_such_engine_here") is None
    # the server is launched as docs/rollout-servers.md says: dev-mode routes, the protocol's log-prob semantics
    cmd, env = launch_command("vllm", ROOT / "m", 8001)
    assert env == {"VLLM_SERVER_DEV_MODE": "1"} and " ".join(cmd).count("--logprobs-mode processed_logprobs") == 1
    assert "--served-model-name policy" in " ".join(cmd)
    docs = (ROOT / "docs" / "rollout-servers.md").read_text()
    assert "VLLM_SERVER_DEV_MODE=1" in docs and "--logprobs-mode processed_logprobs" in docs
