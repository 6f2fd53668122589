"""LoRA (docs/scale-out.md): only adapters (+ value head) train, the base stays frozen and doubles as the KL
reference, checkpoints resume exactly, `policy/` is a merged plain HF directory that loads and serves, DDP
still equals one process, and config mistakes are clear errors."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import httpx
import pytest
import torch

from bench.lib.runs import ParityReward
from tests.conftest import ROOT
from tests.engine_helpers import make_run
from tests.lora_dist_step import main as one_process_step
from tests.mcp_helpers import text
from vapo_engine.config import ConfigError, load_config
from vapo_engine.metrics import read_metrics
from vapo_engine.trainer import streams

pytest.importorskip("peft")

LORA = ["lora.enabled=true", "lora.r=4", "lora.alpha=8", "training.kl_coef=0.05",
        "training.learning_rate=0.01", "vapo.value_learning_rate=0.01", "training.warmup_steps=0",
        "training.total_steps=4", "eval.eval_interval=100"]
"""Big learning rates so that 4 steps move the adapters far enough for the comparisons to mean something."""
KEYS = ("rollout/reward_mean", "rollout/response_length", "actor/pg_loss", "critic/value_loss",
        "actor/kl_ref", "actor/grad_norm", "critic/grad_norm")
ADAPTER_PARAMS = 2 * 4 * (4 * 2 * 32 + 3 * 160)
"""r = 4 on 2 layers of hidden 32: q/k/v/o take 4·(32 + 32) each, gate/up/down 4·(32 + 128) each."""


def _quiet(m):
    return None


@contextmanager
def _signal():
    """Runs built inside the block reward the parity of the response length (tests/lora_dist_step.py), so the
    untrained tiny model's policy gets gradients."""
    from vapo_engine.trainer import setup
    real = setup.get_task
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(setup, "get_task", lambda *a: ParityReward(real(*a)))
        yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir):
    """A finished 4-step LoRA run with KL on (checkpoints at steps 2 and 4)."""
    from vapo_engine.trainer.loop import train
    run_dir = make_run(tmp_path_factory.mktemp("lora"), model_dir, LORA, name="full")
    with _signal():
        assert train(run_dir, log=_quiet)["status"] == "succeeded"
    return run_dir


def _resumed(run_dir):
    from vapo_engine.trainer.setup import build_trainer
    return build_trainer(run_dir, resume=True, write=False, log=_quiet)


def _plain(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


@pytest.mark.parametrize("value_lora", [True, False])
def test_optimizers_hold_only_the_adapters_and_the_value_head(tmp_path, model_dir, value_lora):
    from vapo_engine.trainer.lora import FrozenBase
    from vapo_engine.trainer.setup import build_trainer
    run = make_run(tmp_path, model_dir, [*LORA, f"lora.value_lora={str(value_lora).lower()}"])
    tr = build_trainer(run, write=False, log=_quiet)
    ids = (lambda opt: {id(p) for g in opt.param_groups for p in g["params"]})
    adapters = {id(p) for n, p in tr.models.policy.named_parameters() if ".lora_" in n}
    assert adapters and ids(tr.opt_actor) == adapters
    assert sum(p.numel() for p in tr.models.policy.parameters() if p.requires_grad) == ADAPTER_PARAMS
    value = dict(tr.models.value.named_parameters())
    want = {id(p) for n, p in value.items() if ".lora_" in n or ".modules_to_save." in n} if value_lora else \
        {id(p) for p in value.values()}
    assert ids(tr.opt_critic) == want and any(".score." in n or n.startswith("score") for n in value)
    assert isinstance(tr.models.reference, FrozenBase)  # no second copy of the model


def test_a_lora_run_changes_the_adapters_and_never_the_base(tmp_path, model_dir):
    from vapo_engine.trainer.loop import rollout_step
    from vapo_engine.trainer.setup import build_trainer
    with _signal():
        tr = build_trainer(make_run(tmp_path, model_dir, LORA), write=False, log=_quiet)
    before = {n: p.detach().clone() for n, p in tr.models.policy.named_parameters()}
    vbefore = {n: p.detach().clone() for n, p in tr.models.value.named_parameters()}
    for _ in range(2):
        rollout_step(tr)
    after, vafter = dict(tr.models.policy.named_parameters()), dict(tr.models.value.named_parameters())
    frozen = [n for n in before if ".lora_" not in n]
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in before if ".lora_B." in n)
    vfrozen = [n for n in vbefore if ".lora_" not in n and ".modules_to_save." not in n]
    assert all(torch.equal(vbefore[n], vafter[n]) for n in vfrozen)
    assert any(not torch.equal(vbefore[n], vafter[n]) for n in vbefore if ".modules_to_save." in n)


def test_adapter_dropout_is_on_in_update_passes_only(tmp_path, model_dir):
    from vapo_engine.trainer.lora import adapter_dropout
    from vapo_engine.trainer.setup import build_trainer
    tr = build_trainer(make_run(tmp_path, model_dir, [*LORA, "lora.dropout=0.1"]), write=False, log=_quiet)
    drops = [m for n, m in tr.models.policy.named_modules() if ".lora_dropout." in n and
             isinstance(m, torch.nn.Dropout)]
    assert drops and not any(d.training for d in drops)
    with adapter_dropout(tr.models.policy, None):
        assert all(d.training for d in drops)
    assert not any(d.training for d in drops)


def test_reference_log_probs_are_the_base_models(trained, model_dir):
    from vapo_engine.rollout.experience import attach_old_outputs, response_log_probs, sample_rollout
    tr = _resumed(trained)
    problems = tr.task.train_batch(4, streams.rng(0, "policy_prompts", 0))
    ro = attach_old_outputs(tr.models, sample_rollout(tr.models, tr.task, problems, max_new_tokens=8,
                                                      temperature=1.0, top_p=1.0), 4)
    with torch.no_grad():
        base_lp, _ = response_log_probs(_plain(model_dir), ro)
    assert torch.allclose(ro.ref_log_probs, base_lp, atol=1e-6)
    assert (ro.old_log_probs - base_lp).abs().max() > 1e-3  # the adapters did move the policy


def test_resume_continues_exactly(trained, tmp_path, model_dir):
    from safetensors.torch import load_file

    from vapo_engine.trainer.loop import train
    cut = make_run(tmp_path, model_dir, LORA, name="cut")
    with _signal():
        assert train(cut, stop_after=3, log=_quiet)["status"] == "interrupted"
        assert train(cut, resume=True, log=_quiet)["status"] == "succeeded"
    pick = (lambda d: {r["step"]: tuple(r.get(k) for k in KEYS) for r in read_metrics(d / "metrics.jsonl")
                       if r["kind"] == "train"})
    a, b = pick(trained), pick(cut)
    assert None not in a[3] and a[3] == b[3] and a[4] == b[4]  # step 3 redone from step 2's checkpoint
    for sub in ("policy_adapter", "value_adapter"):
        wa = load_file(str(trained / "checkpoints/step-0000004" / sub / "adapter_model.safetensors"))
        wb = load_file(str(cut / "checkpoints/step-0000004" / sub / "adapter_model.safetensors"))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_checkpoint_layout_and_the_merged_policy_directory(trained, model_dir):
    from vapo_engine.rundir import verify_checkpoint
    ckpt = trained / "checkpoints/step-0000004"
    assert verify_checkpoint(ckpt) is None
    assert {p.name for p in ckpt.iterdir()} >= {"policy", "policy_adapter", "value_adapter", "DONE"}
    assert not (ckpt / "value").exists()
    assert not [p for p in ckpt.rglob("*") if p.suffix in (".pt", ".bin", ".pkl")]
    merged = _plain(ckpt / "policy")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    tr = _resumed(trained)
    ids = tr.models.tokenizer(["0047+0385=", "12+3="], return_tensors="pt", padding=True)["input_ids"]
    want = _logits(tr.models.policy, ids)
    assert torch.allclose(_logits(merged, ids), want, atol=1e-4)
    assert (_logits(_plain(model_dir), ids) - want).abs().max() > 1e-2


def test_a_lora_value_model_exports_as_a_plain_directory(trained, tmp_path):
    from transformers import AutoModelForTokenClassification

    tr = _resumed(trained)
    tr.parallel.save_value_model(tr.models, tmp_path / "value")
    plain = AutoModelForTokenClassification.from_pretrained(tmp_path / "value", dtype=torch.float32).eval()
    ids = tr.models.tokenizer(["12+3="], return_tensors="pt")["input_ids"]
    assert torch.allclose(_logits(plain, ids), _logits(tr.models.value, ids), atol=1e-4)


def test_serve_model_serves_the_merged_checkpoint(trained):
    from tests.serving_helpers import serving
    from vapo_engine.rollout.generate import generate
    tr = _resumed(trained)
    with serving(trained, model_name="lora") as s:
        assert s.prepared.source.model_dir == trained / "checkpoints/step-0000004/policy"
        body = {"model": "lora", "messages": [{"role": "user", "content": "12+3="}], "temperature": 0,
                "max_tokens": 8}
        r = httpx.post(s.url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    own = generate(tr.models.policy, tr.models.tokenizer, ["12+3="], max_new_tokens=8, do_sample=False)
    own = own.texts[0]
    assert r.json()["choices"][0]["message"]["content"] == own


@pytest.mark.two_processes
def test_two_processes_equal_one_process_step_with_lora(tmp_path, model_dir):
    from tests.test_distributed import EXACT
    over = [*EXACT, "lora.enabled=true", "lora.r=4", "training.kl_coef=0.05"]
    one, two = make_run(tmp_path, model_dir, over, "one"), make_run(tmp_path, model_dir, over, "two")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    step = str(ROOT / "tests/lora_dist_step.py")
    one_process_step(str(one), str(tmp_path / "one.pt"))  # the reference, in this process: one launch less
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        step, str(two), str(tmp_path / "two.pt")], check=False, env=env, cwd=ROOT,
                       timeout=300, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert a["grads"].numel() == ADAPTER_PARAMS and a["grads"].abs().max() > 0  # the adapters' only
    assert torch.allclose(a["grads"], b["grads"], rtol=1e-4, atol=1e-7)
    assert torch.allclose(a["vgrads"], b["vgrads"], rtol=1e-4, atol=1e-7)
    for k in ("actor/pg_loss", "critic/value_loss", "actor/kl_ref", "actor/grad_norm", "rollout/reward_mean"):
        assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("override, key, words", [
    ("lora.r=0", "lora.r", "≥ 1"), ("lora.dropout=1.0", "lora.dropout", "< 1"),
    ("lora.target_modules=[]", "lora.target_modules", "no layer"),
    ('lora.target_modules=["all-linear","q_proj"]', "lora.target_modules", "already means every linear"),
    ('lora.target_modules=["q proj"]', "lora.target_modules", "not a module name"),
    ("lora.alhpa=8", "lora.alhpa", "did you mean lora.alpha"),
])
def test_config_errors_name_the_key_and_the_fix(override, key, words):
    with pytest.raises(ConfigError) as ei:
        load_config(ROOT / "config.toml", [override])
    (issue,) = ei.value.issues
    assert issue.key == key and words in str(issue) and issue.fix


def test_missing_peft_and_unknown_layers_are_clear(tmp_path, model_dir, monkeypatch):
    import importlib.util

    from vapo_engine.config.lora_model import peft_missing
    from vapo_engine.trainer.lora import require_peft
    from vapo_engine.trainer.models import ModelLoadError
    from vapo_engine.trainer.setup import build_trainer
    cfg = load_config(ROOT / "config.toml", ["lora.target_modules=q_proj,v_proj"])
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and peft_missing(cfg.lora) is None
    with pytest.raises(ModelLoadError, match="no such module.*linear layers are.*q_proj"):
        build_trainer(make_run(tmp_path, model_dir, [*LORA, 'lora.target_modules=["qkv"]']), write=False,
                      log=_quiet)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "peft" else real(name, *a))
    on = load_config(ROOT / "config.toml", ["lora.enabled=true"]).lora
    assert "pip install 'vapo-mcp[lora]'" in peft_missing(on) and peft_missing(cfg.lora) is None
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now fails as if it were not installed
    with pytest.raises(ModelLoadError, match=r"pip install 'vapo-mcp\[lora\]'"):
        require_peft()


@pytest.mark.anyio
async def test_start_training_refuses_a_bad_lora_override_with_the_fix(proj):
    from mcp import Client

    from server.app import build_server
    async with Client(build_server()) as c:
        bad = await c.call_tool("start_training", {"preset": "cpu-demo", "overrides": ["lora.enabled=true",
                                                                                      "lora.r=0"]})
    assert bad.is_error and "lora.r" in text(bad) and "≥ 1" in text(bad)
