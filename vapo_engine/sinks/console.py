"""The `console` sink: one readable line per record, through the run's `log` (the worker's stdout, which the
worker log keeps and `vapo-mcp train` follows)."""
from __future__ import annotations

from .base import SinkContext, metric_items


class ConsoleSink:
    def __init__(self, ctx: SinkContext):
        self._log = ctx.log
        self._total = ctx.config.training.total_steps

    def write(self, record: dict) -> None:
        self._log(format_record(record, self._total))

    def close(self) -> None:
        pass


def format_record(rec: dict, total_steps: int | None = None) -> str:
    """The progress line of a record (a non-finite value, written as text in the record, prints as nan/inf)."""
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
                + (f" (at the prompt {ev0:+.2f})" if ev0 is not None else ""))
    if kind == "pretrain":
        ev = rec.get("critic/pretrain_explained_var")
        return (f"value-pretrain {step:>3}: value loss {rec.get('critic/pretrain_value_loss', 0):.4f}  "
                f"held-out explained var {'undefined' if ev is None else f'{ev:+.3f}'}")
    tot = f"/{total_steps}" if total_steps else ""
    return (f"train  step {step:>5}{tot}: reward {rec.get('rollout/reward_mean', 0):.3f}  "
            f"len {rec.get('rollout/response_length', 0):5.1f}  λ {rec.get('vapo/lambda_policy_mean', 0):.3f}  "
            f"ev {rec.get('critic/explained_var', float('nan')):+.2f}  "
            f"ent {rec.get('actor/entropy', 0):.3f}  {rec.get('perf/step_time_s', 0):.2f}s/step  "
            f"{rec.get('rollout/tokens_per_s', 0):,.0f} tok/s")
