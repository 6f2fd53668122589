"""The rollout backend interface: prompt token ids and explicit sampling settings in, a `Generation` out.

A backend samples responses for the rollout layer (`rollout.experience.sample_rollout`, `rollout.evaluate`).
Every call states how to sample in full (`SamplingParams`): no checkpoint or engine default applies. What comes
back is the same for every backend (`Generation`): prompts left-padded, responses right-padded with the pad id,
a response mask that covers every token up to AND including the first stop (EOS) token, the decoded texts, and,
when asked for and where the backend has them, the per-token log-probs of the sampled tokens.

Log-prob semantics: log-softmax of logits / temperature over the full vocabulary, truncated to the top-p
nucleus when top_p < 1 (the distribution the tokens were drawn from, not renormalised). The trainer's old
log-probs are its own (`rollout.experience.response_log_probs`), recomputed after sampling or, from a backend that
samples the trainer's policy itself, read off the decoding steps (`SamplingParams.policy_outputs`).

`RolloutBackend.load_weights` is how a backend that holds its own copy of the policy (an inference engine in
another process) is told that the policy changed; the in-process backend samples from the live policy module,
so there it does nothing. This file holds no backend itself and does not tokenize.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch, in full."""

    max_new_tokens: int
    """Longest response, in tokens (at least 1)."""
    stop_token_ids: tuple[int, ...]
    """Token ids that end a response (the EOS ids); the first one is kept in the response."""
    pad_token_id: int
    """Fills the prompts' left padding and every response position after its end."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy decoding."""
    top_p: float = 1.0
    """Nucleus threshold (1 = the full vocabulary)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 = off."""
    n: int = 1
    """Samples per prompt; the n responses of a prompt are adjacent rows of the `Generation`."""
    seed: int | None = None
    """Seed of this call's sampling; None = the caller's (already seeded) torch random stream."""
    log_probs: bool = False
    """Also return the log-probs of the sampled tokens (`Generation.log_probs`)."""
    policy_outputs: bool = False
    """Also return what the trainer's old-output pass would compute for the drawn tokens: log-softmax(logits / T)
    over the full vocabulary (no top-p/top-k truncation) and that distribution's entropy
    (`Generation.policy_log_probs`, `.entropy`; rollout.old_log_probs = "sampler"). Only a backend that samples
    from the trainer's policy itself can (hf); another returns None and the trainer computes them."""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.stop_token_ids:
            raise ValueError("stop_token_ids is empty; give the EOS id(s) so responses can end")
        if self.n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {self.n}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class Generation:
    """Rollout tensors for N prompts (all on the sampling device)."""

    prompt_ids: torch.LongTensor
    """(N, P) prompt tokens, left-padded with pad_token_id."""
    prompt_mask: torch.Tensor
    """(N, P) 1 for real prompt tokens, 0 for left padding."""
    response_ids: torch.LongTensor
    """(N, R) response tokens, right-padded with pad_token_id; R <= max_new_tokens."""
    response_mask: torch.Tensor
    """(N, R) float: 1.0 up to and including the first EOS (all R tokens if none), 0.0 after."""
    texts: list[str]
    """Decoded responses with special tokens removed."""
    finished: torch.BoolTensor
    """(N,) True where an EOS was generated (False: the response reached max_new_tokens)."""
    log_probs: torch.Tensor | None = None
    """(N, R) float32 log-probs of the drawn tokens under the sampler's processed distribution (with
    `SamplingParams.log_probs`; 0 after the response ends), else None. A remote backend (`server`) always returns
    the server's: log_softmax(logits / T) over the full vocabulary."""
    policy_log_probs: torch.Tensor | None = None
    """(N, R) float32 log-softmax(logits / T) of the drawn tokens over the full vocabulary, 0 after the response
    ends (with `SamplingParams.policy_outputs`, from a backend that can), else None."""
    entropy: torch.Tensor | None = None
    """(N, R) float32 entropy of softmax(logits / T) at each response position (with `policy_log_probs`)."""
    weight_version: int | None = None
    """The policy weights' version that sampled these (a backend with its own copy of the weights); None for
    the live in-process policy."""
    loss_mask: torch.Tensor | None = None
    """(N, R) float: 1 where the policy wrote the token, 0 where the environment inserted it (a multi-turn episode's
    tool results, rollout/episodes.py) and after the response; None = `response_mask` (one turn: a backend's own
    output)."""
    turns: torch.Tensor | None = None
    """(N,) float: policy turns of each episode (rollout/episodes.py); None for one turn."""
    tool_calls: torch.Tensor | None = None
    """(N,) float: tool calls each episode made."""
    tool_errors: torch.Tensor | None = None
    """(N,) float: calls whose result was not the tool's complete answer (an error, a timeout, a bad call, a cut)."""


class PolicyModels(Protocol):
    """What a backend is handed on each call: the run's models (`trainer.models.Models`)."""

    policy: Any
    tokenizer: Any


class RolloutBackend(ABC):
    """Where responses are sampled. Subclasses register under a name (`backends.register_backend`)."""

    name: ClassVar[str] = ""

    @abstractmethod
    def generate(self, models: PolicyModels, prompt_ids: list[list[int]], params: SamplingParams, *,
                 batch_size: int | None = None) -> Generation:
        """Sample `params.n` responses for each prompt (token-id rows, not padded). `batch_size`: at most this
        many rows per engine call (a memory bound; a backend that batches by itself may ignore it)."""

    remote: ClassVar[bool] = False
    """Samples from a copy of the weights in other processes: the trainer pushes them (trainer/weight_sync.py)."""

    def load_weights(self, models: PolicyModels, *, version: int, path: str | None = None) -> None:
        """Sample from `models.policy`'s current weights from now on, tagged `version`; `path` is the directory of
        safetensors the trainer wrote them to (for a `remote` backend). Nothing to do for a backend that samples
        from the live policy module (the default)."""
        del models, version, path

    def metrics(self) -> dict[str, float]:
        """The backend's own metrics since the last call (e.g. replica failovers); none by default."""
        return {}

    def close(self) -> None:
        """Release connections (nothing by default)."""


def response_lengths(response_mask: torch.Tensor) -> torch.LongTensor:
    """(N,) number of valid response tokens per row (EOS included), from the right-padded response mask."""
    return response_mask.sum(dim=-1).round().long()


def mask_after_eos(tokens: torch.Tensor, eos_ids: list[int],
                   pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, finished): tokens after the first EOS set to pad; mask 1.0 up to and including it."""
    is_eos = torch.zeros_like(tokens, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= tokens == e
    finished = is_eos.any(dim=-1)
    # Count of EOS tokens strictly before each position; a position is valid while that count is 0.
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()
    mask = (eos_before == 0).float()
    ids = tokens.masked_fill(mask == 0, pad_id)
    return ids, mask, finished


def left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask of token-id rows, padded here (works for tokenizers without a pad token or
    padding side)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"prompt {i} encodes to no tokens; give it some text")
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def pad_to(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    """`t` (N, W) widened to `width` columns with `value` on the left or right (unchanged if already wide)."""
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """The valid part of each response as text, special tokens removed."""
    lengths = response_lengths(response_mask).tolist()
    return tokenizer.batch_decode([row[:n].tolist() for row, n in zip(response_ids, lengths)],
                                  skip_special_tokens=True)
