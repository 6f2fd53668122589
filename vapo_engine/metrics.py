"""The metric catalogue: every name the trainer logs, with its meaning. Names are an API (docs/design.md §5.4).

The trainer writes only names listed here (a test checks it); diagnostics and `report_metrics` read the
same names. How each name combines across the ranks of a distributed run is declared here too (`COMBINE`). `read_metrics` parses a run's append-only metrics.jsonl, tolerating a torn last line; `latest`
reads only its end (what list_runs / run_status show). Torch-free.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .datafiles import open_read

_PROVIDER: dict[str, str] = {
    "requests": "HTTP attempts sent to the provider", "ok": "answers received", "failed": "answers that failed",
    "retries": "retried attempts (429, 5xx, timeouts)", "rate_limited": "429 responses",
    "dropped": "prompts not queued because the bounded queue was full (never a stalled step)",
    "skipped": "answers not asked because the provider is down", "results_dropped": "answers dropped unread",
    "concurrency": "current concurrency limit (halved on repeated 429, grown back on success)",
    "concurrency_low": "lowest concurrency limit so far", "in_flight_peak": "most requests in flight at once",
    "latency_p50_s": "median answer latency", "latency_p95_s": "95th-percentile answer latency",
    "prompt_tokens": "prompt tokens billed", "completion_tokens": "completion tokens billed",
    "last_retry_after_s": "the last Retry-After honoured", "down": "1 once the provider is no longer used",
    "sent": "prompts sent (the max_requests budget counts these)",
    "cache_hits": "prompts answered from the run's cache (a resumed run does not pay twice)",
    "accuracy": "fraction of provider answers the task's checker accepts",
    "correct": "provider answers the task's checker accepts",
    "positives_added": "correct provider answers added to the positive replay buffer",
    "too_long": "correct provider answers longer than the token cap (not replayed)"}
"""The provider-samples counters (docs/design.md §8; cumulative over the run, rank 0 only)."""

CATALOGUE: dict[str, str] = {
    # actor
    "actor/pg_loss": "clipped policy-gradient loss of the optimizer step (aggregated as configured)",
    "actor/pg_clipfrac": "fraction of valid tokens whose ratio was clipped (either side)",
    "actor/pg_clipfrac_high": "fraction clipped at 1 + ε_high (A > 0); Clip-Higher raises this ceiling",
    "actor/pg_clipfrac_low": "fraction clipped at 1 − ε_low (A < 0)",
    "actor/approx_kl": "approximate KL(old ‖ new) over valid tokens (k3 estimator)",
    "actor/ratio_max": "largest importance ratio in the step",
    "actor/entropy": "mean token entropy of the policy on the rollout (collapse → exploration stops)",
    "actor/positive_nll": "positive-example LM loss: token-mean NLL over correct responses (+ replay)",
    "actor/kl_ref": "mean KL penalty to the frozen reference model (0 when kl_coef = 0)",
    "actor/grad_norm": "actor gradient norm before clipping",
    "actor/lr": "actor learning rate",
    # critic
    "critic/value_loss": "value loss (0.5 · squared error to the critic targets)",
    "critic/explained_var": "explained variance of the value predictions vs Monte-Carlo returns (λ = 1), the same "
                            "target in every run so ablation rows compare; omitted when undefined (constant returns)",
    "critic/explained_var_within_prompt": "explained variance vs Monte-Carlo returns within each prompt's group of "
                                          "samples (each group's mean removed): what the critic adds over a "
                                          "per-prompt baseline such as GRPO's",
    "critic/return_var": "variance of the Monte-Carlo returns over the step's valid tokens (the denominator of "
                         "critic/explained_var): EV pools over steps as 1 − Σ(1 − EV)·var / Σ var",
    "critic/explained_var_targets": "explained variance vs the targets the critic trains on (λ_critic, or λ_policy "
                                    "without Decoupled-GAE)",
    "critic/vf_clipfrac": "fraction of value predictions clipped (value_clip_range > 0)",
    "critic/value_mean": "mean predicted value over valid tokens",
    "critic/return_mean": "mean critic target over valid tokens",
    "critic/grad_norm": "critic gradient norm before clipping",
    "critic/lr": "critic learning rate",
    "critic/pretrain_value_loss": "value loss during value pretraining (frozen initial policy, λ = 1 targets)",
    "critic/pretrain_explained_var": "held-out explained variance of value pretraining: measured on each fresh "
                                     "rollout before the critic trains on it",
    "critic/pretrain_explained_var_within_prompt": "value pretraining: held-out explained variance within each "
                                                   "prompt's group of samples",
    "critic/pretrain_updates": "critic optimizer steps in the value-pretraining round",
    **{f"critic/pretrain_ev_pos_q{q}": f"value pretraining: held-out EV over the {w} quarter of each response"
       for q, w in ((1, "first"), (2, "second"), (3, "third"), (4, "last"))},
    **{f"critic/pretrain_ev_len_{b}": f"value pretraining: held-out EV over {b} responses ({r} tokens)"
       for b, r in (("short", "≤ 48"), ("mid", "49–120"), ("long", "> 120"))},
    # rollout
    "rollout/reward_mean": "mean sequence reward of the rollout batch",
    "rollout/accuracy": "fraction of sampled responses that are correct",
    "rollout/response_length": "mean response length in tokens (EOS included)",
    "rollout/response_length_max": "longest response in tokens",
    "rollout/truncated_frac": "fraction of responses that hit max_tokens without EOS",
    "rollout/no_signal_groups": "fraction of prompt groups whose samples all got the same reward (logged only "
                                "when vapo.group_size >= 2)",
    "rollout/tokens_per_s": "generated tokens per second in the rollout",
    "rollout/weight_version": "version of the policy weights the rollout was sampled with (remote rollout backends: "
                              "the rollout step whose weights the trainer pushed last)",
    "rollout/replica_failovers": "requests to an inference-server replica that failed and went to another one "
                                 "during the step (remote rollout backends)",
    "rollout/replicas_up": "inference-server replicas whose last request succeeded, at the end of the step (remote "
                           "rollout backends)",
    "rollout/prompts_digest": "48-bit digest of the step's prompt list (the same on every rank): runs with the "
                              "same seed draw the same prompts at the same step (trainer/streams.py), and records "
                              "prove it",
    "rollout/logprob_diff_mean": "mean |log π_trainer − log π_sampler| over the sampled tokens: the trainer's "
                                 "recomputed old log-probs against the rollout backend's own (≈ 0 when they "
                                 "are the same weights and kernels; logged when the backend returns log-probs)",
    "rollout/logprob_diff_max": "largest |log π_trainer − log π_sampler| of a sampled token",
    "rollout/is_weight_mean": "mean importance weight π_trainer / π_sampler applied to the policy-gradient loss "
                              "(after rollout.is_mode's truncation or masking)",
    "rollout/is_clipfrac": "fraction of sampled tokens whose importance weight was truncated at rollout.is_cap "
                           "(is_mode truncate) or masked for lying outside [1/is_cap, is_cap] (is_mode mask)",
    "rollout/weight_version_lag": "policy versions (rollout steps' updates) between the weights that sampled the "
                                  "batch and the weights it trains: 0 when synchronous, ≤ "
                                  "rollout.max_off_policy_steps",
    "rollout/dropped_stale": "samples dropped (and sampled again) so far because their weights were more than "
                             "rollout.max_off_policy_steps versions old",
    # multi-turn episodes (rollout.episode = "tool_calls"; logged only then) and verifiers
    "rollout/turns": "mean policy turns per episode (a turn ends at a tool call or at the final answer)",
    "rollout/tool_calls": "mean tool calls per episode",
    "rollout/tool_errors": "mean tool calls per episode whose result was not the tool's complete answer (an error, "
                           "a timeout, an unavailable server, a malformed call, a result cut to max_result_chars)",
    "rollout/tool_use": "fraction of episodes with at least one tool call",
    "rollout/policy_tokens": "mean tokens the policy wrote per episode (tool results excluded: the length of the "
                             "length-adaptive λ)",
    "rollout/verifier_timeouts": "responses whose verification did not finish within data.verifier_timeout_s "
                                 "(scored 0; logged when any)",
    "eval/greedy_tool_calls": "mean tool calls per held-out problem of the greedy episodes (tool_calls episodes)",
    # vapo
    "vapo/lambda_policy_mean": "mean λ_policy of the batch (length-adaptive or lambda_base)",
    "vapo/lambda_policy_min": "smallest λ_policy of the batch",
    "vapo/lambda_clamped_frac": "fraction of sequences whose λ_policy was clamped to 0 (α·l ≤ 1)",
    "vapo/advantage_mean": "mean policy advantage before whitening",
    "vapo/advantage_std": "std of the policy advantage before whitening",
    "vapo/positive_samples": "correct responses in the positive-example LM batch from this rollout",
    "vapo/replay_samples": "responses drawn from the positive replay buffer",
    "vapo/replay_size": "entries in the positive replay buffer",
    # provider samples (docs/design.md §8; cumulative over the run, rank 0)
    **{f"provider/{k}": v for k, v in _PROVIDER.items()},
    "vapo/replay_provider": "provider answers in the positive replay buffer",
    # eval
    "eval/greedy_accuracy": "held-out accuracy with greedy decoding",
    "eval/sampled_accuracy": "held-out avg@k accuracy with sampling at the rollout temperature",
    "eval/response_length": "mean greedy response length on the held-out set",
    **{f"eval/{kind}_accuracy_{b}": f"held-out {kind} accuracy on the task's {b} problems (tasks with buckets)"
       for kind in ("greedy", "sampled") for b in ("short", "mid", "long")},
    **{f"eval/{kind}_accuracy_{b}": f"held-out {kind} accuracy on the {b} word problems (builtin:word)"
       for kind in ("greedy", "sampled") for b in ("speed", "price", "rate", "percent", "two_step")},
    "eval/critic_ev": "the critic's explained variance on the held-out sampled responses (prompts it never "
                      "trained on), every response token against the Monte-Carlo return (the response's reward)",
    "eval/critic_ev_start": "the critic's explained variance on the held-out sampled responses at their first token "
                            "only: V(prompt), its predicted chance of success, against the reward",
    "eval/critic_ev_within_prompt": "the critic's held-out explained variance within each problem's samples (each "
                                    "problem's mean reward removed): whether it tells a problem's failed samples "
                                    "from its solved ones",
    # perf
    "perf/step_time_s": "wall time of the whole rollout step (generation + updates)",
    "perf/rollout_time_s": "wall time of generation + scoring",
    "perf/update_time_s": "wall time of the updates",
    "perf/update_samples_per_s": "responses processed per second by the updates",
    # where the step's time went (bench/perf/step_phases.py); each a part of perf/step_time_s
    "perf/sample_time_s": "wall time of sampling and scoring the rollout (with rollout.max_off_policy_steps > 0 it "
                          "ran beside the previous step's updates)",
    "perf/old_outputs_time_s": "wall time of the old-output pass after sampling: values, reference log-probs, and "
                               "the policy's old log-probs unless read off the sampler (rollout.old_log_probs)",
    "perf/actor_time_s": "wall time of the actor's micro-batches (forward + backward, replayed positives included), "
                         "summed over the step's updates",
    "perf/critic_time_s": "wall time of the critic's micro-batches (forward + backward), summed over the step's "
                          "updates",
    "perf/optimizer_time_s": "wall time of the optimizer steps (gradient sync, clipping, step) of the step's updates",
}

MEAN, SUM, MAX, SAME, MAIN = "mean", "sum", "max", "same", "main"
"""How a metric combines across the ranks of a data-parallel run (and `max` / `sum` also across the micro-batches
of one update): `mean` — each rank's value is a mean over its equal share of the batch, averaged over ranks;
`sum` — each rank's value is its share of a quantity already divided by a global count (a token-mean loss share,
a count), added over ranks; `max` — the largest over ranks; `same` — computed from all-reduced statistics, so
every rank already holds the global value (kept as it is); `main` — exists on rank 0 only (kept, not reduced)."""

COMBINE: dict[str, str] = {
    **{name: SUM for name in ("actor/pg_loss", "actor/positive_nll", "actor/kl_ref", "actor/pg_clipfrac",
                              "actor/pg_clipfrac_high", "actor/pg_clipfrac_low", "actor/approx_kl",
                              "critic/value_loss", "critic/vf_clipfrac", "critic/pretrain_value_loss",
                              "vapo/positive_samples", "vapo/replay_samples", "rollout/replica_failovers",
                              "rollout/dropped_stale", "rollout/verifier_timeouts")},
    **{name: MAX for name in ("actor/ratio_max", "rollout/response_length_max", "rollout/logprob_diff_max",
                              "rollout/weight_version_lag")},
    **{name: SAME for name in ("actor/entropy", "actor/lr", "critic/lr", "critic/value_mean", "critic/return_mean",
                               "critic/explained_var", "critic/return_var", "critic/explained_var_targets",
                               "critic/explained_var_within_prompt", "critic/pretrain_explained_var_within_prompt",
                               "vapo/advantage_mean", "vapo/advantage_std", "rollout/prompts_digest",
                               "rollout/weight_version", "rollout/logprob_diff_mean", "rollout/is_weight_mean",
                               "rollout/is_clipfrac")},
    **{name: SAME for name in CATALOGUE if name.startswith(("critic/pretrain_ev_", "eval/"))},
    "critic/pretrain_explained_var": SAME,
    **{f"provider/{k}": MAIN for k in _PROVIDER},
}
"""The names that do not combine by `mean` (the default), each with its rule."""


def combine_rule(name: str) -> str:
    """How metric `name` combines across ranks: one of MEAN, SUM, MAX, SAME, MAIN (see above)."""
    return COMBINE.get(name, MEAN)

STEP, KIND, TIME = "step", "kind", "time"


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl (each {step, kind, time, <name>: value, ...}); a torn or damaged line
    (bad JSON, bad bytes, deep nesting, no integer step) is skipped, an unreadable file reads as empty."""
    path = Path(path)
    out = []
    try:
        with open_read(path, text=True, errors="replace") as f:  # a symlink or FIFO: refused, reads as empty
            for line in f:
                try:
                    rec = json.loads(line)
                except (ValueError, RecursionError):  # torn, or nested deeper than the parser goes
                    continue
                if isinstance(rec, dict) and isinstance(rec.get(STEP), int):
                    out.append(rec)
    except OSError:
        return out
    return out


TAIL_CHUNK = 1 << 16
_LATEST: dict[str, tuple[tuple, dict[str, dict]]] = {}


def latest(path: str | Path, kinds: tuple[str, ...] = ("train", "eval")) -> dict[str, dict]:
    """The last record of each of `kinds` in a metrics.jsonl, read backwards from the end: a chunk is searched
    for `"<kind>"` (bytes.rfind) and only the line holding it is parsed, so a 50,000-step run costs what its
    last few records cost (a kind that never occurs costs a scan of the bytes, no parsing). Cached by the
    file's identity and size; an unreadable file has no records."""
    try:
        st = os.lstat(path)
    except OSError:
        return {}
    ident = (st.st_ino, st.st_size, st.st_mtime_ns, kinds)
    hit = _LATEST.get(str(path))
    if hit is not None and hit[0] == ident:
        return hit[1]
    try:
        found = _scan_back(Path(path), st.st_size, kinds)
    except OSError:
        return {}
    if len(_LATEST) > 256:
        _LATEST.clear()
    _LATEST[str(path)] = (ident, found)
    return found


def _scan_back(path: Path, size: int, kinds: tuple[str, ...]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    tail, pos = b"", size
    with open_read(path) as f:
        while pos > 0 and len(found) < len(kinds):
            start = max(0, pos - TAIL_CHUNK)
            f.seek(start)
            data = f.read(pos - start) + tail
            cut = data.find(b"\n") if start > 0 else -1  # the first line may begin in an earlier chunk
            if start > 0 and cut < 0:
                tail, pos = data, start
                continue
            body, tail, pos = data[cut + 1:], data[:cut + 1], start
            for kind in kinds:
                if kind not in found and (rec := _last_of(body, kind)) is not None:
                    found[kind] = rec
    return found


def _last_of(body: bytes, kind: str) -> dict | None:
    token, end = json.dumps(kind).encode(), len(body)
    while (i := body.rfind(token, 0, end)) >= 0:
        line_start, line_end = body.rfind(b"\n", 0, i) + 1, body.find(b"\n", i)
        try:
            rec = json.loads(body[line_start:line_end if line_end >= 0 else len(body)])
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict) and rec.get(KIND) == kind and isinstance(rec.get(STEP), int):
            return rec
        end = line_start
    return None


def series(records: list[dict], name: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, in file order."""
    return [(int(r.get(STEP, 0)), float(r[name])) for r in records if isinstance(r.get(name), (int, float))]


def accuracies(kind: str, task, problems, rewards: list[float]) -> dict[str, float]:
    """eval/<kind>_accuracy, and per difficulty bucket when the task names them (`task.bucket(problem)`)."""
    out = {f"eval/{kind}_accuracy": sum(rewards) / max(1, len(rewards))}
    if hasattr(task, "bucket"):
        groups: dict[str, list[float]] = {}
        for p, s in zip(problems, rewards):
            groups.setdefault(task.bucket(p), []).append(s)
        out |= {f"eval/{kind}_accuracy_{b}": sum(v) / len(v) for b, v in groups.items()}
    return out
