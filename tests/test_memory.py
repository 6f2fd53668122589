"""Memory options (docs/scale-out.md): token-budget micro-batches and gradient checkpointing change memory, not
the update — the same gradients and metrics as the count split without checkpointing, on the tiny model; the
splitter keeps its budget and pads to the count every rank agrees on; checkpointing really recomputes."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.conftest import ROOT
from vapo_engine.trainer.memory import split_to_count, token_budget_split

PAIRS = [([5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16]), ([12], [13, 14]), ([15, 16], [17]),
         ([20, 21, 22, 23], [24, 25, 26, 27, 28]), ([30], [31, 32, 33]), ([40, 41], []),
         ([50, 51, 52], [53, 54, 55, 56, 57, 58, 59]), ([60], [61, 62, 63, 64])]
"""(prompt ids, response ids): lengths 9, 2, 1, 5, 3, 0 (empty), 7, 4 — every kind of padding."""


# --- the splitter: a pure function on lengths ---------------------------------------------------------

def _cover(parts, n):
    return sorted(torch.cat(parts).tolist()) == list(range(n))


def _cost(p, lengths, prompt_len):
    return len(p) * (prompt_len + int(lengths[p].clamp(min=1).max()))


def test_split_keeps_the_budget_and_groups_similar_lengths():
    lengths, prompt = torch.tensor([9, 2, 1, 5, 3, 0, 7, 4]), 4
    parts = token_budget_split(lengths, prompt, budget=24)
    assert _cover(parts, 8)
    assert all(_cost(p, lengths, prompt) <= 24 for p in parts)
    assert [lengths[p].tolist() for p in parts] == [[9], [7, 5], [4, 3, 2], [1, 0]]


def test_split_row_over_budget_alone_and_max_rows():
    lengths = torch.tensor([50, 3, 3, 3, 3])
    parts = token_budget_split(lengths, 2, budget=10)  # row 0 costs 52 > 10: alone; then 2 rows × 5 each
    assert [p.tolist() for p in parts] == [[0], [1, 2], [3, 4]]
    assert [len(p) for p in token_budget_split(lengths, 2, budget=1000, max_rows=2)] == [2, 2, 1]
    assert token_budget_split(torch.tensor([], dtype=torch.long), 2, budget=10) == []


def test_split_to_count_halves_the_costliest_until_k():
    lengths, prompt = torch.tensor([9, 2, 1, 5, 3, 0, 7, 4]), 4
    parts = token_budget_split(lengths, prompt, budget=1000)
    assert len(parts) == 1
    four = split_to_count(parts, 4, lengths, prompt)
    assert len(four) == 4 and _cover(four, 8) and all(len(p) >= 1 for p in four)
    eight = split_to_count(parts, 8, lengths, prompt)
    assert sorted(len(p) for p in eight) == [1] * 8
    assert split_to_count(parts, 1, lengths, prompt) == parts
    with pytest.raises(ValueError, match="cannot make 9 micro-batches"):
        split_to_count(parts, 9, lengths, prompt)


def test_split_to_count_splits_the_costly_part_not_the_first():
    lengths, prompt = torch.tensor([1, 1, 20, 20]), 1
    parts = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    assert [p.tolist() for p in split_to_count(parts, 3, lengths, prompt)] == [[0, 1], [2], [3]]


def test_trimmed_cuts_every_per_token_tensor_consistently():
    from vapo_engine.rollout.experience import from_token_ids
    ro = from_token_ids(PAIRS, 0, "cpu")
    ro = replace(ro, old_log_probs=torch.randn(ro.response_mask.shape), values=torch.randn(ro.response_mask.shape))
    sub = ro.rows(torch.tensor([1, 2, 5])).trimmed()  # lengths 2, 1, 0
    assert sub.response_mask.shape == (3, 2) and sub.input_ids.shape == (3, ro.prompt_len + 2)
    assert sub.token_rewards.shape == sub.old_log_probs.shape == sub.values.shape == (3, 2)
    assert torch.equal(sub.old_log_probs, ro.old_log_probs[[1, 2, 5], :2])
    assert sub.rows(slice(2, 3)).trimmed().response_mask.shape == (1, 1)  # an empty response keeps 1 column
    assert ro.trimmed() is ro  # the longest row already fills the width


# --- the update on the tiny model -----------------------------------------------------------------------

def _models(model_dir, *, lora: str | None = None, checkpointing: bool = False):
    """Policy + value model of the tiny model; `lora`: None, "adapters first" or "checkpointing first" (the
    order of attach_adapters and apply_memory_options; setup.py enables checkpointing before adapters)."""
    from vapo_engine.config import load_config
    from vapo_engine.trainer.memory import apply_memory_options
    from vapo_engine.trainer.models import load_models
    m = load_models(model_dir, value_path=model_dir, need_value=True, reference_path=None,
                    device=torch.device("cpu"), autocast_dtype=None)
    cfg = load_config(ROOT / "config.toml", [f"training.gradient_checkpointing={str(checkpointing).lower()}"])
    if lora == "checkpointing first":
        apply_memory_options(m, cfg)
    if lora:
        from vapo_engine.config.lora_model import LoraConfig
        from vapo_engine.trainer.lora import attach_adapters
        torch.manual_seed(0)  # the same adapter initialisation for every copy
        m = attach_adapters(m, LoraConfig(enabled=True, r=4, alpha=8), ckpt=None, kl=False)
    return m if lora == "checkpointing first" else apply_memory_options(m, cfg)


def _rollout(models):
    """PAIRS with old outputs, perturbed old log-probs (so the ratio clips), a KL reference, advantages."""
    from vapo_engine.rollout.experience import attach_old_outputs, from_token_ids
    ro = attach_old_outputs(models, from_token_ids(PAIRS, models.tokenizer.pad_token_id, "cpu"), 8)
    g = torch.Generator().manual_seed(0)
    noise = (lambda: torch.randn(ro.response_mask.shape, generator=g) * ro.response_mask)
    correct = torch.tensor([1, 0, 1, 0, 1, 0, 0, 1], dtype=torch.bool)
    return replace(ro, old_log_probs=ro.old_log_probs + 0.3 * noise(), ref_log_probs=ro.old_log_probs + 0.1 * noise(),
                   advantages=noise(), returns=noise(), correct=correct)


def _spec(**kw):
    """The update of the shipped config (Clip-Higher, token-mean loss), one micro-batch of 8 rows, with `kw`."""
    from vapo_engine.config import load_config
    from vapo_engine.trainer.update import UpdateSpec
    plain = {"dual_clip": None, "positive_lm_coef": 0.0, "kl_coef": 0.0, "value_clip": None, "max_grad_norm": 1.0,
             "micro_batch": 8, "micro_batch_tokens": None, "gradient_checkpointing": False}
    return replace(UpdateSpec.of(load_config(ROOT / "config.toml")), **(plain | kw))


def _step(models, ro, parallel=None, **spec):
    """One update_step (lr 0, so the weights stay put); (metrics, gradients by parameter name)."""
    from vapo_engine.trainer.parallel import ONE_PROCESS
    from vapo_engine.trainer.update import update_step
    opts = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0)
            for m in (models.policy, models.value)]
    spec = _spec(positive_lm_coef=0.1, kl_coef=0.05, value_clip=0.2, max_grad_norm=1e6, **spec)
    metrics = update_step(models, *opts, ro, None, spec, parallel=parallel or ONE_PROCESS)
    metrics = {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # wall times differ run to run
    grads = {f"{k}.{n}": p.grad.clone() for k, m in (("policy", models.policy), ("value", models.value))
             for n, p in m.named_parameters() if p.grad is not None}
    return metrics, grads


def _same(a, b, rtol=1e-5, atol=1e-7):
    (ma, ga), (mb, gb) = a, b
    assert ma.keys() == mb.keys() and ga.keys() == gb.keys() and ga
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], rel=rtol, abs=1e-6), k
    for k in ga:
        assert torch.allclose(ga[k], gb[k], rtol=rtol, atol=atol), k


def test_token_budget_split_gives_the_count_split_gradients_and_metrics(model_dir):
    models = _models(model_dir)
    ro = _rollout(models)
    count = _step(models, ro, micro_batch=3)
    budget = _step(models, ro, micro_batch=8, micro_batch_tokens=2 * (ro.prompt_len + 4))
    _same(count, budget)
    assert count[0]["actor/pg_clipfrac"] > 0 and count[0]["actor/kl_ref"] > 0  # the losses all took part


def test_token_budget_pads_to_the_count_of_the_busiest_rank(model_dir):
    """`max_int` says another rank needs 6 forward passes: this one runs 6 too, same gradients."""
    from vapo_engine.trainer import update
    from vapo_engine.trainer.parallel import Parallel

    class Busiest(Parallel):
        def max_int(self, n: int) -> int:
            seen.append(n)
            return 6
    models = _models(model_dir)
    ro = _rollout(models)
    seen, sizes = [], []
    real = update.micro_batches

    def spy(mini, spec, max_count):
        for mb in real(mini, spec, max_count):
            sizes.append((mb.size, mb.response_mask.shape[1]))
            yield mb
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(update, "micro_batches", spy)
        one = _step(models, ro, micro_batch=8, micro_batch_tokens=10_000)
        assert sizes == [(8, 9)]
        sizes.clear()
        six = _step(models, ro, Busiest(), micro_batch=8, micro_batch_tokens=10_000)
    assert seen == [1] and len(sizes) == 6 and sum(n for n, _ in sizes) == 8
    assert max(w for _, w in sizes) == 9 and min(w for _, w in sizes) < 9  # each trimmed to its own longest
    _same(one, six)


def _first_layer(model):
    from transformers.modeling_layers import GradientCheckpointingLayer
    return next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer))


def _count_mlp_calls(models):
    """Calls into the first decoder layer's MLP (policy + value model): a checkpointed layer runs its body
    again in the backward pass (the layer's own hooks stay outside the checkpoint, its children's do not; a
    pre-hook, since the recompute stops as soon as it has what the backward needs)."""
    calls = []
    for m in (models.policy, models.value):
        _first_layer(m).mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize("lora", [None, "adapters first", "checkpointing first"])
def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients(model_dir, lora):
    if lora:
        pytest.importorskip("peft")
    plain, ckpt = _models(model_dir, lora=lora), _models(model_dir, lora=lora, checkpointing=True)
    ro = _rollout(plain)
    runs = []
    for models, on in ((plain, False), (ckpt, True)):
        calls = _count_mlp_calls(models)
        runs.append(_step(models, ro, micro_batch=4, gradient_checkpointing=on))
        runs[-1] += (len(calls),)
        assert not any(m.training for model in (models.policy, models.value) for m in model.modules())
    (m0, g0, n0), (m1, g1, n1) = runs
    assert n0 == 2 * 2 and n1 == 2 * n0  # 2 micro-batches × (policy + value); checkpointed: twice as many
    _same((m0, g0), (m1, g1), rtol=1e-4, atol=1e-6)


def test_checkpointing_needs_prepared_models(model_dir):
    from vapo_engine.trainer.update import update_step
    models = _models(model_dir)
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (models.policy, models.value)]
    with pytest.raises(RuntimeError, match="apply_memory_options"):
        update_step(models, *opts, _rollout(models), None, _spec(gradient_checkpointing=True))


def test_layers_that_act_differently_in_train_mode_are_refused(model_dir):
    from vapo_engine.trainer.memory import enable_checkpointing
    from vapo_engine.trainer.models import ModelLoadError
    models = _models(model_dir)

    def dropout_in_train_mode(layer, args, out):
        return torch.nn.functional.dropout(out, 0.5, layer.training) if torch.is_tensor(out) else out
    _first_layer(models.policy).register_forward_hook(dropout_in_train_mode)
    with pytest.raises(ModelLoadError, match="training.gradient_checkpointing = false"):
        enable_checkpointing(models.policy, "policy")
