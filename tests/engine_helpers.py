"""Helpers for engine tests: a tiny untrained HF model directory and a minimal fast run config."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT
from vapo_engine.config import load_config, load_settings
from vapo_engine.runs import create_run

FAST = ["training.total_steps=3", "training.batch_size=8", "vapo.group_size=2", "model.max_tokens=10",
        "vapo.value_pretrain_steps=1", "eval.num_problems=4", "eval.samples_per_problem=1",
        "eval.eval_interval=2", "eval.save_interval=2", "training.micro_batch_size=4",
        "training.mini_batch_size=8"]


def make_run(tmp_path: Path, model_dir: Path, extra: list[str] = (), name: str = "run",
             seed: int | None = None) -> Path:
    over = FAST + [f"model.local_path={str(model_dir)!r}".replace("'", '"'), *extra]
    cfg = load_config(ROOT / "config.toml", over, preset="cpu-demo")
    settings = load_settings(ROOT / "settings.json")
    if seed is not None:
        settings = settings.model_copy(update={"experiment": settings.experiment.model_copy(update={"seed": seed})})
    return create_run(cfg, settings, tmp_path / "runs", run_id=name).run_dir


def random_value_dir(folder: Path, model_dir: Path) -> Path:
    """`bench.lib.runs.random_head_value_dir` of `model_dir`, made once in `folder`: a value model whose non-zero
    head makes every gradient of a step non-zero (parity tests that compare zeros with zeros prove nothing)."""
    from bench.lib.runs import random_head_value_dir
    out = Path(folder) / "value-random-head"
    return out if (out / "config.json").is_file() else random_head_value_dir(model_dir, out)


def pushed_remote_policy(model_dir: Path, backend: str, urls: list[str], folder: Path, version: int, seed: int):
    """The run's models with a remote rollout `backend` at `urls`, whose policy was moved off `model_dir`'s
    weights (N(0, 0.05) noise, torch seed `seed`) and pushed as weight `version`: weights the servers were not
    started with, so only the push can make sampler and trainer agree."""
    import torch

    from vapo_engine.config.train_model import RolloutConfig
    from vapo_engine.trainer.lora import save_plain
    from vapo_engine.trainer.models import load_models
    models = load_models(model_dir, value_path=None, need_value=False, reference_path=None,
                         device=torch.device("cpu"), autocast_dtype=None,
                         rollout=RolloutConfig(backend=backend, urls=urls))
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in models.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_plain(models.policy, folder / f"v{version}")
    models.backend.load_weights(models, version=version, path=str(folder / f"v{version}"))
    return models
