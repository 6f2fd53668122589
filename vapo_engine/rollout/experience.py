"""A rollout batch: sample responses, score them, and attach old log-probs, reference log-probs and values.

Alignment: the sequence is [left-padded prompt (P) | right-padded response (R)]. The log-prob of response
token t comes from the logits at position P−1+t; V(s_t) is the value head at the same position (the state
*before* token t), i.e. `values[:, P-1:L-1]`. Does not compute advantages or update.

Extent and loss mask. `response_mask` is the response's extent: 1 for every token of the episode (what the policy
wrote and, in a multi-turn episode, what the environment inserted: tool results, rollout/episodes.py), 0 for the
right padding; it sizes the sequence (attention, trimming, the token budget of micro-batches). `loss_mask` is 1
only where the policy wrote the token: those tokens learn (policy loss, positive NLL, KL, value loss, entropy)
and are the steps of GAE; inserted tokens are the environment's transition between two policy tokens
(docs/design.md §3.2). In a single-turn rollout the two are the same tensor. The sequence reward sits on the last
token the policy wrote (EOS included when generated), never on padding or on an inserted token.

Temperature: every policy log-prob and entropy here (old, new, reference, positive-example NLL) is of
log-softmax(logits / T) over the full vocabulary, T = `Rollout.temperature`, the temperature the tokens were
sampled at (`logprob_temperature`: 1.0 for greedy rollouts). At T ≠ 1 the raw logits would describe another
policy than the sampled one, and the PPO ratio of the first mini-batch would not be 1. top-p / top-k
truncation is *not* renormalised: the log-probs are those of the full-vocabulary distribution at T (as verl,
TRL and vLLM's processed log-probs with top_p = 1 do), so with top_p < 1 the ratio is approximate
(`vapo-mcp config check` warns).
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, fields, replace

import torch

from vapo_engine.algo import entropy_from_logits, log_probs_from_logits
from vapo_engine.prompts import PromptFormat
from vapo_engine.tasks.verifiers import Judge, Verdict, make_judge

from .generate import response_lengths
from .value_head import head_inputs, head_kind


@dataclass
class Rollout:
    input_ids: torch.Tensor        # (N, L) prompt ids left-padded + response ids right-padded
    attention_mask: torch.Tensor   # (N, L)
    position_ids: torch.Tensor     # (N, L)
    response_mask: torch.Tensor    # (N, R) float, 1 up to and including EOS
    scores: torch.Tensor           # (N,) sequence reward
    correct: torch.Tensor          # (N,) bool
    token_rewards: torch.Tensor    # (N, R) score on the last valid token, 0 elsewhere
    prompt_len: int
    texts: list[str]
    old_log_probs: torch.Tensor | None = None   # (N, R)
    ref_log_probs: torch.Tensor | None = None   # (N, R)
    values: torch.Tensor | None = None          # (N, R) V(s_t)
    entropy: torch.Tensor | None = None         # (N, R)
    advantages: torch.Tensor | None = None      # (N, R) policy advantages (after whitening)
    returns: torch.Tensor | None = None         # (N, R) critic targets
    sampler_log_probs: torch.Tensor | None = None  # (N, R) the sampler's own log-probs, when asked for
    finished: torch.Tensor | None = None        # (N,) bool: the response ended with EOS (False: max_new_tokens)
    is_weights: torch.Tensor | None = None      # (N, R) importance weights of the PG loss (algo/mismatch.py)
    loss_mask: torch.Tensor | None = None
    """(N, R) float, 1 where the policy wrote the token (it learns), 0 where the environment inserted it (a tool's
    result) and on padding; never 1 outside `response_mask`. None at construction = `response_mask` (single turn)."""
    turns: torch.Tensor | None = None           # (N,) policy turns of a multi-turn episode (None: one turn)
    tool_calls: torch.Tensor | None = None      # (N,) tool calls of each episode
    tool_errors: torch.Tensor | None = None     # (N,) calls that did not return the tool's complete answer
    verifier_timeouts: int = 0
    """Responses whose verification timed out (scored 0)."""
    weight_version: int | None = None
    """The version of the policy weights that sampled these (rollout steps whose updates they had taken,
    `trainer.offpolicy`, the tag a remote backend's weights were pushed with); None = not known."""
    gen_seconds: float = 0.0
    """Seconds spent sampling and scoring these rows."""
    old_seconds: float = 0.0
    """Seconds spent on their old outputs after sampling (values, reference / old log-probs: trainer/batches.py)."""
    temperature: float = 1.0
    """Softmax temperature of the policy log-probs and entropies (the sampling temperature; 1.0 if greedy)."""

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = self.response_mask

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        return response_lengths(self.response_mask)

    def rows(self, idx: torch.Tensor | slice) -> Rollout:
        """The sub-batch of rows `idx` (tensors sliced, texts kept aligned)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif f.name == "texts":
                ids = range(len(v))[idx] if isinstance(idx, slice) else idx.tolist()
                out[f.name] = [v[i] for i in ids]
        return replace(self, **out)

    def trimmed(self) -> Rollout:
        """The same rows with the response part cut to the longest response among them (at least 1 column):
        the sequence tensors to P + r columns, every per-token (N, R) tensor to r. Only right padding goes, so
        each kept position sees exactly the tokens it saw before (causal attention): log-probs and values of
        valid tokens do not change."""
        width = self.response_mask.shape[1]
        used = torch.nonzero(self.response_mask.ne(0).any(dim=0))  # columns any row still uses
        r = max(int(used[-1]) + 1 if len(used) else 0, 1)
        if r >= width:
            return self
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, torch.Tensor) or v.dim() < 2:
                continue
            if f.name in SEQUENCE_FIELDS:
                out[f.name] = v[:, :self.prompt_len + r]
            elif v.shape[1] == width:
                out[f.name] = v[:, :r]
            else:
                raise ValueError(f"Rollout.{f.name} has {v.shape[1]} columns, neither the sequence width "
                                 f"{self.prompt_len + width} nor the response width {width}")
        return replace(self, **out)


SEQUENCE_FIELDS = ("input_ids", "attention_mask", "position_ids")
"""Rollout tensors over the whole sequence (N, P + R); every other 2-D tensor is per response token (N, R)."""


def position_ids_from(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generation used them: cumsum(mask) − 1, clamped at 0. (B, L)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_valid(mask: torch.Tensor) -> torch.Tensor:
    """(N,) column of the last non-zero entry of each row of `mask` (N, R); −1 for an empty row. With a right-padded
    mask, its length − 1; with a loss mask, the last token the policy wrote."""
    ones = mask.ne(0).long()
    return (ones * torch.arange(1, mask.shape[1] + 1, device=mask.device)).max(dim=1).values - 1 \
        if mask.shape[1] else torch.full((mask.shape[0],), -1, dtype=torch.long, device=mask.device)


def place_rewards(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(N,) scores → (N, R) token rewards on the last token of each row that the policy wrote (the last valid
    token of a single-turn response; 0 for empty rows)."""
    rewards = torch.zeros_like(loss_mask, dtype=torch.float32)
    last = last_valid(loss_mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows].float()
    return rewards


def logprob_temperature(temperature: float) -> float:
    """The temperature of the log-probs of tokens sampled at `temperature`: itself, or 1.0 for greedy (0)."""
    return float(temperature) if temperature > 0 else 1.0


def from_token_ids(pairs: list[tuple], pad_id: int, device, temperature: float = 1.0) -> Rollout:
    """A scored-as-correct Rollout from (prompt ids, response ids) pairs (e.g. replayed positives), or (prompt ids,
    response ids, loss mask) triples (a multi-turn episode, whose inserted tokens do not learn), whose log-probs
    are taken at `temperature` (the run's sampling temperature)."""
    p_len = max(len(it[0]) for it in pairs)
    r_len = max(len(it[1]) for it in pairs)
    n = len(pairs)
    ids = torch.full((n, p_len + r_len), pad_id, dtype=torch.long)
    attn = torch.zeros((n, p_len + r_len), dtype=torch.long)
    for i, (p, r, *_) in enumerate(pairs):
        ids[i, p_len - len(p):p_len] = torch.tensor(p)
        ids[i, p_len:p_len + len(r)] = torch.tensor(r)
        attn[i, p_len - len(p):p_len + len(r)] = 1
    resp_mask = attn[:, p_len:].float()
    loss_mask = resp_mask
    if any(len(it) > 2 for it in pairs):
        loss_mask = resp_mask.clone()
        for i, it in enumerate(pairs):
            if len(it) > 2:
                loss_mask[i, :len(it[1])] = torch.tensor(it[2], dtype=torch.float32)
    ones = torch.ones(n)
    return Rollout(ids.to(device), attn.to(device), position_ids_from(attn).to(device), resp_mask.to(device),
                   ones.to(device), ones.bool().to(device), place_rewards(ones, loss_mask).to(device), p_len,
                   [""] * n, temperature=logprob_temperature(temperature), loss_mask=loss_mask.to(device))


def sample_rollout(models, task, problems, *, max_new_tokens: int, temperature: float, top_p: float,
                   do_sample: bool = True, prompt_format: PromptFormat | None = None,
                   with_sampler_log_probs: bool = False, with_policy_outputs: bool = False, episode=None,
                   judge: Judge | None = None) -> Rollout:
    """One episode per problem (repeat problems for groups) — `episode` (rollout/episodes.py; None = a single
    turn of the run's rollout backend, `models.backend`) — scored by `judge` (tasks/verifiers.py; None = the
    task's default verifier); the prompts are encoded in `prompt_format` (None = plain). `with_sampler_log_probs`
    keeps the sampler's own log-probs of the drawn tokens (`Rollout.sampler_log_probs`); `with_policy_outputs`
    takes the old log-probs and entropies from the sampler where the backend has them
    (`SamplingParams.policy_outputs`; rollout.old_log_probs = "sampler")."""
    from .episodes import SINGLE_TURN
    t0 = time.perf_counter()
    gen = (episode or SINGLE_TURN).sample(
        models, [p.prompt for p in problems], max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        do_sample=do_sample and temperature > 0, prompt_format=prompt_format, with_log_probs=with_sampler_log_probs,
        policy_outputs=with_policy_outputs)
    verdicts = (judge or make_judge("", task))(gen.texts, problems)
    return from_generation(gen, verdicts, models.device, temperature=temperature if do_sample else 0.0,
                           gen_seconds=time.perf_counter() - t0)


def from_generation(gen, verdicts: list[Verdict], device, *, temperature: float, gen_seconds: float = 0.0
                    ) -> Rollout:
    """The Rollout of a generation (`generate.Generation`, or an episode's) and its verdicts, sampled at
    `temperature` (0 = greedy). The generation's policy log-probs and entropies, where it has them, become the
    rollout's old log-probs and entropies (rollout.old_log_probs = "sampler")."""
    dev, scores = device, torch.tensor([v.score for v in verdicts], dtype=torch.float32)
    correct = torch.tensor([v.correct for v in verdicts], dtype=torch.bool)
    def on_device(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(dev)
    resp_mask = gen.response_mask.float()
    loss_mask = resp_mask if gen.loss_mask is None else gen.loss_mask.float()
    input_ids = torch.cat([gen.prompt_ids, gen.response_ids], dim=1)
    attn = torch.cat([gen.prompt_mask.long(), resp_mask.long()], dim=1)
    return Rollout(input_ids.to(dev), attn.to(dev), position_ids_from(attn).to(dev), resp_mask.to(dev),
                   scores.to(dev), correct.to(dev), place_rewards(scores, loss_mask).to(dev),
                   gen.prompt_ids.shape[1], gen.texts, sampler_log_probs=on_device(gen.log_probs),
                   old_log_probs=on_device(gen.policy_log_probs), entropy=on_device(gen.entropy),
                   finished=gen.finished.to(dev), gen_seconds=gen_seconds,
                   temperature=logprob_temperature(temperature),
                   weight_version=gen.weight_version, loss_mask=None if gen.loss_mask is None else loss_mask.to(dev),
                   turns=on_device(gen.turns), tool_calls=on_device(gen.tool_calls),
                   tool_errors=on_device(gen.tool_errors), verifier_timeouts=sum(v.timed_out for v in verdicts))


def response_log_probs(model, ro: Rollout, *, with_entropy: bool = False):
    """Log-probs (N, R) of the response tokens under `model` at `ro.temperature` (and token entropies of that
    distribution if asked: a diagnostic, computed without gradient)."""
    p, r = ro.prompt_len, ro.input_ids.shape[1] - ro.prompt_len
    out = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask, position_ids=ro.position_ids,
                use_cache=False, **keep_logits(model, r + 1))  # no (prompt × vocabulary) logits
    logits = out.logits[:, -(r + 1):-1, :]  # the model's dtype: algo/logits.py upcasts and scales row by row
    lp = log_probs_from_logits(logits, ro.input_ids[:, p:], ro.temperature)
    if not with_entropy:
        return lp, None
    with torch.no_grad():
        return lp, entropy_from_logits(logits.detach(), ro.temperature)


def keep_logits(model, n: int) -> dict:
    """`{"logits_to_keep": n}` when `model`'s forward takes it (transformers' causal LMs: the LM head then runs on
    the last `n` positions only), else {} (all positions; the caller slices)."""
    base = getattr(model, "policy", model)  # lora.FrozenBase: the policy with its adapters off
    base = base.get_base_model() if hasattr(base, "get_base_model") else base  # a peft wrapper passes it on
    try:
        takes = "logits_to_keep" in inspect.signature(base.forward).parameters
    except (AttributeError, TypeError, ValueError):
        takes = False
    return {"logits_to_keep": n} if takes else {}


def joined_log_probs(model, a: Rollout, b: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """`response_log_probs` of the rows of `a` and of `b` (same temperature) from ONE forward pass over both:
    the rows are re-padded to the wider prompt (left) and response (right) widths. Extra left padding is masked
    and the positions skip it, extra right padding comes after every token of a row (causal attention), so each
    valid token's log-prob is the one of its own pass up to float rounding. Returns (N_a, R_a), (N_b, R_b)."""
    if a.temperature != b.temperature:
        raise ValueError(f"joined rows need one temperature, got {a.temperature} and {b.temperature}")
    p = max(a.prompt_len, b.prompt_len)
    r = max(a.response_mask.shape[1], b.response_mask.shape[1])

    def padded(ro: Rollout, name: str) -> torch.Tensor:
        left, right = p - ro.prompt_len, r - ro.response_mask.shape[1]
        return torch.nn.functional.pad(getattr(ro, name), (left, right), value=0)
    attn = torch.cat([padded(a, "attention_mask"), padded(b, "attention_mask")])
    both = replace(a, input_ids=torch.cat([padded(a, "input_ids"), padded(b, "input_ids")]), attention_mask=attn,
                   position_ids=position_ids_from(attn), prompt_len=p)
    lp, _ = response_log_probs(model, both)
    n = a.size
    return lp[:n, :a.response_mask.shape[1]], lp[n:, :b.response_mask.shape[1]]


def response_values(value_model, ro: Rollout, log_probs: torch.Tensor | None = None) -> torch.Tensor:
    """V(s_t) for each response token t: the value head at the position before the token. (N, R). A `surprise`
    head (rollout/value_head.py) also reads the policy's log-probs of the tokens it wrote (the loss mask: inserted
    tool output is not the policy's draw): `log_probs` (N, R), or the rollout's old log-probs."""
    lp = ro.old_log_probs if log_probs is None else log_probs
    with head_inputs(value_model, None if lp is None else lp.detach(), ro.loss_mask, ro.prompt_len):
        out = value_model(input_ids=ro.input_ids, attention_mask=ro.attention_mask, position_ids=ro.position_ids,
                          use_cache=False)
    p = ro.prompt_len
    return out.logits[:, p - 1:-1, 0].float()


def value_log_probs(models, ro: Rollout) -> torch.Tensor | None:
    """The log-probs a value head needs (`response_values`): None for a linear head or when the rollout has its
    old log-probs; else the policy's, computed now without gradient (value pretraining, held-out evaluation)."""
    if models.value is None or head_kind(models.value) == "linear" or ro.old_log_probs is not None:
        return None
    with torch.no_grad():
        return response_log_probs(models.policy, ro)[0]


@torch.no_grad()
def attach_old_outputs(models, ro: Rollout, micro_batch: int, *, policy: bool = True) -> Rollout:
    """Fill old/ref log-probs, entropies and values by micro-batches, without gradients. `policy=False` leaves
    the policy's and the reference's outputs out (value pretraining uses values only). Old log-probs and
    entropies the rollout already has (read off the sampler: rollout.old_log_probs = "sampler") are kept, and
    the policy's pass is skipped."""
    own = policy and ro.old_log_probs is None
    parts: dict[str, list[torch.Tensor]] = {"old_log_probs": [], "entropy": [], "ref_log_probs": [], "values": []}
    for s in range(0, ro.size, micro_batch):
        mb = ro.rows(slice(s, s + micro_batch))
        with models.autocast():
            lp = None
            if own:
                lp, ent = response_log_probs(models.policy, mb, with_entropy=True)
                parts["old_log_probs"].append(lp)
                parts["entropy"].append(ent)
            if policy and models.reference is not None:
                parts["ref_log_probs"].append(response_log_probs(models.reference, mb)[0])
            if models.value is not None:
                lp = lp if lp is not None else value_log_probs(models, mb)
                if lp is not None and not own:  # value pretraining with a surprise head: kept for the updates
                    parts["old_log_probs"].append(lp)
                parts["values"].append(response_values(models.value, mb, lp))
    return replace(ro, **{k: torch.cat(v) for k, v in parts.items() if v})
