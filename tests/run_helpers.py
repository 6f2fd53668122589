"""Helpers for tests that drive real background runs (with the `runs_env` fixture of conftest.py): a fast
start through the tools, and polling with a deadline."""
from __future__ import annotations

import time

from tests.engine_helpers import FAST


def start(files, model_dir, *extra) -> str:
    """Start a tiny cpu-demo run through the tools (evaluation only at the end); returns its run id."""
    from tools.training import start_training
    over = [*FAST, f'model.local_path="{model_dir}"', "eval.eval_interval=1000", *extra]
    return start_training(files, preset="cpu-demo", overrides=over).run.run_id


def wait_for(pred, timeout: float = 180.0, what: str = "condition", poll: float = 0.05) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")
