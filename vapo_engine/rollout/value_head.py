"""The value model's head: a scalar on the last hidden state (`linear`, the default), or `surprise`, which also
reads what the written tokens cost the policy (config.toml `critic.head`; docs/design.md §3.5).

Why `surprise` exists (bench/results/critic_fit.json): a critic initialised from the policy reads V(s_t) from the
hidden state at the last written token, and that state is shaped to predict the *next* token. When the policy
samples an unlikely token that is a mistake (the chain task's wrong sign), its own log-prob of that token tells
the mistake apart perfectly (held-out AUC 1.0), while linear probes of every layer's hidden state at the same
place are near chance (AUC ≈ 0.52–0.58): the knowledge sits in the policy's output distribution at the position
*before*, which the hidden-state head never sees. `surprise` hands it over: V = w·h + MLP([h, φ_t]) with φ_t
(`surprise_features`) made of the log-probs, under the policy that sampled them, of the response tokens written
before t. The features are inputs (no gradient flows into the policy); the head starts at zero output.

The head replaces the token-classification model's `score` module, so peft (`modules_to_save`), checkpoints and
the zero-head rule see it under the usual name. HF's forward calls `score(hidden)` with the hidden states only;
the features reach it through `head_inputs` (a context variable set around the forward by
`experience.response_values`), laid out over the whole sequence (zeros on the prompt). A saved value model records
the head in its config (`vapo_value_head`), and `attach_head` rebuilds it on load from the safetensors files
(tensors only, no pickle). This file does not train anything.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from pathlib import Path

import torch

HEADS = ("linear", "surprise")
CONFIG_KEY = "vapo_value_head"
"""Config attribute of a value model whose head is not the plain linear `score`."""
N_FEATURES = 4
LOW = math.log(0.5)
FLOOR = -20.0
"""Log-probs are clamped here (a near-impossible token is as surprising as it needs to be)."""

_FEATURES: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("value_head_features", default=None)


def surprise_features(log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, R, 4) features of the state before each response token t, from the log-probs (N, R) of the written
    tokens k < t only: ℓ_{t−1}, min ℓ_k, mean ℓ_k, and log(1 + #{k < t: ℓ_k < log ½}); 0 at t = 0 and on
    padding. Log-probs are clamped at −20."""
    m = mask.to(log_probs.dtype)
    lp = log_probs.clamp(min=FLOOR) * m
    prev = torch.nn.functional.pad(lp, (1, 0))[:, :-1]
    written = torch.nn.functional.pad(m, (1, 0))[:, :-1]
    count = written.cumsum(1)
    low = ((prev < LOW) & written.bool()).to(lp.dtype).cumsum(1)
    run_min = torch.cummin(prev, dim=1).values
    mean = prev.cumsum(1) / count.clamp(min=1)
    return torch.stack([prev, run_min, mean, torch.log1p(low)], -1) * m[..., None]


class SurpriseHead(torch.nn.Module):
    """V = w·h + MLP([h, φ]) (module docstring). Zero output at start: both output layers are zero."""

    def __init__(self, hidden_size: int, width: int = 64):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden_size + N_FEATURES, width), torch.nn.GELU(),
                                       torch.nn.Linear(width, 1))
        self.zero_output()

    def zero_output(self) -> None:
        with torch.no_grad():
            for layer in (self.linear, self.mlp[2]):
                layer.weight.zero_()
                layer.bias.zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        feats = _FEATURES.get()
        if feats is None or feats.shape[:2] != hidden.shape[:2]:
            raise RuntimeError("the surprise value head needs the policy's log-probs of the written tokens "
                               "(experience.response_values passes them); got "
                               + ("none" if feats is None else f"features of shape {tuple(feats.shape)} for "
                                  f"hidden states {tuple(hidden.shape)}"))
        feats = feats.to(device=hidden.device, dtype=hidden.dtype)
        return self.linear(hidden) + self.mlp(torch.cat([hidden, feats], -1))


def head_kind(model) -> str:
    """`linear` or `surprise`: the head a (possibly peft-wrapped) value model carries."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, CONFIG_KEY, None) or "linear"


@contextlib.contextmanager
def head_inputs(model, log_probs: torch.Tensor | None, mask: torch.Tensor, prompt_len: int):
    """Around a value model's forward over [prompt (P) | response (R)]: the surprise head's features over the whole
    sequence, the value read at position P−1+t getting φ_t. A linear head needs nothing (`log_probs` unused)."""
    if head_kind(model) != "surprise":
        yield
        return
    if log_probs is None:
        raise RuntimeError("critic.head = \"surprise\" needs the rollout's old log-probs before its values")
    phi = surprise_features(log_probs, mask)
    full = torch.zeros(phi.shape[0], prompt_len - 1 + phi.shape[1] + 1, N_FEATURES, dtype=phi.dtype,
                       device=phi.device)
    full[:, prompt_len - 1:prompt_len - 1 + phi.shape[1]] = phi
    token = _FEATURES.set(full)
    try:
        yield
    finally:
        _FEATURES.reset(token)


def saved_head(folder: str | Path) -> str:
    """The head a saved value model folder carries (its config.json's `vapo_value_head`; `linear` if none)."""
    import json
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "linear"
    kind = cfg.get(CONFIG_KEY) if isinstance(cfg, dict) else None
    return kind if kind in HEADS else "linear"


def attach_head(model, kind: str, folder: Path | None = None) -> None:
    """Give the token-classification value `model` the head `kind` (in place): `surprise` replaces `score` with
    a zero-output `SurpriseHead`, then loads its `score.*` tensors from the safetensors files of `folder` when
    that folder's model was saved with one. `linear` leaves the model as loaded."""
    if kind == "linear":
        return
    if kind not in HEADS:
        raise ValueError(f"unknown value head {kind!r}; one of {', '.join(HEADS)}")
    head = SurpriseHead(model.config.hidden_size).to(next(model.parameters()).device)
    if folder is not None:
        saved = _score_tensors(folder)
        if saved:
            head.load_state_dict(saved)
    model.score = head
    setattr(model.config, CONFIG_KEY, kind)


def _score_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The `score.*` tensors (prefix removed) of the safetensors files in `folder` ({} when there are none)."""
    from safetensors import safe_open
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if k.startswith("score."):
                    out[k[len("score."):]] = st.get_tensor(k)
    return out
