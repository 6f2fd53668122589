"""The in-process Hugging Face backend ("hf", the default): `model.generate` with the KV cache on the live
policy module. The only place in the project that calls `model.generate` or builds a `GenerationConfig`
(`serving/` and the built-in model use the helpers here).

Sampling is pure: the checkpoint's own `generation_config` (top-k, repetition penalty, ...) is swapped for an
empty one during the call, so only `SamplingParams` apply: tokens are drawn from softmax(logits / temperature),
truncated to the top-p nucleus when top_p < 1 (top-k off unless asked for; transformers' global default of 50
is never used). With `SamplingParams.log_probs` the sampler's own log-probs of the drawn tokens come back too
(log-softmax of the processed scores: temperature and top-p applied); with `SamplingParams.policy_outputs` the
trainer's old-output pass is read off the decoding steps instead of recomputed (`_PolicyOutputs`). Prompts are split into chunks of
`batch_size` rows for memory and the results re-padded to common widths. A sharded (FSDP2) policy decodes in
lock-step across ranks. Weights need no loading: the next call samples from the module as it is.
"""
from __future__ import annotations

import contextlib

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from vapo_engine.algo.logits import entropy_from_logits, log_probs_from_logits

from .base import (
    Generation,
    PolicyModels,
    RolloutBackend,
    SamplingParams,
    decode_responses,
    left_pad,
    mask_after_eos,
    pad_to,
)
from .registry import register_backend


@register_backend("hf")
class HfBackend(RolloutBackend):
    """Samples with `model.generate` from `models.policy` itself (in this process, on its device)."""

    name = "hf"

    def __init__(self, options=None):
        del options  # the [rollout] section: nothing in it for this backend

    def generate(self, models: PolicyModels, prompt_ids: list[list[int]], params: SamplingParams, *,
                 batch_size: int | None = None) -> Generation:
        return generate_ids(models.policy, models.tokenizer, prompt_ids, params, batch_size=batch_size)


def generation_config(params: SamplingParams, *, raw_logits: bool = False) -> GenerationConfig:
    """The `GenerationConfig` of one call: greedy at temperature 0, else pure sampling from `params`; with
    `raw_logits` the output also holds each step's unprocessed logits (`output_logits`, for the served
    protocol's full-vocabulary log-probs)."""
    # top_k explicitly (0 = off): otherwise transformers' global default (top_k=50) would truncate the distribution.
    sampling = {} if params.greedy else {"temperature": float(params.temperature), "top_p": float(params.top_p),
                                         "top_k": int(params.top_k)}
    eos = list(params.stop_token_ids)
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens, do_sample=not params.greedy, use_cache=True,
        pad_token_id=params.pad_token_id, eos_token_id=eos if len(eos) > 1 else eos[0],
        output_scores=params.log_probs, output_logits=raw_logits or None,
        return_dict_in_generate=params.log_probs or raw_logits, **sampling,
    )


def generation_defaults(**token_ids: int) -> GenerationConfig:
    """A model's stored `generation_config` that sets nothing but the given special token ids (none: empty),
    so no sampling default can come from a checkpoint."""
    return GenerationConfig(**token_ids)


@contextlib.contextmanager
def _eval_mode_with_clean_generation_config(model):
    """Eval mode and an empty `generation_config` (checkpoint defaults cannot change sampling), restored."""
    was_training, saved = model.training, getattr(model, "generation_config", None)
    model.eval()
    model.generation_config = generation_defaults()
    try:
        yield
    finally:
        model.generation_config = saved
        model.train(was_training)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """A forked torch random stream seeded with `seed` (the caller's stream untouched); None: the caller's."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _lock_step(model) -> bool:
    """Whether decoding must run in lock-step across ranks: a sharded (FSDP2) model's every forward is a
    collective, so a rank whose responses all ended keeps stepping on padding until every rank is done."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule) and torch.distributed.get_world_size() > 1


class _PolicyOutputs(LogitsProcessor):
    """Reads the trainer's old-output pass off the decoding steps: at each step the entropy of softmax(logits / T)
    and, one call later (when the drawn token is the last column of `input_ids`), the drawn token's log-prob
    under it; the last step's token is read from the output (`collect`). Sees the raw logits (custom processors
    run before generate's temperature / top-p warpers) and returns them unchanged; keeps one step's (N, V)
    logits at a time. Uses the trainer's formulas (vapo_engine.algo.logits), so the numbers differ from the
    trainer's full-sequence pass only by the rounding of the KV-cached forward."""

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0  # greedy: log-probs at T = 1 (as the trainer)
        self._last: torch.Tensor | None = None
        self._log_probs: list[torch.Tensor] = []
        self._entropy: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._last is not None:
            self._log_probs.append(log_probs_from_logits(self._last, input_ids[:, -1:])[:, 0])
        z = scores.float()[:, None, :]
        self._last = z / self.temperature if self.temperature != 1.0 else z
        self._entropy.append(entropy_from_logits(self._last)[:, 0])
        return scores

    def collect(self, new_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, entropies), each (N, R) for the R drawn tokens `new_tokens`."""
        if self._last is not None and len(self._log_probs) < new_tokens.shape[1]:
            self._log_probs.append(log_probs_from_logits(self._last, new_tokens[:, -1:])[:, 0])
        r = new_tokens.shape[1]
        return torch.stack(self._log_probs[:r], dim=1), torch.stack(self._entropy[:r], dim=1)


def run(model, rows: list[list[int]], params: SamplingParams, *, stopping_criteria=None, raw_logits: bool = False,
        logits_processor: LogitsProcessor | None = None):
    """One `model.generate` call on token-id `rows` (left-padded here): (prompt ids, prompt mask, raw output).
    `stopping_criteria` (a transformers `StoppingCriteriaList`) sees every step, e.g. to stream; `raw_logits`
    (see `generation_config`) makes the output a dict with `sequences` and `logits`; `logits_processor` sees
    each step's raw logits (and must return them unchanged)."""
    prompt_ids, prompt_mask = left_pad(rows, params.pad_token_id, model.device)
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                         generation_config=generation_config(params, raw_logits=raw_logits), synced_gpus=_lock_step(model),
                         stopping_criteria=stopping_criteria,
                         logits_processor=LogitsProcessorList([logits_processor] if logits_processor else []))
    return prompt_ids, prompt_mask, out


def _chunk(model, rows: list[list[int]], params: SamplingParams):
    policy = _PolicyOutputs(params.temperature) if params.policy_outputs else None
    prompt_ids, prompt_mask, out = run(model, rows, params, logits_processor=policy)
    sequences = out.sequences if params.log_probs else out
    new_tokens = sequences[:, prompt_ids.shape[1]:]
    ids, mask, finished = mask_after_eos(new_tokens, list(params.stop_token_ids), params.pad_token_id)
    lp = _sampler_log_probs(out.scores, new_tokens).masked_fill(mask == 0, 0.0) if params.log_probs else None
    outputs = None
    if policy is not None:
        outputs = tuple(x.masked_fill(mask == 0, 0.0) for x in policy.collect(new_tokens))
    return prompt_ids, prompt_mask, ids, mask, finished, lp, outputs


def _sampler_log_probs(scores: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """(N, R) log-softmax of the per-step processed scores ((N, V) each) at the drawn tokens."""
    steps = torch.stack(scores, dim=1).float()  # (N, R, V)
    return torch.log_softmax(steps, dim=-1).gather(-1, tokens[:, :steps.shape[1], None]).squeeze(-1)


@torch.no_grad()
def generate_ids(model, tokenizer, rows: list[list[int]], params: SamplingParams, *,
           batch_size: int | None = None) -> Generation:
    """`params.n` responses per token-id row from `model` (eval mode and a clean generation config during the
    call, both restored), in chunks of at most `batch_size` rows; `tokenizer` decodes the texts."""
    if not rows:
        raise ValueError("generate() needs at least one prompt")
    rows = [row for row in rows for _ in range(params.n)]
    step, pad = batch_size or len(rows), params.pad_token_id
    with _seeded(params.seed, model.device), _eval_mode_with_clean_generation_config(model):
        chunks = [_chunk(model, rows[i:i + step], params) for i in range(0, len(rows), step)]
    p_width = max(c[0].shape[1] for c in chunks)
    r_width = max(1, max(int(c[3].sum(dim=-1).max().item()) for c in chunks))
    prompt_ids = torch.cat([pad_to(c[0], p_width, pad, left=True) for c in chunks])
    prompt_mask = torch.cat([pad_to(c[1], p_width, 0, left=True) for c in chunks])
    response_ids = torch.cat([pad_to(c[2], r_width, pad, left=False)[:, :r_width] for c in chunks])
    response_mask = torch.cat([pad_to(c[3], r_width, 0.0, left=False)[:, :r_width] for c in chunks])
    finished = torch.cat([c[4] for c in chunks])

    def responses(get) -> torch.Tensor:  # a per-response-token tensor of every chunk, at the common width
        return torch.cat([pad_to(get(c), r_width, 0.0, left=False)[:, :r_width] for c in chunks])
    log_probs = responses(lambda c: c[5]) if params.log_probs else None
    policy_lp, entropy = (responses(lambda c: c[6][0]), responses(lambda c: c[6][1])) if params.policy_outputs \
        else (None, None)
    return Generation(prompt_ids, prompt_mask, response_ids, response_mask,
                      decode_responses(tokenizer, response_ids, response_mask), finished, log_probs,
                      policy_log_probs=policy_lp, entropy=entropy)
