"""Off-policy rollouts (docs/design.md §3.13): which weights each rollout was sampled with, how stale it may be,
the next rollout sampled while the current update runs, and the importance weights that correct the difference
between the sampler's log-probs and the trainer's (`vapo_engine.algo.mismatch`).

Versions. The policy's weight version is the number of rollout steps whose updates it has taken
(`policy_version`: 0 for the initial weights, v + 1 once rollout step v's updates are done; with one update per
rollout, the default, it equals the policy step). A backend with its own copy of the weights (an inference
server) is told each new version (`RolloutBackend.load_weights(models, version=policy_version(tr))`) and
reports the version it sampled with (`Generation.weight_version`); the in-process hf backend samples from
the live policy (the current version) or, asynchronously, from a snapshot tagged with the version it copied.
lag = current version − the sample's version (rollout/weight_version_lag; 0 for a synchronous hf run).

Asynchronous rollouts (`rollout.max_off_policy_steps` = k > 0). Just before the updates of rollout step r,
`Prefetch.start` samples rollout r + 1 in a background thread; `Prefetch.finish` waits for it right after the
updates, so the thread overlaps the updates only — never the tokenizer, an evaluation or a checkpoint on the main
thread. With hf it samples from a frozen copy of the policy (weights version r, copied before the first update
of step r), so the updates that make version r + 1 never change weights under a running `generate`; the copy
costs one more set of the policy's parameters in memory (kept and refreshed in place each step). Rollout r + 1
then trains at lag 1. A batch more than k versions old is dropped (rollout/dropped_stale counts its samples) and
sampled again from the current weights; a backend that answers with stale weights again is an error. The
prefetched rollout is not checkpointed: a resumed run samples its first rollout synchronously. Random streams:
the thread seeds torch's global RNG inside a fork (the `sampling` stream of its step, as a synchronous run
does), so a run is reproducible as long as the update draws nothing from that RNG meanwhile (no dropout: the
built-in models have none; keep lora.dropout = 0).
"""
from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from vapo_engine.algo.mismatch import importance_weights, mismatch_metrics, mismatch_sums
from vapo_engine.errors import UserError
from vapo_engine.rollout.backends.hf import HfBackend
from vapo_engine.rollout.experience import Rollout, sample_rollout

from . import streams


def policy_version(tr) -> int:
    """The version of the policy's current weights: rollout steps whose updates it has taken."""
    return tr.rollout_step


def step_prompts(tr, phase: str, index: int) -> list:
    """The global prompt list of rollout `index` of `phase` (the same on every rank, trainer/streams.py)."""
    return tr.task.train_batch(tr.cfg.prompts_per_step, streams.rng(tr.info.seed, f"{phase}_prompts", index))


def reads_old_log_probs(rollout, models) -> bool:
    """Whether a rollout's old log-probs are read off the sampler (rollout.old_log_probs; the config refuses
    "sampler" where it cannot be): "auto" where the sampler's forward and the trainer's are one fp32 computation
    (synchronous hf without correction, fp32 parameters, no autocast)."""
    if rollout.old_log_probs != "auto":
        return rollout.old_log_probs == "sampler"
    exact = models.autocast_dtype is None and all(p.dtype == torch.float32 for p in models.policy.parameters())
    return exact and rollout.sampler_lacks is None


def sample_step(tr, models, phase: str, index: int, prompts: list, version: int) -> Rollout:
    """This rank's groups of `prompts`, sampled by `models.backend` from `models.policy` (whose weights are
    `version`), scored, tagged with the version that sampled them; no old log-probs yet."""
    cfg, p = tr.cfg, tr.parallel
    share = cfg.prompts_per_step // p.size
    problems = [q for q in prompts[p.rank * share:(p.rank + 1) * share] for _ in range(cfg.vapo.group_size)]
    with streams.seeded(tr.info.seed, "sampling", phase, index, p.rank, device=models.device):
        ro = sample_rollout(models, tr.task, problems, max_new_tokens=cfg.model.max_tokens,
                            temperature=cfg.model.temperature, top_p=cfg.model.top_p, prompt_format=tr.prompts,
                            with_sampler_log_probs=cfg.rollout.wants_sampler_log_probs,
                            with_policy_outputs=phase == "policy" and reads_old_log_probs(cfg.rollout, models),
                            episode=tr.episode, judge=tr.judge)
    return ro if ro.weight_version is not None else replace(ro, weight_version=version)


@dataclass
class Prefetch:
    """The rollout sampled ahead, in a background thread, while the current update runs (k > 0 only)."""

    dropped: int = 0
    """Samples dropped for staleness so far (rollout/dropped_stale)."""
    _pool: ThreadPoolExecutor | None = None
    _pending: tuple[str, int, Future] | None = None
    _snapshot: torch.nn.Module | None = field(default=None, repr=False)

    def start(self, tr, phase: str, index: int) -> None:
        """Begin sampling rollout `index` of `phase` from the policy's weights as they are now."""
        version, models = policy_version(tr), tr.models
        if isinstance(models.backend, HfBackend):  # samples from the module it is given: give it a frozen copy
            models = replace(models, policy=self._frozen_copy(models.policy))
        prompts = step_prompts(tr, phase, index)
        self._pool = self._pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch-rollout")
        self._pending = (phase, index, self._pool.submit(sample_step, tr, models, phase, index, prompts, version))

    def finish(self) -> None:
        """Wait until the rollout being sampled is done (its errors surface in `take`)."""
        if self._pending is not None:
            self._pending[2].exception()

    def take(self, phase: str, index: int) -> Rollout | None:
        """The prefetched rollout `index` of `phase` (None if none was started for it)."""
        if self._pending is None or self._pending[:2] != (phase, index):
            return None
        pending, self._pending = self._pending, None
        return pending[2].result()

    def close(self) -> None:
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    @torch.no_grad()
    def _frozen_copy(self, policy: torch.nn.Module) -> torch.nn.Module:
        if self._snapshot is None:
            self._snapshot = copy.deepcopy(policy).requires_grad_(False)
        else:
            self._snapshot.load_state_dict(policy.state_dict())
        return self._snapshot


def allowed_lag(rollout_cfg) -> int:
    """How many versions a sample may lag: max_off_policy_steps, or, when the weights are pushed only every
    `sync_every` steps, the sync_every − 1 versions that the replicas lag between pushes by design."""
    return max(rollout_cfg.max_off_policy_steps, rollout_cfg.sync_every - 1)


def within_bound(tr, ro: Rollout, resample) -> Rollout:
    """`ro`, or, when its weights are more than `rollout.max_off_policy_steps` versions behind the policy, a fresh
    rollout from `resample()` (the stale one is dropped and counted)."""
    k, now = allowed_lag(tr.cfg.rollout), policy_version(tr)
    if now - ro.weight_version <= k:
        return ro
    tr.prefetch.dropped += ro.size
    fresh = resample()
    if now - fresh.weight_version > k:
        raise UserError(f"rollout backend {tr.cfg.rollout.backend!r} sampled with weights version "
                        f"{fresh.weight_version}, {now - fresh.weight_version} versions behind the policy "
                        f"(version {now}; at most {k} allowed by rollout.max_off_policy_steps / sync_every), even "
                        "when asked again: it did not load the trainer's new weights; check its weight loading "
                        "(or its log), or raise rollout.max_off_policy_steps")
    return fresh


def correct_mismatch(tr, ro: Rollout) -> tuple[Rollout, dict[str, float]]:
    """Importance weights of `ro` (the trainer's old log-probs against the sampler's, `rollout.is_mode`) and the
    rollout/… mismatch metrics (global over ranks); unchanged, and no metrics, without sampler log-probs (an
    error if rollout.is_mode names a correction explicitly)."""
    r, mode = tr.cfg.rollout, tr.cfg.decisions.importance_sampling
    if ro.sampler_log_probs is None:  # auto asks, and corrects when the backend answers (one that cannot: as is)
        if mode != "off" and r.is_mode != "auto":
            raise UserError(f"rollout.is_mode = {mode!r} needs the sampler's log-probs, and rollout backend "
                            f"{r.backend!r} returned none: use a backend that returns them (hf, vllm, sglang, "
                            "server), or set rollout.is_mode = \"off\"")
        return ro, {}
    w, bounded = importance_weights(ro.old_log_probs, ro.sampler_log_probs, ro.loss_mask, cap=r.is_cap,
                                    mode=mode)
    sums, max_diff = mismatch_sums(ro.old_log_probs, ro.sampler_log_probs, w, bounded, ro.loss_mask)
    metrics = mismatch_metrics(tr.parallel.sum(sums), max_diff)
    return (ro if mode == "off" else replace(ro, is_weights=w)), metrics


def more_rollouts(tr, updates_now: int) -> bool:
    """Whether another policy rollout follows this one (whose updates are `updates_now` optimizer steps)."""
    return tr.step + updates_now < tr.cfg.training.total_steps
