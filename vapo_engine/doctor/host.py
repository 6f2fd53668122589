"""The machine a run would use: accelerator or RAM budget, free disk, cores. Each value can be given (tests, a
planned machine) or is probed: GPUs with `nvidia-smi` (≤ 3 s) or, when the config asks for cuda, torch.cuda;
RAM from /proc/meminfo (else sysconf); free disk with shutil.disk_usage on the nearest existing folder."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from vapo_engine.jobs.threads import usable_cores

GiB = 1024 ** 3


@dataclass(frozen=True)
class Host:
    """What the checks compare against; None = probe it."""

    memory_bytes: int | None = None
    """Memory of one accelerator (kind "gpu"), or the RAM available to all ranks of the node (kind "ram")."""
    memory_kind: Literal["gpu", "ram"] | None = None
    gpus: int | None = None
    disk_free_bytes: int | None = None
    cores: int | None = None

    def probed(self, device: str, log_dir: Path) -> Host:
        """This host with every unset value probed (`device`: the config's training.device)."""
        h = self
        if h.memory_bytes is None or h.memory_kind is None:
            gpus = _gpu_memory(device) if device != "cpu" else []
            h = replace(h, memory_kind="gpu", memory_bytes=min(gpus), gpus=len(gpus)) if gpus else \
                replace(h, memory_kind="ram", memory_bytes=_ram_available(), gpus=h.gpus or 0)
        if h.disk_free_bytes is None:
            h = replace(h, disk_free_bytes=shutil.disk_usage(existing_parent(log_dir)).free)
        if h.cores is None:
            h = replace(h, cores=usable_cores())
        return h


def existing_parent(path: Path) -> Path:
    """`path`, or its nearest folder that exists (a run's log dir is created on first use)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _gpu_memory(device: str) -> list[int]:
    """Total memory of each visible GPU, in bytes: nvidia-smi, else (training.device = "cuda") torch.cuda."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=3, check=True).stdout
            sizes = [int(float(x)) * 1024 ** 2 for x in out.split() if x.strip()]
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is not None and visible.strip() and all(v.strip().isdigit() for v in visible.split(",")):
                sizes = [sizes[int(v)] for v in visible.split(",") if int(v) < len(sizes)]
            if sizes:
                return sizes
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    if device == "cuda":
        try:
            import torch
            if torch.cuda.is_available():
                return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
        except ImportError:
            pass
    return []


def _ram_available() -> int:
    """MemAvailable from /proc/meminfo, else the physical memory (sysconf)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0
