"""The `mlflow` sink: the run as an MLflow run (pip install 'vapo-mcp[mlflow]', which brings mlflow-skinny).

Where: `logging.mlflow_tracking_uri`, else the MLFLOW_TRACKING_URI environment variable, else a local file store
in <runtime.log_dir>/mlruns (for that local store the sink sets MLFLOW_ALLOW_FILE_STORE=true in its own
process, unless the user set it: MLflow 3 keeps the file store only on that opt-in). What: the experiment of
settings.json (created when missing); a run named by the run id, tagged with settings.json's tags and
`vapo.run_id` (a resumed run continues the same MLflow run); the frozen config as parameters ("training.
total_steps"); every metric per step under its catalogue name (MLflow accepts the "/" in them; a character it
refuses would become "_"); at the end the run plot (report.png) and summary.json as artifacts, and the run's
status (FINISHED, KILLED when stopped, FAILED when the attempt ended without a summary).
"""
from __future__ import annotations

import os
import re

from vapo_engine.rundir import RunDir

from .base import metric_items
from .tracking import TrackerSink

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
RUN_ID_TAG = "vapo.run_id"
_REFUSED = re.compile(r"[^\w.\- /]")  # MLflow's metric and parameter names: letters, digits, _ . - space /
PARAMS_PER_BATCH, MAX_PARAM_VALUE = 100, 6000


def tracking_uri(configured: str | None, run_dir: RunDir) -> tuple[str, bool]:
    """(the tracking URI, whether it is the default local store): the config field, the environment, or
    file:<log_dir>/mlruns."""
    uri = configured or os.environ.get(TRACKING_URI_ENV)
    if uri:
        return uri, False
    return (run_dir.path.parent.parent / "mlruns").resolve().as_uri(), True


def mlflow_key(name: str) -> str:
    """A metric or parameter name as MLflow accepts it (catalogue names pass unchanged)."""
    return _REFUSED.sub("_", name)[:250]


class MlflowSink(TrackerSink):
    name, extra = "mlflow", "mlflow"

    def load(self) -> None:
        from mlflow.tracking import MlflowClient  # noqa: F401 - ImportError: the extra is missing

    def open(self) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        uri, local = tracking_uri(self.ctx.config.logging.mlflow_tracking_uri, self.ctx.run_dir)
        if local:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        run = self.run
        exp = client.get_experiment_by_name(run.experiment)
        exp_id = exp.experiment_id if exp else _create_experiment(client, run.experiment)
        found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run.run_id}'", max_results=1)
        if found:  # a resumed run: the same MLflow run, parameters already logged
            self.mlflow_run_id = found[0].info.run_id
            client.update_run(self.mlflow_run_id, status="RUNNING")
            return
        tags = {RUN_ID_TAG: run.run_id, **{re.sub(r"[^\w\-]", "_", t)[:250]: "" for t in run.tags}}
        self.mlflow_run_id = client.create_run(exp_id, run_name=run.run_id, tags=tags).info.run_id
        params = [Param(mlflow_key(k), v[:MAX_PARAM_VALUE]) for k, v in run.params().items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(self.mlflow_run_id, params=params[i:i + PARAMS_PER_BATCH])

    def send(self, record: dict) -> None:
        from mlflow.entities import Metric
        ms, step = int(record["time"] * 1000), int(record["step"])
        metrics = [Metric(mlflow_key(k), v, ms, step) for k, v in metric_items(record)]
        if metrics:
            self.client.log_batch(self.mlflow_run_id, metrics=metrics)

    def finish(self, artifacts, summary) -> None:
        for path in artifacts:
            self.client.log_artifact(self.mlflow_run_id, str(path))
        status = (summary or {}).get("status")
        self.client.set_terminated(self.mlflow_run_id, "FINISHED" if status == "succeeded"
                                   else "KILLED" if status else "FAILED")


def _create_experiment(client, name: str) -> str:
    """Create the experiment; when a run started at the same time created it first, use theirs."""
    try:
        return client.create_experiment(name)
    except Exception:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
