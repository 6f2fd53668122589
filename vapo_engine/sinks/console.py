"""The `console` sink: one readable line per record, through the run's `log` (the worker's stdout, which the
worker log keeps and `vapo-mcp train` follows)."""
from __future__ import annotations

from .base import SinkContext, metric_items


class ConsoleSink:
    def __init__(self, ctx: SinkContext):
        self._log = ctx.log
        self._total = ctx.config.training.total_steps
        self._ceiling = ctx.config.critic.ceiling_within_prompt

    def write(self, record: dict) -> None:
        self._log(format_record(record, self._total, self._ceiling))

    def close(self) -> None:
        pass


def _within(ev: float | None, ceiling: float | None, word: str = "within prompt") -> str:
    """ ", within prompt +0.21 of 0.38" (the critic's within-prompt EV and, when known, its ceiling), or ""."""
    if ev is None:
        return ""
    return f", {word} {ev:+.2f}" + (f" of {ceiling:.2f}" if ceiling else "")


def format_record(rec: dict, total_steps: int | None = None, ceiling: float | None = None) -> str:
    """The progress line of a record (a non-finite value, written as text in the record, prints as nan/inf);
    `ceiling`: the within-prompt EV ceiling of the critic when known (critic.ceiling_within_prompt)."""
    rec = {**rec, **dict(metric_items(rec))}
    step = rec.get("step", 0)
    kind = rec.get("kind")
    if kind == "eval":
        s = rec.get("eval/sampled_accuracy")
        buckets = "".join(f" {b} {rec[f'eval/greedy_accuracy_{b}']:.2f}" for b in ("short", "mid", "long")
                          if f"eval/greedy_accuracy_{b}" in rec)
        ev, ev0 = rec.get("eval/critic_ev"), rec.get("eval/critic_ev_start")
        return (f"eval   step {step:>5}: greedy acc {rec.get('eval/greedy_accuracy', 0):.3f}"
                + (f" ({buckets.strip()})" if buckets else "")
                + (f"  sampled acc {s:.3f}" if s is not None else "")
                + f"  len {rec.get('eval/response_length', 0):.1f}"
                + (f"  critic held-out ev {ev:+.2f}" if ev is not None else "")
                + (f" (at the prompt {ev0:+.2f}{_within(rec.get('eval/critic_ev_within_prompt'), ceiling)})"
                   if ev0 is not None else ""))
    if kind == "pretrain":
        ev = rec.get("critic/pretrain_explained_var")
        within = _within(rec.get("critic/pretrain_explained_var_within_prompt"), ceiling).removeprefix(", ")
        return (f"value-pretrain {step:>3}: value loss {rec.get('critic/pretrain_value_loss', 0):.4f}  "
                f"held-out explained var {'undefined' if ev is None else f'{ev:+.3f}'}"
                + (f" ({within})" if within else ""))
    tot = f"/{total_steps}" if total_steps else ""
    return (f"train  step {step:>5}{tot}: reward {rec.get('rollout/reward_mean', 0):.3f}  "
            f"len {rec.get('rollout/response_length', 0):5.1f}  λ {rec.get('vapo/lambda_policy_mean', 0):.3f}  "
            f"ev {'undefined' if (e := rec.get('critic/explained_var')) is None else f'{e:+.2f}'}"
            + (f" (within {w:+.2f})" if (w := rec.get("critic/explained_var_within_prompt")) is not None else "")
            + "  "
            f"ent {rec.get('actor/entropy', 0):.3f}  {rec.get('perf/step_time_s', 0):.2f}s/step  "
            f"{rec.get('rollout/tokens_per_s', 0):,.0f} tok/s")
