"""Sampling for the rollout layer: prompts in (text, or token ids), a `Generation` out.

`sample(models, ...)` samples with the run's rollout backend (`models.backend`, see `rollout.backends`);
`generate(model, tokenizer, ...)` with a bare Hugging Face model through the in-process backend, for code that
has no run (the built-in model's warm-start, tests, benchmarks). Both encode the prompts (plain text, or the
model's chat template when given a chat `vapo_engine.prompts.PromptFormat`), state every sampling setting
explicitly (`sampling_params`: EOS ids from the tokenizer and the model's generation config, pad defaults to
EOS) and return a `Generation`: prompts left-padded, responses right-padded, a response mask that covers every
token up to AND including the first EOS, and pad tokens everywhere after it.

Sampling is pure (no checkpoint default applies): tokens are drawn from softmax(logits / temperature), truncated
to the top-p nucleus when top_p < 1 (top-k is off). The trainer's log-probs (`experience.response_log_probs`)
are of softmax(logits / temperature) over the full vocabulary: the sampled distribution exactly when top_p = 1,
an approximation of it when top_p < 1 (the nucleus is not renormalised there; `vapo-mcp config check` warns).
With `with_log_probs=True` the sampler's own log-probs of the drawn tokens come back too (log-softmax of the
processed scores: temperature and top-p applied), which is how a test proves the two agree. Randomness comes
from torch's global RNG (the caller seeds it) unless a `seed` is given. This file does not compute values or
rewards, and does not batch by length or stream.
"""
from __future__ import annotations

from vapo_engine.prompts import PromptFormat, encode_prompts

from .backends.base import Generation, SamplingParams, mask_after_eos, response_lengths
from .backends.hf import _lock_step, generate_ids

__all__ = ["Generation", "SamplingParams", "_lock_step", "generate", "mask_after_eos", "response_lengths", "sample",
           "sampling_params", "special_ids"]


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


def sampling_params(model, tokenizer, *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                    do_sample: bool = True, with_log_probs: bool = False, seed: int | None = None,
                    policy_outputs: bool = False) -> SamplingParams:
    """Every setting of one sampling call: greedy when `do_sample` is False or the temperature is 0; stop and pad
    ids from `special_ids(model, tokenizer)`; `policy_outputs`: see `SamplingParams.policy_outputs`."""
    pad, eos = special_ids(model, tokenizer)
    return SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(eos), pad_token_id=pad,
                          temperature=float(temperature) if do_sample else 0.0, top_p=float(top_p), seed=seed,
                          log_probs=with_log_probs, policy_outputs=policy_outputs)


def _rows(tokenizer, prompts: list[str] | None, prompt_ids: list[list[int]] | None,
          prompt_format: PromptFormat | None) -> list[list[int]]:
    if not (prompts if prompt_ids is None else prompt_ids):
        raise ValueError("generate() needs at least one prompt")
    return prompt_ids if prompt_ids is not None else encode_prompts(tokenizer, prompts, prompt_format)


def generate(model, tokenizer, prompts: list[str] | None, *, max_new_tokens: int, temperature: float = 1.0,
             top_p: float = 1.0, do_sample: bool = True, batch_size: int | None = None,
             prompt_format: PromptFormat | None = None, with_log_probs: bool = False,
             prompt_ids: list[list[int]] | None = None) -> Generation:
    """Sample (or, with temperature 0 / do_sample=False, greedily decode) one response per prompt from `model`.

    `batch_size` splits the prompts into chunks for memory; results are re-padded to common widths.
    `prompt_format` (vapo_engine.prompts) encodes the prompts; None = plain text, as-is. `prompt_ids` gives
    the prompts as token ids instead (`prompts` None; e.g. a prompt plus part of a response, to continue).
    `with_log_probs` also returns the sampler's log-probs of the drawn tokens (`Generation.log_probs`).
    """
    rows = _rows(tokenizer, prompts, prompt_ids, prompt_format)
    params = sampling_params(model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                             do_sample=do_sample, with_log_probs=with_log_probs)
    return generate_ids(model, tokenizer, rows, params, batch_size=batch_size)


def sample(models, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
           do_sample: bool = True, batch_size: int | None = None, prompt_format: PromptFormat | None = None,
           with_log_probs: bool = False, seed: int | None = None, policy_outputs: bool = False) -> Generation:
    """Like `generate`, for the run's `models` (`trainer.models.Models`): their rollout backend samples from
    their policy. `seed` seeds this call alone (None: the caller's torch random stream); `policy_outputs`: see
    `SamplingParams.policy_outputs`."""
    rows = _rows(models.tokenizer, prompts, None, prompt_format)
    params = sampling_params(models.policy, models.tokenizer, max_new_tokens=max_new_tokens,
                             temperature=temperature, top_p=top_p, do_sample=do_sample,
                             with_log_probs=with_log_probs, seed=seed, policy_outputs=policy_outputs)
    return models.backend.generate(models, rows, params, batch_size=batch_size)
