"""Advantage estimators: GAE, VAPO's Decoupled-GAE and Length-Adaptive λ, and the GRPO baseline.

Conventions (all tensors response-aligned and right-padded, shape (B, T)):
- ``mask[:, t]`` is 1 for a generated response token, 0 for padding (bool or float).
- ``values[:, t]`` = V(s_t), the critic's value of the state *before* response token t, i.e. the value head
  output at the previous position of the full sequence (``vapo_engine.rollout.experience.response_values``).
- ``token_rewards[:, t]`` is the reward for emitting token t; an outcome reward sits on the **last valid**
  token (``vapo_engine.rollout.experience.place_rewards``), never on the first pad after it.

GAE recursion (reverse over t, valid positions only; masked positions carry both accumulators forward):
    δ_t = r_t + γ·V_next − V_t,   A_t = δ_t + γ·λ·A_next,   V_next = A_next = 0 after the last valid token.
Outputs are 0 at pad positions and carry no gradient. Nothing here whitens: whiten the policy advantages
with :func:`vapo_engine.algo.stats.masked_whiten` (global moments under data parallel) if desired.

References: GAE (Schulman et al. 2016); VAPO (arXiv 2504.05118) Decoupled-GAE, Length-Adaptive GAE;
GRPO (DeepSeekMath, arXiv 2402.03300) outcome supervision. Semantics follow verl ``core_algos.py``.
"""

from __future__ import annotations

import torch

from .stats import as_bool_mask, masked_count

Tensor = torch.Tensor


def _per_row(x: float | Tensor, batch: int, name: str, like: Tensor) -> Tensor:
    """A scalar or (B,) coefficient in [0, 1] as a (B,) tensor of ``like``'s dtype/device."""
    t = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    if t.dim() == 0:
        t = t.expand(batch)
    if t.shape != (batch,):
        raise ValueError(f"{name} must be a float or a tensor of shape ({batch},), got {tuple(t.shape)}")
    if bool(torch.isnan(t).any()) or bool((t < 0).any()) or bool((t > 1).any()):
        raise ValueError(f"{name} must lie in [0, 1] (a negative λ is a bug), got {t.tolist()[:8]}")
    return t


@torch.no_grad()
def compute_gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float | Tensor = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation for right-padded responses.

    Shapes: token_rewards (B, T), values (B, T) [values[:, t] = V(s_t)], mask (B, T) bool/float;
    gamma and lam: float or Tensor (B,) (one value per sequence, e.g. from :func:`length_adaptive_lambda`)
    -> (advantages (B, T), returns (B, T)), float32 (float64 if values are), 0 at pads, no grad.
    ``returns = advantages + values`` from the raw (un-whitened) advantages: the critic target.
    Pad values and pad rewards never change any output (they are selected away, nan/inf included).
    Implements: δ_t = r_t + γV(s_{t+1}) − V(s_t), Â_t = Σ_l (γλ)^l δ_{t+l} (GAE; VAPO §PPO preliminaries),
    with V = 0 after the last valid token (terminal state).
    """
    if values.dim() != 2 or token_rewards.shape != values.shape:
        raise ValueError(f"token_rewards and values must both be (B, T); got {tuple(token_rewards.shape)} "
                         f"and {tuple(values.shape)}")
    dtype = torch.promote_types(values.dtype, torch.float32)
    v = values.detach().to(dtype)
    r = token_rewards.detach().to(dtype)
    m = as_bool_mask(mask, v)
    batch, length = v.shape
    gam = _per_row(gamma, batch, "gamma", v)
    lam_t = _per_row(lam, batch, "lam", v)
    next_value = torch.zeros(batch, dtype=dtype, device=v.device)
    next_adv = torch.zeros(batch, dtype=dtype, device=v.device)
    columns = []
    for t in reversed(range(length)):
        valid = m[:, t]
        delta = r[:, t] + gam * next_value - v[:, t]
        next_adv = torch.where(valid, delta + gam * lam_t * next_adv, next_adv)
        next_value = torch.where(valid, v[:, t], next_value)
        columns.append(next_adv)
    adv = torch.stack(columns[::-1], dim=1) if columns else torch.zeros_like(v)
    zero = torch.zeros((), dtype=dtype, device=v.device)
    advantages = torch.where(m, adv, zero)
    returns = torch.where(m, adv + v, zero)
    return advantages, returns


def decoupled_gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    lam_policy: float | Tensor,
    lam_critic: float | Tensor = 1.0,
    gamma: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """VAPO Decoupled-GAE: policy advantages from λ_policy, critic targets from a separate λ_critic pass.

    Shapes: token_rewards, values, mask (B, T); lam_policy float or (B,); lam_critic float or (B,)
    -> (policy_advantages (B, T), critic_returns (B, T)), 0 at pads, no grad.
    The critic returns are GAE(λ_critic).advantages + V (λ_critic = 1, γ = 1: Monte-Carlo returns), never
    the returns of the λ_policy pass.
    Implements: VAPO Decoupled-GAE — V-target = Â^{λ_critic} + V_old, policy uses Â^{λ_policy}.
    """
    policy_adv, _ = compute_gae(token_rewards, values, mask, gamma=gamma, lam=lam_policy)
    _, critic_returns = compute_gae(token_rewards, values, mask, gamma=gamma, lam=lam_critic)
    return policy_adv, critic_returns


def check_right_padded(mask: Tensor, name: str = "response_mask") -> None:
    """Raise ValueError unless every row of ``mask`` is 1…1 0…0 (valid tokens first, pads last).

    Shapes: mask (B, T) bool/float -> None.
    Implements: the right-padded response-mask contract (a left-padded attention mask fails here).
    """
    m = as_bool_mask(mask).to(torch.int8)
    if m.dim() != 2:
        raise ValueError(f"{name} must be (B, T), got {tuple(m.shape)}")
    bad = (m[:, 1:] > m[:, :-1]).any(dim=1)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()[:8]
        raise ValueError(f"{name} is not right-padded: rows {rows} have a valid token after a pad. Pass the "
                         "response mask (response tokens first, padding last), not a left-padded "
                         "attention mask of prompt + response.")


def length_adaptive_lambda(
    response_mask: Tensor, alpha: float, check_padding: bool = True
) -> tuple[Tensor, Tensor]:
    """VAPO Length-Adaptive GAE: one λ_policy per sequence from its response length.

    Shapes: response_mask (B, T) right-padded bool/float -> (lam (B,) float32 in [0, 1],
    clamped (B,) bool). l_i = number of valid response tokens of row i (from the response mask, never
    from a left-padded attention mask; ``check_padding`` rejects masks that are not right-padded).
    ``clamped[i]`` is True when α·l_i ≤ 1, i.e. the raw value 1 − 1/(α·l_i) is ≤ 0 (this includes empty
    rows); those rows get λ = 0 exactly (report ``clamped.float().mean()``). λ is never negative.
    Implements: λ_policy = 1 − 1/(α·l) (VAPO Length-Adaptive GAE), clamped to [0, 1].
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if check_padding:
        check_right_padded(response_mask)
    lengths = masked_count(response_mask, dim=-1, dtype=torch.float64)
    return lambda_from_lengths(lengths, alpha)


def lambda_from_lengths(lengths: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """Length-adaptive λ from explicit response lengths (tokens).

    Shapes: lengths (B,) int/float -> (lam (B,) float32, clamped (B,) bool); see
    :func:`length_adaptive_lambda`.
    Implements: λ_i = clamp(1 − 1/(α·l_i), 0, 1) (VAPO Length-Adaptive GAE).
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    scaled = lengths.to(torch.float64) * float(alpha)
    clamped = scaled <= 1.0
    raw = 1.0 - 1.0 / torch.where(clamped, torch.ones_like(scaled), scaled)
    lam = torch.where(clamped, torch.zeros_like(raw), raw.clamp(0.0, 1.0))
    return lam.to(torch.float32), clamped


def grpo_advantages(
    scores: Tensor, mask: Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO/DAPO baseline: group-normalised outcome advantage, broadcast to every valid token.

    Shapes: scores (B,), mask (B, T) -> advantages (B, T) float32, 0 at pads. Rows [k·g, (k+1)·g) form
    group k (B must be a multiple of g ≥ 2). The std is the unbiased group std (verl/TRL semantics).
    Implements: Â_{i,t} = (R_i − mean(R_group)) / (std(R_group) + ε)  (GRPO outcome supervision);
    ``norm_by_std=False`` gives R_i − mean (Dr. GRPO style).
    """
    g = int(group_size)
    batch = scores.shape[0]
    if g < 2 or batch % g != 0:
        raise ValueError(f"grpo needs group_size >= 2 dividing the batch; got group_size={g}, batch={batch}")
    s = scores.detach().to(torch.promote_types(scores.dtype, torch.float32)).view(batch // g, g)
    adv = s - s.mean(dim=1, keepdim=True)
    if norm_by_std:
        adv = adv / (s.std(dim=1, keepdim=True) + eps)
    m = as_bool_mask(mask)
    return torch.where(m, adv.reshape(batch, 1).expand_as(m), torch.zeros((), dtype=adv.dtype, device=adv.device))
