"""MCP prompts an IDE assistant can offer: each turns a few arguments into one user message that names the tool
calls to make, with their arguments filled in (JSON), and what to do with the answers.

- `diagnose_api_error`: a failing API call from its error text (and status) → diagnose_error, check_channel,
  smoke_test.
- `train_and_watch`: start a VAPO run on a local model and watch it → start_training, then the run's resources
  (vapo://runs/<id>, subscribed) or run_status, report_metrics, and diagnose_error / resume_run on failure.
- `compare_checkpoints`: two checkpoints (RUN_ID or RUN_ID@STEP) on one benchmark → two evaluate calls with the
  same settings, then the comparison.

Arguments arrive as strings (MCP prompts); a value the tools would refuse is refused here with the tools' message
(server.arguments) as an invalid-params error. Pasted text is scrubbed before it is echoed. Imports no torch.
"""
from __future__ import annotations

import json
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel, Field, ValidationError

from vapo_engine.providers.redaction import scrub

from . import arguments as arguments_text

PASTE_LIMIT = 20_000
"""Characters of a pasted error kept in the prompt (diagnose_error takes more; the head holds the cause)."""


class _Args(BaseModel):
    """The typed form of the prompts' string arguments, with the tools' bounds."""

    run_id: arguments_text.RunId | None = None
    step: int | None = Field(None, ge=0, description="a checkpoint's policy step")
    status: int | None = Field(None, ge=100, le=599, description="HTTP status code")
    steps: int | None = Field(None, ge=1, le=1_000_000, description="training.total_steps")
    num_problems: int | None = Field(None, ge=1, le=1000, description="held-out problems")


def _typed(prompt: str, **given: Any) -> _Args:
    """The arguments that are set, typed; a bad one raises the tools' message for it."""
    try:
        return _Args(**{k: v for k, v in given.items() if v not in (None, "")})
    except ValidationError as e:
        raise MCPError(INVALID_PARAMS, arguments_text.describe_validation(prompt, e, _Args.model_json_schema())) \
            from None


def _call(tool: str, args: dict) -> str:
    return f"`{tool}` with arguments {json.dumps(args, ensure_ascii=False)}"


def _checkpoint(prompt: str, spec: str) -> dict:
    """'RUN_ID' or 'RUN_ID@STEP' as evaluate arguments."""
    run_id, _, step = spec.strip().partition("@")
    args = _typed(prompt, run_id=run_id, step=step or None)
    return {"run_id": args.run_id, **({"step": args.step} if args.step is not None else {})}


def register_prompts(mcp: MCPServer) -> None:
    """Add the prompts to `mcp`."""
    @mcp.prompt(title="Diagnose a failing API call")
    def diagnose_api_error(
        error: Annotated[str, Field(description="the error as you got it: response body, exception or log text")],
        status: Annotated[str | None, Field(description="the HTTP status code, if known")] = None,
    ) -> str:
        """Find the cause of a failing call to the OpenAI-compatible API channel and its fix: diagnose_error on
        the error, then check_channel and smoke_test to confirm."""
        code = _typed("diagnose_api_error", status=status).status
        pasted = scrub(error.strip()[:PASTE_LIMIT])
        try:
            json.loads(pasted)
            args: dict = {"body": pasted}
        except ValueError:
            args = {"text": pasted}
        if code is not None:
            args = {"status": code, **args}
        return (f"An API call failed. Find the cause and fix it with the vapo-mcp tools:\n"
                f"1. Call {_call('diagnose_error', args)}. Its findings are ranked: cause, evidence, fix.\n"
                f"2. Call {_call('check_channel', {})} to see the effective base URL, key source (redacted), "
                "whether the models exist and the rate limits.\n"
                "3. Apply the fix of the top finding (settings.json, the key's environment variable or .env, the "
                f"model id), then call {_call('smoke_test', {})} to confirm the channel answers.\n"
                "Report the cause, the evidence and the fix in a few lines; never print the API key.")

    @mcp.prompt(title="Start and watch a VAPO run")
    def train_and_watch(
        model_path: Annotated[str | None, Field(description="a local Hugging Face model folder; empty = the "
                                                            "built-in tiny model")] = None,
        preset: Annotated[str | None, Field(description="'cpu-demo' or a .toml of overrides; default: cpu-demo "
                                                        "for the built-in model, config.toml otherwise")] = None,
        steps: Annotated[str | None, Field(description="training.total_steps (default: the config's)")] = None,
        benchmark: Annotated[str | None, Field(description="held-out set: builtin:addition, builtin:chain or a "
                                                           "JSONL name (default: eval.benchmark)")] = None,
    ) -> str:
        """Start a VAPO run on your model with start_training and watch it to the end through the run's
        resources (or run_status), with report_metrics for the curves and diagnose_error if it fails."""
        total = _typed("train_and_watch", steps=steps).steps
        overrides = [*([f"model.local_path={json.dumps(model_path.strip())}"] if model_path else []),
                     *([f"training.total_steps={total}"] if total else []),
                     *([f"eval.benchmark={json.dumps(benchmark.strip())}"] if benchmark else [])]
        args = {k: v for k, v in {"preset": preset or (None if model_path else "cpu-demo"),
                                  "overrides": overrides}.items() if v}
        return (f"Start a VAPO training run and watch it:\n"
                f"1. Call {_call('start_training', args)}. It validates the config first: on an error, apply the "
                "fix it names and call again. It returns the run id (RUN_ID below) at once.\n"
                "2. Watch it: subscribe to the resource vapo://runs/RUN_ID (notified when its state changes or "
                "it logs an evaluation) and read it then; without subscriptions, call "
                f"{_call('run_status', {'run_id': 'RUN_ID'})} every minute or so.\n"
                "3. While it runs and at the end, read vapo://runs/RUN_ID/metrics and vapo://runs/RUN_ID/plot.png, "
                f"or call {_call('report_metrics', {'run_id': 'RUN_ID'})} for trends (is the response length "
                "growing, the reward stable, the explained variance good?).\n"
                f"4. If it fails: call {_call('diagnose_error', {'run_id': 'RUN_ID'})}, fix the cause, then "
                f"{_call('resume_run', {'run_id': 'RUN_ID'})} continues from the newest checkpoint. To stop it "
                f"early: {_call('stop_run', {'run_id': 'RUN_ID'})} (it checkpoints first).\n"
                "Report the final held-out accuracy, the trends and anything that looked wrong.")

    @mcp.prompt(title="Compare two checkpoints on a benchmark")
    def compare_checkpoints(
        checkpoint_a: Annotated[str, Field(description="RUN_ID or RUN_ID@STEP (default step: the newest "
                                                       "checkpoint that verifies)")],
        checkpoint_b: Annotated[str, Field(description="RUN_ID or RUN_ID@STEP")],
        benchmark: Annotated[str | None, Field(description="builtin:addition, builtin:chain, a JSONL name or "
                                                           ".jsonl path (default: each run's eval.benchmark)")] = None,
        num_problems: Annotated[str | None, Field(description="held-out problems (1-1000, default 50)")] = None,
    ) -> str:
        """Evaluate two checkpoints on the same benchmark with the same settings (evaluate, backend local) and
        compare greedy accuracy, avg@k and the per-bucket results."""
        shared = {"benchmark": benchmark.strip() if benchmark else None,
                  "num_problems": _typed("compare_checkpoints", num_problems=num_problems).num_problems or 50}
        calls = [{"backend": "local", **_checkpoint("compare_checkpoints", spec),
                  **{k: v for k, v in shared.items() if v is not None}} for spec in (checkpoint_a, checkpoint_b)]
        return (f"Compare two checkpoints on one benchmark:\n"
                f"1. Call {_call('evaluate', calls[0])}.\n"
                f"2. Call {_call('evaluate', calls[1])} (the same benchmark, problems and samples, so the numbers "
                "compare).\n"
                "3. Compare greedy accuracy and avg@k overall and per bucket, and say whether the difference is "
                "larger than the noise of that many problems (a few points at 50). If an evaluate call says a "
                "run has no usable checkpoint, list_runs shows the runs and their steps.\n"
                "Report a small table (checkpoint, greedy accuracy, avg@k, failures) and which one is better.")
