"""The `wandb` sink: the run as a Weights & Biases run (pip install 'vapo-mcp[wandb]').

Offline unless the user configured W&B: the mode is the WANDB_MODE environment variable when set ("online"
with WANDB_API_KEY syncs live), else "offline", writing under <run dir>/wandb (upload later with `wandb sync
<run dir>/wandb/offline-run-*`). What: project = the experiment of settings.json, run name and id = the run id
(a resumed run continues it), tags from settings.json, the frozen config as the run config, every metric under
its catalogue name with the run's step as the x-axis ("step"), and at the end the run plot (report.png) and
summary.json as one artifact, with the final evaluation in the run summary.
"""
from __future__ import annotations

import os
import re

from .base import metric_items
from .tracking import TrackerSink

MODE_ENV = "WANDB_MODE"


class WandbSink(TrackerSink):
    name, extra = "wandb", "wandb"

    def load(self) -> None:
        import wandb  # noqa: F401 - ImportError: the extra is missing

    def open(self) -> None:
        import wandb
        run = self.run
        self.wb = wandb.init(project=run.experiment, name=run.run_id, id=re.sub(r"[^\w\-]", "_", run.run_id),
                             tags=list(run.tags)[:64] or None, config=run.config, dir=str(run.run_dir.path),
                             mode=os.environ.get(MODE_ENV) or "offline", resume="allow")
        self.wb.define_metric("step")
        self.wb.define_metric("*", step_metric="step")

    def send(self, record: dict) -> None:
        metrics = dict(metric_items(record))
        if metrics:
            self.wb.log({"step": int(record["step"]), **metrics})

    def finish(self, artifacts, summary) -> None:
        import wandb
        if artifacts:
            art = wandb.Artifact(f"results-{self.wb.id}", type="run-results")
            for path in artifacts:
                art.add_file(str(path))
            self.wb.log_artifact(art)
        if summary:
            self.wb.summary.update({f"final/{k}": v for k, v in (summary.get("final_eval") or {}).items()})
        self.wb.finish(exit_code=0 if (summary or {}).get("status") == "succeeded" else 1)
