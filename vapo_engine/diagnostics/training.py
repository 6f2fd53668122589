"""Training-run diagnostics: predicates and facts over a run's metrics, frozen config, summary and worker log.

Evidence layout (filled by `gather.run_facts`; plain data, no I/O here):
  ev.extra["metrics"]  = evidence.pack_metrics(metrics.jsonl records): per-kind series + non-finite values
  ev.extra["config"]   = the frozen TrainConfig as JSON (the run's config.json, or a valid config.toml)
  ev.extra["run"]      = {"dir", "run_id", "summary", "log_tail", "crash" (crash_facts), "checkpoints"}
  ev.extra["question"] = the user's own text (what they asked), without the worker log
Level rules (λ, no-signal) need a few train points; trend rules (length, entropy, oscillation, value) need
10-20, so a short run gives no noise findings. No file reading here (gather.py), no ranking (engine.py).
"""
from __future__ import annotations

import math
import re
from functools import partial
from itertools import pairwise
from typing import Any

from .evidence import Evidence
from .predicates import FACTS, predicate

WINDOW = 20
"""Points of the "recent" window of level rules."""
PAPER_BUDGET = 5000 * 8192
"""Responses the paper's run sampled: ~5000 steps × 8192 (512 prompts × 16)."""


# --- helpers ---------------------------------------------------------------------------------------------

def _points(ev: Evidence, name: str, kind: str = "train") -> list[list[float]]:
    return ((ev.extra.get("metrics") or {}).get(kind) or {}).get(name, [])


def _vals(ev: Evidence, name: str, kind: str = "train") -> list[float]:
    return [v for _, v in _points(ev, name, kind)]


def _cfg(ev: Evidence, path: str, default: Any = None) -> Any:
    node: Any = ev.extra.get("config")
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _ends(xs: list[float], cap: int = WINDOW) -> tuple[float, float, int]:
    """Mean of the first and of the last k points (k = a quarter of the run, 2..cap)."""
    k = max(2, min(cap, len(xs) // 4))
    return _mean(xs[:k]), _mean(xs[-k:]), k


def _num(x: Any) -> str | None:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return f"{x:g}"
    return None if x is None else str(x)


@predicate
def config_in(ev: Evidence, key: str, values: list) -> str | None:
    """The config value at dotted `key` is one of `values`."""
    v = _cfg(ev, key)
    return f"{key} = {_num(v)}" if v is not None and v in values else None


@predicate
def config_at_most(ev: Evidence, key: str, other: str) -> str | None:
    """config[key] ≤ config[other] (e.g. vapo.clip_range_high ≤ training.clip_range)."""
    v, o = _cfg(ev, key), _cfg(ev, other)
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v, o))
    return f"{key} = {_num(v)} ≤ {other} = {_num(o)}" if ok and v <= o else None


# --- λ_policy --------------------------------------------------------------------------------------------

@predicate
def lambda_collapsed(ev: Evidence, below: float = 0.3, clamped_above: float = 0.5,
                     min_points: int = 3) -> str | None:
    """Recent mean λ_policy below `below` or most sequences clamped to λ = 0."""
    lam = _vals(ev, "vapo/lambda_policy_mean")[-WINDOW:]
    clamped = _vals(ev, "vapo/lambda_clamped_frac")[-WINDOW:]
    low = len(lam) >= min_points and _mean(lam) < below
    many = len(clamped) >= min_points and _mean(clamped) > clamped_above
    if not (low or many):
        return None
    bits = [f"vapo/lambda_policy_mean = {_mean(lam):.2f} over the last {len(lam)} steps"] if lam else []
    if clamped:
        bits.append(f"{_mean(clamped):.0%} of sequences clamped to λ = 0 (vapo/lambda_clamped_frac)")
    return "; ".join(bits)


@predicate
def lambda_near_one(ev: Evidence, above: float = 0.98, min_points: int = 5) -> str | None:
    lam = _vals(ev, "vapo/lambda_policy_mean")[-WINDOW:]
    if len(lam) < min_points or _mean(lam) <= above:
        return None
    return f"vapo/lambda_policy_mean = {_mean(lam):.3f} over the last {len(lam)} steps (λ ≈ 1)"


def _mean_length(ev: Evidence) -> float | None:
    xs = _vals(ev, "rollout/response_length")[-WINDOW:]
    return _mean(xs) if xs else None


# --- oscillation, trends ---------------------------------------------------------------------------------

@predicate
def metric_oscillating(ev: Evidence, metric: str, min_points: int = 10, min_flip_frac: float = 0.8,
                       min_amplitude: float = 0.0, min_rel_amplitude: float = 0.0, bernoulli: bool = False,
                       noise_mult: float = 2.5, window: int = 50) -> str | None:
    """`metric` changes direction on most steps (`min_flip_frac`: independent noise already flips on 2/3 of
    steps, so only clearly more counts) with a large mean step-to-step change. For a batch mean of
    0/1 outcomes (`bernoulli`), the change must also exceed `noise_mult` × what sampling noise alone gives —
    counting prompts, not responses: the group_size answers of one prompt share its difficulty (on a task
    whose prompts range from trivial to rarely solved, a batch's mean moves with which prompts it drew), so
    the floor is that of batch_size / group_size independent outcomes."""
    xs = _vals(ev, metric)[-window:]
    if len(xs) < min_points:
        return None
    d = [b - a for a, b in pairwise(xs) if b != a]
    if len(d) < min_points - 1:
        return None
    flips = sum((a > 0) != (b > 0) for a, b in pairwise(d)) / (len(d) - 1)
    amp, level = _mean([abs(x) for x in d]), _mean(xs)
    batch, group = _cfg(ev, "training.batch_size"), _cfg(ev, "vapo.group_size")
    prompts = batch // group if isinstance(batch, int) and isinstance(group, int) and group > 0 else batch
    noise = 0.0
    if bernoulli and isinstance(prompts, int) and prompts > 0 and all(0.0 <= x <= 1.0 for x in xs):
        p = min(max(level, 0.05), 0.95)
        noise = 1.128 * math.sqrt(p * (1 - p) / prompts)  # E|x_t+1 − x_t| of independent batch means
    need = max(min_amplitude, min_rel_amplitude * abs(level), noise_mult * noise)
    if flips < min_flip_frac or amp <= need:
        return None
    said = (f"{metric} changes direction on {flips:.0%} of steps with a mean step-to-step change of "
            f"{amp:.3g} (mean {level:.3g}) over the last {len(xs)} steps")
    return said + (f"; batch sampling noise alone would give ≈{noise:.2g} at {prompts} prompts per step"
                   if noise else "")


@predicate
def length_not_growing(ev: Evidence, min_points: int = 20, max_growth: float = 0.05) -> str | None:
    """Mean response length flat or shrinking from the start to the end of the run."""
    xs = _vals(ev, "rollout/response_length")
    if len(xs) < min_points:
        return None
    a, b, k = _ends(xs)
    if a <= 0 or (b - a) / a > max_growth:
        return None
    return (f"rollout/response_length {a:.1f} → {b:.1f} tokens ({(b - a) / a:+.0%}) from the first to the "
            f"last {k} of {len(xs)} steps")


@predicate
def metric_recent_above(ev: Evidence, metric: str, above: float, min_points: int = 5) -> str | None:
    """Mean of `metric` over the recent window above `above`."""
    xs = _vals(ev, metric)[-WINDOW:]
    ok = len(xs) >= min_points and _mean(xs) > above
    return f"{metric} = {_mean(xs):.2f} over the last {len(xs)} steps" if ok else None


@predicate
def reward_not_improving(ev: Evidence, min_points: int = 20, min_gain: float = 0.05) -> str | None:
    for name in ("rollout/reward_mean", "rollout/accuracy"):
        xs = _vals(ev, name)
        if len(xs) >= min_points:
            a, b, k = _ends(xs)
            return f"{name} {a:.2f} → {b:.2f} (first vs last {k} steps)" if b - a < min_gain else None
    return None


@predicate
def no_signal(ev: Evidence, above: float = 0.7, min_points: int = 5) -> str | None:
    """Most prompt groups got the same reward for every sample (no advantage signal)."""
    xs = _vals(ev, "rollout/no_signal_groups")[-WINDOW:]
    if len(xs) < min_points or _mean(xs) < above:
        return None
    said = (f"rollout/no_signal_groups = {_mean(xs):.2f} over the last {len(xs)} steps: {_mean(xs):.0%} of "
            "prompt groups got identical rewards for all samples")
    acc = _vals(ev, "rollout/accuracy")[-WINDOW:]
    if acc:
        which = "all-correct groups: the prompts are too easy" if _mean(acc) >= 0.5 else \
            "all-wrong groups: the prompts are too hard"
        said += f" (rollout/accuracy {_mean(acc):.2f} → mostly {which})"
    return said


# --- critic, entropy, NaN, accuracy ----------------------------------------------------------------------

@predicate
def value_collapsed(ev: Evidence, below: float = 0.1, min_points: int = 10) -> str | None:
    """Low or negative explained variance of the critic over the last quarter of the run."""
    xs = _vals(ev, "critic/explained_var")
    if _cfg(ev, "decisions.uses_critic") is False or len(xs) < min_points:
        return None
    a, b, k = _ends(xs)
    if b >= below:
        return None
    said = f"critic/explained_var = {b:.2f} over the last {k} steps (first {k}: {a:.2f})"
    pre = _vals(ev, "critic/pretrain_explained_var", "pretrain")
    return said + (f"; value pretraining ended at explained var {pre[-1]:.2f}" if pre else "")


@predicate
def entropy_collapsed(ev: Evidence, ratio: float = 0.1, min_points: int = 10) -> str | None:
    xs = _vals(ev, "actor/entropy")
    if len(xs) < min_points:
        return None
    a, b, k = _ends(xs, cap=5)
    if a <= 0 or b >= ratio * a:
        return None
    return f"actor/entropy {a:.3g} → {b:.3g} ({b / a:.0%} of its start; first vs last {k} of {len(xs)} steps)"


@predicate
def nonfinite_metrics(ev: Evidence) -> str | None:
    m = ev.extra.get("metrics") or {}
    bad = m.get("nonfinite") or []
    if not bad:
        return None
    first = bad[0]
    names = list(dict.fromkeys(b["name"] for b in bad if b["name"] != first["name"]))[:5]
    said = (f"metrics.jsonl holds {m.get('nonfinite_count', len(bad))} non-finite values; first: "
            f"{first['name']} = {first['value']} at {first['kind']} step {first['step']}")
    return said + (f"; also in {', '.join(names)}" if names else "")


def _first_bad_step(ev: Evidence) -> int | None:
    bad = [b["step"] for b in (ev.extra.get("metrics") or {}).get("nonfinite") or [] if b["kind"] == "train"]
    return min(bad) if bad else None


@predicate
def accuracy_dropped(ev: Evidence, points: float = 10.0, min_evals: int = 2) -> str | None:
    """Held-out greedy accuracy fell by more than `points` percentage points from its start."""
    pts = _points(ev, "eval/greedy_accuracy", "eval")
    if len(pts) < min_evals:
        return None
    (s0, a), (s1, b) = pts[0], pts[-1]
    drop = (a - b) * (1.0 if max(v for _, v in pts) > 1.0 else 100.0)  # percentages or fractions
    if drop <= points:
        return None
    sb, best = max(pts, key=lambda p: p[1])
    return (f"eval/greedy_accuracy {a:.2f} → {b:.2f} ({-drop:+.0f} points) from step {s0} to step {s1}; "
            f"best {best:.2f} at step {sb}")


# --- worker log (crash facts come from gather.run_facts) --------------------------------------------------

@predicate
def worker_crashed(ev: Evidence) -> str | None:
    """worker.log ends in a traceback, an out-of-memory error or a kill (see `evidence.crash_facts`)."""
    crash = (ev.extra.get("run") or {}).get("crash")
    if not crash:
        return None
    what = {"oom": "out of memory", "killed": "the process was killed (SIGKILL)", "traceback": "an exception"}
    return f"worker.log ends with {what[crash['kind']]}: {crash['line'][:240]!r}"


@predicate
def provider_down(ev: Evidence) -> str | None:
    """[provider_rollouts] stopped asking the API channel (provider.json says why); training went on."""
    down = (ev.extra.get("run") or {}).get("provider_down")
    return f"provider.json: {down['kind']}: {down['reason'][:240]}" if down else None


@predicate
def rollout_servers_down(ev: Evidence) -> str | None:
    """The run's inference servers (rollout.urls) did not answer for rollout.unavailable_timeout_s (rollout.json)."""
    down = (ev.extra.get("run") or {}).get("rollout_down")
    return f"rollout.json: {down['reason'][:400]}" if down else None


_CRASH_FIX = {
    "oom": "Out of memory: lower training.micro_batch_size (now {micro}; gradient accumulation keeps the "
           "batch the same) and/or model.max_tokens (now {max_tokens}); for long responses also "
           "training.gradient_checkpointing = true and a training.micro_batch_tokens budget (same gradient, "
           "less activation memory); then resume_run('{run_id}') continues from {ckpt} (or start_training "
           "again with the smaller values: a run's config is frozen).",
    "killed": "The worker got SIGKILL (usually the kernel's OOM killer: `dmesg | grep -i kill`): "
              "resume_run('{run_id}') continues from {ckpt}; if memory was the cause, lower "
              "training.micro_batch_size (now {micro}) or model.max_tokens (now {max_tokens}) first.",
    "traceback": "Read the exception at the end of worker.log (other findings may name its cause), fix it, "
                 "then resume_run('{run_id}') continues from {ckpt}.",
}


def _crash_fix(ev: Evidence) -> str | None:
    crash, t = (ev.extra.get("run") or {}).get("crash"), _cfg(ev, "training", {}) or {}
    micro = t.get("micro_batch_size") or t.get("mini_batch_size") or t.get("batch_size") or "?"
    if not crash:
        return None
    return _CRASH_FIX[crash["kind"]].format(micro=micro, max_tokens=_cfg(ev, "model.max_tokens", "?"),
                                            run_id=_run_id(ev) or "<run id>", ckpt=_last_ckpt(ev))


def _run_id(ev: Evidence) -> str | None:
    return (ev.extra.get("run") or {}).get("run_id")


def _last_ckpt(ev: Evidence, before: int | None = None) -> str:
    steps = [s for s in (ev.extra.get("run") or {}).get("checkpoints") or [] if before is None or s < before]
    return f"the checkpoint at step {max(steps)}" if steps else "no checkpoint (none saved yet: start again)"


# --- the paper's recipe ----------------------------------------------------------------------------------

PAPER = [  # (config key, paper value, shown as) — VAPO, arXiv 2504.05118, Qwen2.5-32B → 60.4 on AIME 2024
    ("training.total_steps", 5000, "~5000"), ("training.batch_size", 8192, "8192 (512 prompts × 16)"),
    ("vapo.group_size", 16, "16"), ("vapo.alpha", 0.05, "0.05"), ("training.learning_rate", 1e-6, "1e-6"),
    ("vapo.value_learning_rate", 2e-6, "2e-6"), ("vapo.clip_range_high", 0.28, "0.28"),
    ("vapo.positive_lm_coef", 0.1, "0.1"), ("vapo.value_pretrain_steps", 50, "50"),
    ("training.clip_range", 0.2, "0.2"), ("vapo.lambda_critic", 1.0, "1.0"), ("training.kl_coef", 0.0, "0"),
    ("model.temperature", 1.0, "1.0"), ("vapo.use_length_adaptive", True, "true"),
    ("vapo.token_level_loss", True, "true"), ("vapo.decoupled_gae", True, "true"),
    ("training.algorithm", "vapo", "vapo"),
]


def paper_differences(ev: Evidence) -> list[str]:
    """The run's config vs the paper's recipe, most consequential first."""
    if not isinstance(ev.extra.get("config"), dict):
        return []
    path = _cfg(ev, "model.local_path")
    name = str(path).rstrip("/").rsplit("/", 1)[-1] if path else "built-in tiny model"
    out = [] if "32b" in name.lower() else [f"model {name} vs Qwen2.5-32B"]
    done = ((ev.extra.get("run") or {}).get("summary") or {}).get("steps")
    for key, paper, shown in PAPER:
        v = _cfg(ev, key)
        if v is None or v == paper or (isinstance(v, float) and math.isclose(v, paper, rel_tol=1e-9)):
            continue
        extra = ""
        if key == "vapo.group_size":
            extra = f" ({_cfg(ev, 'training.batch_size', 0) // max(1, v)} prompts × {v})"
        elif key == "training.total_steps" and isinstance(done, int) and done < v:
            extra = f" (ran {done})"
        out.append(f"{key} {_num(v)}{extra} vs {shown}")
    tokens = _cfg(ev, "model.max_tokens")
    if isinstance(tokens, int) and tokens < 16_000:
        out.insert(min(len(out), 4), f"model.max_tokens {tokens} vs up to ~20k")
    return out


@predicate
def differs_from_paper(ev: Evidence, min_differences: int = 1) -> str | None:
    diffs = paper_differences(ev)
    more = f"; +{len(diffs) - 10} more" if len(diffs) > 10 else ""
    if len(diffs) < min_differences:
        return None
    return "differences from the paper's recipe: " + "; ".join(diffs[:10]) + more


@predicate
def question_matches(ev: Evidence, pattern: str) -> str | None:
    """Regex over the user's own text (not the worker log)."""
    q = ev.extra.get("question") or ""
    m = re.search(pattern, q, re.IGNORECASE)
    return f"you asked: {q[max(0, m.start() - 40):m.end() + 40].strip()!r}" if m else None


@predicate
def run_far_smaller(ev: Evidence, factor: float = 10.0) -> str | None:
    """A run (with metrics) whose sampled-response budget is `factor`× below the paper's."""
    steps, batch = _cfg(ev, "training.total_steps", 0), _cfg(ev, "training.batch_size", 0)
    budget = steps * batch if isinstance(steps, int) and isinstance(batch, int) else 0
    if not (ev.extra.get("metrics") or {}).get("records") or not budget or budget * factor > PAPER_BUDGET:
        return None
    return (f"sample budget {steps} steps × {batch} = {budget:,} responses vs ≈{PAPER_BUDGET / 1e6:.0f}M in "
            f"the paper ({PAPER_BUDGET / budget:,.0f}× smaller)")


@predicate
def benchmark_matches(ev: Evidence, pattern: str) -> str | None:
    b = _cfg(ev, "eval.benchmark")
    return f"eval.benchmark = {b}" if isinstance(b, str) and re.search(pattern, b, re.IGNORECASE) else None


# --- facts for templates ---------------------------------------------------------------------------------

def _derived(ev: Evidence) -> dict[str, str | None]:
    """Numbers the texts quote: mean length l, α·l, the λ it gives, the suggested α ≈ 20 / l, a lower lr."""
    a, n, lr = _cfg(ev, "vapo.alpha"), _mean_length(ev), _cfg(ev, "training.learning_rate")
    lam = _vals(ev, "vapo/lambda_policy_mean")[-WINDOW:]
    out = {"mean_response_length": f"{n:.0f}" if n else None,
           "suggested_alpha": f"{20 / n:.2g}" if n else None,
           "lambda_policy_mean": f"{_mean(lam):.2f}" if lam else None,
           "lower_learning_rate": f"{lr * 0.3:.2g}" if isinstance(lr, (int, float)) else None}
    if isinstance(a, (int, float)) and a > 0:
        out["inverse_alpha"] = f"{1 / a:.3g}"
        if n:
            lam_at_n = min(1.0, max(0.0, 1 - 1 / (a * n)))
            out.update(alpha_times_length=f"{a * n:.2f}", expected_lambda=f"{lam_at_n:.2f}")
    return out


for _path in ("vapo.alpha", "vapo.lambda_base", "vapo.group_size", "vapo.use_length_adaptive",
              "vapo.lambda_critic", "vapo.value_learning_rate", "vapo.clip_range_high",
              "decisions.value_pretrain_steps", "decisions.loss_reduction", "decisions.policy_loss",
              "decisions.clip_low", "decisions.clip_high", "training.learning_rate",
              "training.clip_range", "training.kl_coef", "training.max_grad_norm", "training.batch_size",
              "model.max_tokens", "model.temperature", "model.dtype"):
    FACTS[_path.split(".")[1]] = partial(lambda p, ev: _num(_cfg(ev, p)), _path)  # {alpha}, ...

for _name in ("mean_response_length", "suggested_alpha", "lambda_policy_mean", "lower_learning_rate",
              "inverse_alpha", "alpha_times_length", "expected_lambda"):
    FACTS[_name] = partial(lambda k, ev: _derived(ev).get(k), _name)

FACTS.update({
    "run_id": _run_id,
    "last_checkpoint": _last_ckpt,
    "checkpoint_before_nan": lambda ev: _last_ckpt(ev, before=_first_bad_step(ev)),
    "first_nan_step": lambda ev: _num(_first_bad_step(ev)),
    "crash_fix": _crash_fix,
    **{f"rollout_{k}": partial(lambda k, ev: ((ev.extra.get("run") or {}).get("rollout_down") or {}).get(k), k)
       for k in ("reason", "fix")},
    **{f"provider_{k}": partial(lambda k, ev: ((ev.extra.get("run") or {}).get("provider_down") or {}).get(k), k)
       for k in ("kind", "reason", "fix")},
})
