"""critic.head = "surprise" (vapo_engine/rollout/value_head.py): the features are those of the tokens written
before each state, by hand; the head starts at zero and reads only the past; a value model with it saves,
loads, checkpoints, resumes and exports, and a folder saved with one head is refused for another."""
from __future__ import annotations

import math

import pytest
import torch

from tests.engine_helpers import make_run
from vapo_engine.metrics import read_metrics


@pytest.fixture(scope="module")
def chain_model_dir():
    from vapo_engine.builtin_model import builtin_model_dir
    return builtin_model_dir(task="builtin:chain", log=lambda m: None)


def test_features_by_hand():
    from vapo_engine.rollout.value_head import surprise_features
    lp = torch.tensor([[-0.1, -2.0, -0.3, -50.0, 9.9]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    f = surprise_features(lp, mask)
    assert f.shape == (1, 5, 4)
    expected = [  # (ℓ_{t−1}, min, mean, log(1 + #below ½)) over tokens < t
        [0, 0, 0, 0],
        [-0.1, -0.1, -0.1, 0],
        [-2.0, -2.0, -1.05, math.log(2)],
        [-0.3, -2.0, -0.8, math.log(2)],
        [0, 0, 0, 0],  # padding
    ]
    assert torch.allclose(f[0], torch.tensor(expected), atol=1e-6)
    f4 = surprise_features(lp, torch.ones_like(mask))  # the clamped −50 seen by the state after it
    assert f4[0, 4, 0].item() == pytest.approx(-20.0) and f4[0, 4, 3].item() == pytest.approx(math.log(3))


def _value(model_dir, head="surprise"):
    from vapo_engine.trainer.models import load_models
    return load_models(model_dir, value_path=None, need_value=True, reference_path=None, device=torch.device("cpu"),
                       autocast_dtype=None, value_head=head)


def _rollout(models, n=4):
    from vapo_engine.rollout.experience import attach_old_outputs, sample_rollout
    from vapo_engine.tasks import get_task
    task = get_task("builtin:addition")
    torch.manual_seed(0)
    ro = sample_rollout(models, task, task.heldout(n), max_new_tokens=8, temperature=1.0, top_p=1.0)
    return attach_old_outputs(models, ro, micro_batch=n)


def test_head_starts_at_zero_and_reads_only_the_past(model_dir):
    from vapo_engine.rollout.experience import response_values
    from vapo_engine.rollout.value_head import SurpriseHead
    models = _value(model_dir)
    assert isinstance(models.value.score, SurpriseHead)
    ro = _rollout(models)
    assert float(ro.values.abs().max()) == 0.0  # zero output at start
    torch.manual_seed(1)
    with torch.no_grad():
        for p in models.value.score.parameters():
            p.add_(0.3 * torch.randn_like(p))
        base = response_values(models.value, ro)
        lp = ro.old_log_probs.clone()
        lp[:, 2] -= 5.0  # token 2 now cost the policy much more
        moved = response_values(models.value, ro, lp)
    valid = ro.response_mask.bool()
    assert torch.equal(moved[:, :3], base[:, :3])  # states before and at token 2 never see it
    assert not torch.allclose(moved[:, 3:][valid[:, 3:]], base[:, 3:][valid[:, 3:]])
    with pytest.raises(RuntimeError, match="old log-probs"):
        response_values(models.value, type(ro)(**{**ro.__dict__, "old_log_probs": None}))


def test_saved_head_loads_back_and_is_refused_for_another(model_dir, tmp_path):
    from vapo_engine.rollout.experience import response_values
    from vapo_engine.trainer.models import ModelLoadError, load_models
    models = _value(model_dir)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in models.value.score.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ro = _rollout(models)
    models.value.save_pretrained(tmp_path / "v", safe_serialization=True)
    again = load_models(model_dir, value_path=tmp_path / "v", need_value=True, reference_path=None,
                        device=torch.device("cpu"), autocast_dtype=None, value_head="surprise")
    with torch.no_grad():
        assert torch.equal(response_values(again.value, ro), response_values(models.value, ro))
    with pytest.raises(ModelLoadError, match="saved with critic.head = 'surprise'.*set critic.head = 'surprise'"):
        load_models(model_dir, value_path=tmp_path / "v", need_value=True, reference_path=None,
                    device=torch.device("cpu"), autocast_dtype=None, value_head="linear")


def test_a_run_with_the_surprise_head_trains_resumes_and_exports(tmp_path, chain_model_dir):
    """On the built-in chain model (it earns rewards, so the head's gradients are not zero): value pretraining
    and policy steps train the head, resume from step 2 ends bit for bit where the uninterrupted run did, and
    the saved critic starts another run (model.value_path)."""
    from safetensors.torch import load_file

    from vapo_engine.trainer.loop import train
    over = ['critic.head="surprise"', 'data.train="builtin:chain"', 'eval.benchmark="builtin:chain"',
            "model.max_tokens=40", "training.total_steps=4", "eval.eval_interval=100", "eval.save_interval=2"]
    full = make_run(tmp_path, chain_model_dir, over, name="full")
    assert train(full, log=lambda m: None)["status"] == "succeeded"
    recs = read_metrics(full / "metrics.jsonl")
    assert any("critic/pretrain_value_loss" in r for r in recs)
    head = load_file(full / "checkpoints/step-0000004/value/model.safetensors")
    assert float(head["score.mlp.2.weight"].abs().sum()) > 0  # it trained
    cut = make_run(tmp_path, chain_model_dir, over, name="cut")
    assert train(cut, stop_after=2, log=lambda m: None)["status"] == "interrupted"
    train(cut, resume=True, log=lambda m: None)
    again = load_file(cut / "checkpoints/step-0000004/value/model.safetensors")
    assert all(torch.equal(head[k], again[k]) for k in head)
    # a saved critic starts another run (model.value_path)
    from vapo_engine.trainer.setup import build_trainer
    value = str(full / "checkpoints/step-0000004/value")
    reuse = make_run(tmp_path, chain_model_dir, [*over, f'model.value_path="{value}"'], name="reuse")
    tr = build_trainer(reuse, write=False, log=lambda m: None)
    assert torch.equal(tr.models.value.score.mlp[2].weight.detach(), head["score.mlp.2.weight"])


def test_lora_value_adapters_train_the_surprise_head_and_export_it(tmp_path, chain_model_dir):
    """With LoRA on the value trunk the head trains in full (peft modules_to_save), resume is exact, and the
    exported value model (adapters merged) loads back with its head and gives the same values."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    from vapo_engine.rollout.experience import response_values
    from vapo_engine.trainer.loop import train
    from vapo_engine.trainer.models import load_models
    from vapo_engine.trainer.setup import build_trainer
    over = ['critic.head="surprise"', 'data.train="builtin:chain"', 'eval.benchmark="builtin:chain"',
            "model.max_tokens=40", "training.total_steps=4", "eval.eval_interval=100", "lora.enabled=true",
            "lora.r=4", "vapo.value_learning_rate=0.01"]
    full, cut = (make_run(tmp_path, chain_model_dir, over, name=n) for n in ("full", "cut"))
    assert train(full, log=lambda m: None)["status"] == "succeeded"
    assert train(cut, stop_after=3, log=lambda m: None)["status"] == "interrupted"
    assert train(cut, resume=True, log=lambda m: None)["status"] == "succeeded"
    wa, wb = (load_file(str(d / "checkpoints/step-0000004/value_adapter/adapter_model.safetensors")) for d in (full, cut))
    heads = [k for k in wa if "score" in k and "mlp" in k]
    assert heads and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    tr = build_trainer(full, resume=True, write=False, log=lambda m: None)
    tr.parallel.save_value_model(tr.models, tmp_path / "exported")
    plain = load_models(chain_model_dir, value_path=tmp_path / "exported", need_value=True, reference_path=None,
                        device=torch.device("cpu"), autocast_dtype=None, value_head="surprise")
    ro = _rollout(plain)
    with torch.no_grad():
        v = response_values(tr.models.value, ro)
        assert float(v.abs().max()) > 1e-3 and torch.allclose(response_values(plain.value, ro), v, atol=1e-5)
