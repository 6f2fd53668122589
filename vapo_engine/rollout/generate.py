"""Batched sampling from any Hugging Face causal LM with the KV cache, returned as padded, masked tensors.

`generate` tokenizes prompts with left padding (plain text, or the model's chat template when given a chat
`vapo_engine.prompts.PromptFormat`), calls `model.generate` (attention mask, `use_cache=True`) chunk by chunk,
and returns a `Generation`: prompts left-padded, responses right-padded, a response mask that covers every
token up to AND including the first EOS, and pad tokens everywhere after it.

Sampling is pure: the checkpoint's own `generation_config` (top-k, repetition penalty, ...) is ignored; tokens
are drawn from softmax(logits / temperature), truncated to the top-p nucleus when top_p < 1 (top-k is off).
The trainer's log-probs (`experience.response_log_probs`) are of softmax(logits / temperature) over the full
vocabulary: the sampled distribution exactly when top_p = 1, an approximation of it when top_p < 1 (the
nucleus is not renormalised there; `vapo-mcp config check` warns). With `with_log_probs=True` the sampler's
own log-probs of the drawn tokens come back too (log-softmax of the processed scores: temperature and top-p
applied), which is how a test proves the two agree. Randomness comes from torch's global RNG (the caller seeds
it). This file does not compute values or rewards, and does not batch by length or stream.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from vapo_engine.prompts import PromptFormat, encode_prompts


@dataclass
class Generation:
    """Rollout tensors for N prompts (all on the model's device)."""

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
    """(N,) True where an EOS was generated."""
    log_probs: torch.Tensor | None = None
    """(N, R) float32 log-probs of the drawn tokens under the sampler's processed distribution (with
    `with_log_probs=True`; 0 after the response ends), else None."""


def response_lengths(response_mask: torch.Tensor) -> torch.LongTensor:
    """(N,) number of valid response tokens per row (EOS included), from the right-padded response mask."""
    return response_mask.sum(dim=-1).round().long()


def special_ids(model, tokenizer) -> tuple[int, list[int]]:
    """(pad_id, eos_ids): EOS ids of the tokenizer and the model's generation config; pad defaults to EOS."""
    eos: list[int] = []
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for source in (tokenizer.eos_token_id, model_eos):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in eos:
                eos.append(int(i))
    if not eos:
        raise ValueError("the tokenizer has no eos_token; set one so responses can end")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return int(pad), eos


def _sampling_config(max_new_tokens: int, temperature: float, top_p: float, do_sample: bool,
                     pad: int, eos: list[int], with_log_probs: bool = False) -> GenerationConfig:
    greedy = not do_sample or temperature <= 0
    # top_k=0 explicitly: otherwise transformers' global default (top_k=50) would truncate the distribution.
    sampling = {} if greedy else {"temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy, use_cache=True,
        pad_token_id=pad, eos_token_id=eos if len(eos) > 1 else eos[0], output_scores=with_log_probs,
        return_dict_in_generate=with_log_probs, **sampling,
    )


@contextlib.contextmanager
def _eval_mode_with_clean_generation_config(model):
    """Eval mode and an empty `generation_config` (checkpoint defaults cannot change sampling), restored."""
    was_training, saved = model.training, getattr(model, "generation_config", None)
    model.eval()
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved
        model.train(was_training)


def _left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
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


def _pad_to(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def _lock_step(model) -> bool:
    """Whether decoding must run in lock-step across ranks: a sharded (FSDP2) model's every forward is a
    collective, so a rank whose responses all ended keeps stepping on padding until every rank is done."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule) and torch.distributed.get_world_size() > 1


def _generate_chunk(model, rows: list[list[int]], config, pad, eos, with_log_probs: bool):
    prompt_ids, prompt_mask = _left_pad(rows, pad, model.device)
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config,
                         synced_gpus=_lock_step(model))
    sequences = out.sequences if with_log_probs else out
    new_tokens = sequences[:, prompt_ids.shape[1]:]
    ids, mask, finished = mask_after_eos(new_tokens, eos, pad)
    lp = _sampler_log_probs(out.scores, new_tokens).masked_fill(mask == 0, 0.0) if with_log_probs else None
    return prompt_ids, prompt_mask, ids, mask, finished, lp


def _sampler_log_probs(scores: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """(N, R) log-softmax of the per-step processed scores ((N, V) each) at the drawn tokens."""
    steps = torch.stack(scores, dim=1).float()  # (N, R, V)
    return torch.log_softmax(steps, dim=-1).gather(-1, tokens[:, :steps.shape[1], None]).squeeze(-1)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str] | None, *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, do_sample: bool = True, batch_size: int | None = None,
             prompt_format: PromptFormat | None = None, with_log_probs: bool = False,
             prompt_ids: list[list[int]] | None = None) -> Generation:
    """Sample (or, with temperature 0 / do_sample=False, greedily decode) one response per prompt.

    `batch_size` splits the prompts into chunks for memory; results are re-padded to common widths.
    `prompt_format` (vapo_engine.prompts) encodes the prompts; None = plain text, as-is. `prompt_ids` gives
    the prompts as token ids instead (`prompts` None; e.g. a prompt plus part of a response, to continue).
    `with_log_probs` also returns the sampler's log-probs of the drawn tokens (`Generation.log_probs`).
    """
    if not (prompts if prompt_ids is None else prompt_ids):
        raise ValueError("generate() needs at least one prompt")
    rows = prompt_ids if prompt_ids is not None else encode_prompts(tokenizer, prompts, prompt_format)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    pad, eos = special_ids(model, tokenizer)
    config = _sampling_config(max_new_tokens, temperature, top_p, do_sample, pad, eos, with_log_probs)
    step = batch_size or len(rows)
    with _eval_mode_with_clean_generation_config(model):
        chunks = [_generate_chunk(model, rows[i:i + step], config, pad, eos, with_log_probs)
                  for i in range(0, len(rows), step)]
    p_width = max(c[0].shape[1] for c in chunks)
    r_width = max(1, max(int(c[3].sum(dim=-1).max().item()) for c in chunks))
    prompt_ids = torch.cat([_pad_to(c[0], p_width, pad, left=True) for c in chunks])
    prompt_mask = torch.cat([_pad_to(c[1], p_width, 0, left=True) for c in chunks])
    response_ids = torch.cat([_pad_to(c[2], r_width, pad, left=False)[:, :r_width] for c in chunks])
    response_mask = torch.cat([_pad_to(c[3], r_width, 0.0, left=False)[:, :r_width] for c in chunks])
    finished = torch.cat([c[4] for c in chunks])
    log_probs = torch.cat([_pad_to(c[5], r_width, 0.0, left=False)[:, :r_width] for c in chunks]
                          ) if with_log_probs else None
    lengths = response_lengths(response_mask).tolist()
    texts = tokenizer.batch_decode(
        [row[:n].tolist() for row, n in zip(response_ids, lengths)], skip_special_tokens=True
    )
    return Generation(prompt_ids, prompt_mask, response_ids, response_mask, texts, finished, log_probs)
