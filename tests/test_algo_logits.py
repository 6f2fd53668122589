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


def reference(logits, labels, t):
    """log-softmax and entropy of logits / t in float32, the whole batch at once (the plain formula)."""
    z = logits.float() / (t.view(-1, 1, 1) if isinstance(t, torch.Tensor) else t)
    lp = torch.log_softmax(z, -1).gather(-1, labels[..., None]).squeeze(-1)
    return lp, torch.distributions.Categorical(logits=z).entropy()


def test_temperature_in_float32_is_the_scaled_logits_within_1e_6():
    logits, labels = logits_and_labels(4)
    lp, ent = log_probs_from_logits(logits, labels, 0.7), entropy_from_logits(logits, 0.7)
    assert torch.equal(lp, log_probs_from_logits(logits / 0.7, labels))  # as dividing before the call did
    assert torch.equal(ent, entropy_from_logits(logits / 0.7))
    ref_lp, ref_ent = reference(logits, labels, 0.7)
    assert torch.allclose(lp, ref_lp, atol=1e-6) and torch.allclose(ent, ref_ent, atol=1e-6)
    assert torch.equal(log_probs_from_logits(logits, labels, 1.0), log_probs_from_logits(logits, labels))


def test_bf16_logits_at_a_temperature_are_close_to_the_float32_reference_with_grad():
    logits, labels = logits_and_labels(5, torch.bfloat16)
    a = logits.clone().requires_grad_(True)
    b = logits.float().clone().requires_grad_(True)
    lp = log_probs_from_logits(a, labels, 0.6)
    ref_lp, ref_ent = reference(b, labels, 0.6)
    assert lp.dtype == torch.float32 and torch.allclose(lp, ref_lp, atol=1e-5)
    ent = entropy_from_logits(logits, 0.6)
    assert ent.dtype == torch.float32 and torch.allclose(ent, ref_ent, atol=1e-5)
    lp.sum().backward()
    ref_lp.sum().backward()
    assert a.grad.dtype == torch.bfloat16 and torch.allclose(a.grad.float(), b.grad, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_row_temperatures_equal_separate_calls(dtype):
    logits, labels = logits_and_labels(6, dtype)
    temps = torch.tensor([0.5, 1.0, 1.3])
    lp, ent = log_probs_from_logits(logits, labels, temps), entropy_from_logits(logits, temps)
    for i, t in enumerate(temps.tolist()):
        assert torch.allclose(lp[i], log_probs_from_logits(logits[i:i + 1], labels[i:i + 1], t)[0], atol=1e-6)
        assert torch.allclose(ent[i], entropy_from_logits(logits[i:i + 1], t)[0], atol=1e-6)
    ref_lp, ref_ent = reference(logits, labels, temps)
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)


def test_bad_temperatures_are_refused_with_the_argument_named():
    logits, labels = logits_and_labels(7)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        log_probs_from_logits(logits, labels, 0.0)
    with pytest.raises(ValueError, match=r"entropy_from_logits: temperature must be a float or a \(3,\) tensor"):
        entropy_from_logits(logits, torch.ones(2))
    with pytest.raises(ValueError, match="every temperature must be > 0"):
        log_probs_from_logits(logits.bfloat16(), labels, torch.tensor([1.0, -1.0, 1.0]))
