"""Which low precision pays off on this machine. A leaf module (torch only), shared by the SFT warm-start and
the trainer."""
from __future__ import annotations

import functools
import time

import torch


@functools.cache
def bf16_matmul_is_fast() -> bool:
    """Whether a bf16 matmul beats fp32 on this CPU (measured once: 256×256, best of 3). CPUs without bf16
    instructions emulate it ~100× slower than fp32, so bf16 autocast must never be assumed on a CPU."""
    a = torch.randn(256, 256)
    times = {}
    for dt in (torch.float32, torch.bfloat16):
        x = a.to(dt)
        x @ x
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            x @ x
            best = min(best, time.perf_counter() - t0)
        times[dt] = best
    return times[torch.bfloat16] <= times[torch.float32]
