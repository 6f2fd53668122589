"""The rollout backend seam: a backend registered here, outside the trainer, drives a whole run; the registry
names the known backends; the in-process backend is the one place that calls `model.generate`."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import ROOT
from tests.engine_helpers import make_run
from vapo_engine.config.train_model import RolloutConfig
from vapo_engine.metrics import read_metrics
from vapo_engine.rollout.backends import (
    Generation,
    RolloutBackend,
    SamplingParams,
    UnknownBackendError,
    backend_names,
    get_backend,
    register_backend,
)
from vapo_engine.rollout.backends.base import decode_responses, left_pad, mask_after_eos
from vapo_engine.rollout.backends.hf import generate_ids
from vapo_engine.rollout.tokenizer import load_tokenizer


@register_backend("fake_answers")
class FakeAnswers(RolloutBackend):
    """Answers every addition prompt correctly (";<sum>" then EOS) without a model; keeps what it was asked and
    what it answered."""

    name = "fake_answers"
    calls: ClassVar[list[SamplingParams]] = []
    answered: ClassVar[list[list[int]]] = []

    def __init__(self, options):
        assert options.backend == "fake_answers"

    def generate(self, models, prompt_ids, params, *, batch_size=None) -> Generation:
        FakeAnswers.calls.append(params)
        tok, rows = models.tokenizer, [r for r in prompt_ids for _ in range(params.n)]
        responses = []
        for row in rows:
            a, b = re.fullmatch(r"(\d+)\+(\d+)=", tok.decode(row, skip_special_tokens=True)).groups()
            ids = tok(f";{int(a) + int(b)}", add_special_tokens=False)["input_ids"] + [params.stop_token_ids[0]]
            responses.append(ids[:params.max_new_tokens])
        FakeAnswers.answered += responses
        prompts, prompt_mask = left_pad(rows, params.pad_token_id, "cpu")
        width = max(len(r) for r in responses)
        raw = torch.tensor([r + [params.pad_token_id] * (width - len(r)) for r in responses])
        ids, mask, finished = mask_after_eos(raw, list(params.stop_token_ids), params.pad_token_id)
        return Generation(prompts, prompt_mask, ids, mask, decode_responses(tok, ids, mask), finished)


def test_a_backend_registered_outside_the_trainer_drives_a_run(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    from vapo_engine.trainer.state_io import load_state
    FakeAnswers.calls.clear()
    FakeAnswers.answered.clear()
    run = make_run(tmp_path, model_dir, ['rollout.backend="fake_answers"', "training.total_steps=1",
                                              "model.temperature=0.9"])
    assert train(run, log=lambda m: None)["status"] == "succeeded"
    recs = read_metrics(run / "metrics.jsonl")
    step = next(r for r in recs if r["kind"] == "train")
    # The untrained tiny model never writes a correct answer; every response trained on here is the fake's.
    assert step["rollout/accuracy"] == 1.0 and step["rollout/response_length_max"] <= 6  # ";" 1-5 digits EOS
    assert step["rollout/truncated_frac"] == 0.0  # every answer ends with EOS (the longest ones too)
    assert step["vapo/positive_samples"] == 8 and step["actor/positive_nll"] > 0
    assert all(r["eval/greedy_accuracy"] == 1.0 for r in recs if r["kind"] == "eval")
    replay = load_state(run / "checkpoints" / "step-0000001")["replay"]["items"]
    assert len(replay) == 8 and all(resp in FakeAnswers.answered for _, resp in replay)
    tok = load_tokenizer(model_dir)
    assert all(p.stop_token_ids[0] == tok.eos_token_id and p.pad_token_id == tok.pad_token_id
               for p in FakeAnswers.calls)
    sampled = [p for p in FakeAnswers.calls if not p.greedy]
    assert {p.temperature for p in sampled} == {0.9} and any(p.greedy for p in FakeAnswers.calls)
    assert any(p.seed is not None for p in sampled)  # the held-out sampled evaluation is seeded apart


def test_unknown_backend_names_the_known_ones(model_dir):
    from vapo_engine.trainer.models import load_models
    with pytest.raises(UnknownBackendError, match=r"unknown rollout backend 'nope'; known rollout backends: .*hf"):
        load_models(model_dir, value_path=None, need_value=False, reference_path=None,
                    device=torch.device("cpu"), autocast_dtype=None, rollout=RolloutConfig(backend="nope"))
    assert "hf" in backend_names() and "fake_answers" in backend_names()
    assert get_backend("hf").name == "hf"
    with pytest.raises(ValueError):
        register_backend("Not A Name")
    with pytest.raises(ValueError, match="rollout.backend"):
        from vapo_engine.config import load_config
        load_config(ROOT / "config.toml", ['rollout.backend="../hf"'])


def test_default_backend_is_hf(model_dir):
    from vapo_engine.trainer.models import load_models
    models = load_models(model_dir, value_path=None, need_value=False, reference_path=None,
                         device=torch.device("cpu"), autocast_dtype=None)
    assert models.backend.name == "hf" and RolloutConfig().backend == "hf"


def test_hf_n_samples_and_seed(model_dir):
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), load_tokenizer(model_dir)
    rows = [tok("12+34=")["input_ids"], tok("7+8=")["input_ids"]]
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                            n=3, seed=11)
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    grouped = generate_ids(model, tok, rows, params)
    assert torch.equal(torch.random.get_rng_state(), before)  # a seeded call leaves the caller's stream alone
    repeated = generate_ids(model, tok, [r for r in rows for _ in range(3)],
                            SamplingParams(**{**params.__dict__, "n": 1}))
    assert grouped.response_ids.shape[0] == 6 and torch.equal(grouped.response_ids, repeated.response_ids)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0, stop_token_ids=(2,), pad_token_id=0)


def test_only_the_hf_backend_calls_generate_or_builds_a_generation_config():
    allowed = ROOT / "vapo_engine/rollout/backends/hf.py"
    found = []
    for folder in ("vapo_engine", "server", "tools", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                backend_call = isinstance(f, ast.Attribute) and _names(f.value).endswith("backend")
                if name == "GenerationConfig" or (name == "generate" and isinstance(f, ast.Attribute)
                                                  and not backend_call):
                    found.append(f"{Path(path).relative_to(ROOT)}:{node.lineno}")
    assert found == []


def _names(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


_HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_wait_until_healthy_says_why_a_server_did_not_come_up(tmp_path):
    """A real process each: one that answers /health, one that exits, one that never listens."""
    import socket
    import subprocess
    import sys

    from vapo_engine.rollout.backends.replicas import wait_until_healthy
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = subprocess.Popen([sys.executable, "-c", _HEALTH_SERVER, str(port)])
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wait_until_healthy(up, f"http://127.0.0.1:{port}", timeout_s=30, poll_s=0.1) is None
        gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
        assert wait_until_healthy(gone, "http://127.0.0.1:9", timeout_s=30, poll_s=0.1) == "exited with 3"
        assert wait_until_healthy(silent, "http://127.0.0.1:9", timeout_s=0.3, poll_s=0.1) == \
            "no /health answer within 0.3 s"
    finally:
        up.kill()
        silent.kill()
