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


def make_run(tmp_path: Path, model_dir: Path, extra: list[str] = (), name: str = "run") -> Path:
    over = FAST + [f"model.local_path={str(model_dir)!r}".replace("'", '"'), *extra]
    cfg = load_config(ROOT / "config.toml", over, preset="cpu-demo")
    settings = load_settings(ROOT / "settings.json")
    return create_run(cfg, settings, tmp_path / "runs", run_id=name).run_dir


def random_value_dir(folder: Path, model_dir: Path) -> Path:
    """A value model of `model_dir`'s architecture whose scalar head is random instead of zero, so that values,
    advantages, value losses and hence every gradient of a step are non-zero even when no reward is earned
    (an untrained model's usual case) — parity tests that compare zeros with zeros prove nothing."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification
    out = Path(folder) / "value-random-head"
    if not (out / "config.json").is_file():
        cfg = AutoConfig.from_pretrained(model_dir, num_labels=1)
        value = AutoModelForTokenClassification.from_pretrained(model_dir, config=cfg)
        with torch.no_grad():
            torch.manual_seed(0)
            value.score.weight.normal_(0, 0.5)
            value.score.bias.fill_(0.3)
        value.save_pretrained(out)
    return out
