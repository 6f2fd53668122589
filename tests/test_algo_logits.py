"""Token log-probs and entropies from logits (full and low precision)."""
from __future__ import annotations

import pytest
import torch

from vapo_engine.algo import entropy_from_logits, log_probs_from_logits


def logits_and_labels(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 17, generator=g) * 3
    labels = torch.randint(0, 17, (3, 5), generator=g)
    return logits.to(dtype), labels


def test_log_probs_match_log_softmax_gather_and_grad():
    logits, labels = logits_and_labels(0)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    lp = log_probs_from_logits(a, labels)
    ref = torch.log_softmax(b, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert lp.shape == (3, 5)
    assert torch.allclose(lp, ref, atol=1e-5)
    lp.sum().backward()
    ref.sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_bf16_logits_give_float32_log_probs_close_to_reference():
    logits, labels = logits_and_labels(1, torch.bfloat16)
    lp = log_probs_from_logits(logits, labels)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    assert lp.dtype == torch.float32 and torch.allclose(lp, ref, atol=1e-5)
    ent = entropy_from_logits(logits)
    assert ent.dtype == torch.float32
    assert torch.allclose(ent, torch.distributions.Categorical(logits=logits.float()).entropy(), atol=1e-5)


def test_negative_labels_do_not_crash_and_shape_mismatch_raises():
    logits, labels = logits_and_labels(2)
    labels[0, -1] = -100
    assert torch.isfinite(log_probs_from_logits(logits, labels)).all()
    with pytest.raises(ValueError):
        log_probs_from_logits(logits, labels[:, :3])


def test_entropy_matches_categorical_and_bounds():
    logits, _ = logits_and_labels(3)
    ent = entropy_from_logits(logits)
    assert torch.allclose(ent, torch.distributions.Categorical(logits=logits).entropy(), atol=1e-5)
    uniform = entropy_from_logits(torch.zeros(1, 2, 17))
    assert torch.allclose(uniform, torch.full((1, 2), torch.log(torch.tensor(17.0)).item()))
    peaked = torch.zeros(1, 1, 17)
    peaked[..., 4] = 1e4
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
