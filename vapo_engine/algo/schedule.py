"""Learning-rate schedules as pure functions of the step (for `torch.optim.lr_scheduler.LambdaLR`)."""
from __future__ import annotations

from collections.abc import Callable


def warmup_constant(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up over `warmup_steps` optimizer steps (the first step already at 1/warmup), then 1.0
    (docs/design.md §3.10: warmup-constant for actor and critic). 0 = constant from the start."""
    if warmup_steps <= 0:
        return lambda step: 1.0
    return lambda step: min(1.0, (step + 1) / warmup_steps)
