"""The MCP server: each tool is a thin, typed wrapper around a plain function in `tools/`.

Inputs carry bounds and descriptions; results are pydantic models (bounded); agent-fixable errors become
`ToolError` with the fix. Long work never blocks: training tools return a run id at once. Config and
settings paths come from `vapo-mcp serve --config/--settings` (via the environment, see tools.paths).
Argument errors name the argument, the allowed values and the fix (server.arguments); each call runs under
the server's access policy (tools.access: what stdio and HTTP clients may read and change). Imports no torch.
"""
from __future__ import annotations

import base64
import functools
import json
import logging
from contextlib import asynccontextmanager
from typing import Annotated, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from tools import access, training
from tools import channel as channel_tools
from tools import diagnose as diagnose_tools
from tools import doctor as doctor_tools
from tools import evaluate as evaluate_tools
from tools import report as report_tools
from tools.eval_gate import EvalGate
from tools.paths import files, manager_for
from vapo_engine.datafiles import read_bytes
from vapo_engine.metrics import CATALOGUE
from vapo_engine.variants import VARIANTS

from . import arguments as arguments_text
from . import scrubbing, sdk
from .base import VapoMCPServer
from .errors import agent_errors
from .prompts import register_prompts
from .resources import register_resources
from .subscriptions import RunWatch
from .tasks import RunTasks

log = logging.getLogger("vapo_mcp.server")
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True)
NETWORK = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=True)
STARTS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)

RunId = arguments_text.RunId
Overrides = Annotated[list[Annotated[str, Field(max_length=300)]], Field(
    max_length=50, description="config.toml overrides as 'section.key=value', e.g. 'vapo.alpha=0.8'")]


def in_thread(fn):
    """Decorator for a tool whose body blocks (files, SQLite, starting processes): the tool runs the plain
    function in a worker thread (anyio.to_thread.run_sync, which carries the caller's access policy along), so
    the server keeps answering other calls meanwhile. The signature — the tool's schema — is `fn`'s."""
    @functools.wraps(fn)
    async def run(*args, **kwargs):
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
    return run


class Report(BaseModel):
    """One of the two is set: a run's metrics, or an ablation's comparison table."""
    run: report_tools.MetricsReport | None = None
    ablation: report_tools.AblationReport | None = None


@asynccontextmanager
async def lifespan(server: MCPServer):
    """Recovery on start: mark runs whose worker died while no server was watching."""
    try:
        mgr, _ = manager_for(files())
        failed = await anyio.to_thread.run_sync(mgr.recover)
        if failed:
            log.warning("marked %d dead run(s) as failed: %s", len(failed), failed)
    except Exception as e:  # noqa: BLE001 - a bad settings file must not stop the server; tools report it
        log.warning("run recovery skipped: %s", e)
    yield {}


def build_server(policy: access.Policy | None = None, *, gate: EvalGate | None = None) -> MCPServer:
    """The server with every tool, the run resources, the prompts and tasks (server.tasks); `policy` says who its
    clients are (default: a local stdio agent); `gate` bounds its evaluations (default: tools.eval_gate's)."""
    gate = gate or EvalGate()
    watch, tasks = RunWatch(), RunTasks(gate)
    mcp = VapoMCPServer("vapo-mcp", instructions=INSTRUCTIONS, lifespan=lifespan,
                        policy=policy or access.Policy("stdio"), subscriptions=watch.bus, extensions=[tasks])
    _channel_tools(mcp)
    _training_tools(mcp)
    _doctor_tool(mcp)
    _run_tools(mcp)
    _evaluate_tool(mcp, gate)
    register_resources(mcp, watch)
    mcp.run_watch = watch  # who is subscribed to what (server.subscriptions)
    register_prompts(mcp)
    tasks.attach(mcp)
    sdk.check(mcp)
    mcp.middleware.insert(0, scrubbing.middleware)  # outermost: what any handler answers is scrubbed
    scrubbing.install_log_scrubbing()

    @mcp.custom_route("/health", methods=["GET"])
    async def health(request):
        from starlette.responses import JSONResponse
        return JSONResponse({"status": "ok", "tools": len(await mcp.list_tools())})
    return mcp


INSTRUCTIONS = ("Check an OpenAI-compatible API channel (check_channel, smoke_test), diagnose errors "
                "(diagnose_error), and run/ablate/monitor VAPO RL training on local hardware (start_training, "
                "ablate, run_status, report_metrics, list_runs, stop_run, resume_run). Training calls return a "
                "run id at once; poll run_status (clients with MCP task support can call start_training, ablate and "
                "evaluate as tasks: the task id is the run id). evaluate measures held-out accuracy of the API model or a "
                "run's checkpoint the way a run evaluates its policy.")


def _channel_tools(mcp: MCPServer) -> None:
    @mcp.tool(annotations=NETWORK)
    @agent_errors
    async def check_channel(
        probe_chat: Annotated[bool, Field(description="also send a 1-token chat completion")] = True,
    ) -> channel_tools.ChannelReport:
        """Verify the configured API channel: effective base URL and key source (redacted), GET /models with
        and without the key, whether the reasoning/fallback models exist, a tiny chat completion, latency,
        rate-limit headers, and a diagnosis with the fix. Use first when any API call fails."""
        f = files()
        return await channel_tools.check_channel(settings_path=f.settings, config_path=f.config,
                                                 probe_chat=probe_chat)

    @mcp.tool(annotations=NETWORK)
    @agent_errors
    async def smoke_test(
        ctx: Context,
        prompt: Annotated[str | None, Field(max_length=4000, description="question; default: the 240 km / 3 h "
                                                                           "train question")] = None,
        expected: Annotated[str | None, Field(max_length=200, description="text the answer must contain")] = None,
        model: Annotated[str | None, Field(max_length=200, description="model id; default models.reasoning")] = None,
        stream: Annotated[bool | None, Field(description="SSE streaming; default runtime.stream")] = None,
    ) -> channel_tools.SmokeResult:
        """Ask a reasoning question with a known answer through the channel (falls back to the fallback
        model when the reasoning model is unavailable) and judge it: pass/fail with status, model used,
        answer excerpt, latency and usage. A 200 with an error body, empty choices or a wrong answer fails."""
        f = files()
        return await channel_tools.smoke_test(settings_path=f.settings, config_path=f.config, prompt=prompt,
                                              expect=expected, model=model, stream=stream,
                                              on_progress=lambda p, m: ctx.report_progress(p, 1.0, m))

    @mcp.tool(annotations=READ_ONLY)
    @agent_errors
    @in_thread
    def diagnose_error(
        status: Annotated[int | None, Field(ge=100, le=599, description="HTTP status code")] = None,
        body: Annotated[str | dict | list | None, Field(description="error response body (text or JSON)")] = None,
        headers: Annotated[dict[str, str] | None, Field(description="response headers")] = None,
        text: Annotated[str | None, Field(max_length=200_000, description="exception, traceback or log text")] = None,
        log_path: Annotated[str | None, Field(max_length=1000, description="a log file to read")] = None,
        code_path: Annotated[str | None, Field(max_length=1000, description="file/folder of Python code to scan "
                                                                              "for key bugs")] = None,
        run_id: RunId | None = None,
        check_config: Annotated[bool, Field(description="also examine settings.json/config.toml")] = True,
    ) -> diagnose_tools.Diagnosis:
        """Explain a failure: ranked findings (cause, evidence, fix) from any mix of an HTTP status, error
        body, headers, traceback/log text, config files, a code path, or a run id (training symptoms:
        oscillation, length not growing, value/entropy collapse, NaN, λ collapsed by a small α, paper
        mismatch). Use after any error or when a run looks wrong."""
        f = files()
        kwargs = {"run_dir": training.views_for(f).get(run_id).record.run_dir} if run_id else {}
        if body is not None and not isinstance(body, str):
            body = json.dumps(body)  # the SDK hands JSON text over already parsed
        body = body[:100_000] if body else body
        return diagnose_tools.diagnose_error(
            status=status, body=body, headers=headers, text=text, log_path=log_path, code_path=code_path,
            settings_path=f.settings if check_config else None, config_path=f.config if check_config else None,
            files=f, **kwargs)


def _training_tools(mcp: MCPServer) -> None:
    @mcp.tool(annotations=STARTS)
    @agent_errors
    @in_thread
    def start_training(
        preset: Annotated[str | None, Field(max_length=200, description="'cpu-demo' (built-in tiny model, ~3 min "
                                                                          "on a CPU) or a .toml of overrides")] = None,
        overrides: Overrides | None = None,
        tags: Annotated[list[Annotated[str, Field(max_length=64)]] | None, Field(max_length=16)] = None,
        provider_samples: training.ProviderSamplesArgs | None = None,
    ) -> training.StartResult:
        """Validate config.toml + preset + overrides (errors name the key and the fix), then start a VAPO run
        in a detached worker that survives this server. Returns the run id at once; poll run_status.
        provider_samples: also ask the configured API channel's model (settings.json) to answer the training
        prompts; its correct answers become extra positive examples (costs API calls, capped by max_requests;
        report_metrics shows provider/*; run_status says if the provider went down)."""
        return training.start_training(files(), preset=preset, overrides=list(overrides or []),
                                       tags=list(tags or []), provider=provider_samples)

    @mcp.tool(annotations=STARTS)
    @agent_errors
    @in_thread
    def ablate(
        variants: Annotated[list[Literal[tuple(VARIANTS)]] | None, Field(  # type: ignore[valid-type]
            max_length=len(VARIANTS), description="variants to run (default: full VAPO, every 'w/o X', PPO, "
                                                  "GRPO); full VAPO is always included")] = None,
        preset: Annotated[str | None, Field(max_length=200, description="e.g. 'cpu-demo'")] = None,
        overrides: Overrides | None = None,
    ) -> training.AblationStart:
        """Run full VAPO and 'w/o X' variants (and PPO/GRPO baselines) with the same seed and number of policy
        steps (compute differs between arms), one after another. Returns an ablation id; report_metrics(ablation
        id) gives the comparison table and plot."""
        return training.ablate(files(), variants=list(variants) if variants else None, preset=preset,
                               overrides=list(overrides or []))

    @mcp.tool(annotations=READ_ONLY)
    @agent_errors
    @in_thread
    def report_metrics(
        run_id: RunId,
        names: Annotated[list[Literal[tuple(CATALOGUE)]] | None, Field(  # type: ignore[valid-type]
            max_length=20, description="metric names (default: reward, length, explained var, λ, entropy, "
                                       "pg loss)")] = None,
        cursor: Annotated[int, Field(ge=0, description="series start index; use next_cursor")] = 0,
        limit: Annotated[int, Field(ge=1, le=500, description="series points per call")] = 200,
        plot: Annotated[bool, Field(description="attach a PNG plot")] = True,
    ) -> Annotated[CallToolResult, Report]:
        """A run's latest metrics, trends (is length growing? reward stable? explained variance?), a bounded
        series with a continuation cursor and a PNG plot; for an ablation id, the comparison table + plot."""
        res = report_tools.report_metrics(files(), run_id, names=list(names) if names else None, cursor=cursor,
                                          limit=limit, plot=plot)
        rep = Report(ablation=res) if isinstance(res, report_tools.AblationReport) else Report(run=res)
        return _with_image(rep, res.plot_png)


def _doctor_tool(mcp: MCPServer) -> None:
    @mcp.tool(annotations=NETWORK)
    @agent_errors
    @in_thread
    def doctor(
        preset: Annotated[str | None, Field(max_length=200, description="as for start_training")] = None,
        overrides: Overrides | None = None,
    ) -> doctor_tools.DoctorReport:
        """Preflight a run without loading weights (seconds, CPU): batch/group/world-size divisibility, memory
        per rank for the strategy and precision vs the GPU or RAM, disk for checkpoints, datasets, the chat
        template round trip, threads, channel and rollout-server reachability. Each finding has its severity,
        numbers and fix; start_training runs the same checks and refuses on an error."""
        return doctor_tools.doctor(files(), preset=preset, overrides=list(overrides or []))


def _with_image(rep: Report, png: str | None) -> CallToolResult:
    data = rep.model_dump(mode="json")
    content = [TextContent(type="text", text=json.dumps(data))]
    try:
        data_png = read_bytes(png) if png else None  # a regular file only: never a link or FIFO planted there
    except OSError:
        data_png = None
    if data_png:
        content.append(ImageContent(type="image", mime_type="image/png", data=base64.b64encode(data_png).decode()))
    return CallToolResult(content=content, structured_content=data)


def _run_tools(mcp: MCPServer) -> None:
    @mcp.tool(annotations=READ_ONLY)
    @agent_errors
    @in_thread
    def list_runs(
        state: Annotated[Literal["queued", "running", "succeeded", "failed", "stopped"] | None,
                         Field(description="filter by state")] = None,
        experiment: Annotated[str | None, Field(max_length=100)] = None,
        tag: Annotated[str | None, Field(max_length=64)] = None,
        limit: Annotated[int, Field(ge=1, le=200)] = 20,
    ) -> training.RunList:
        """Runs newest first, with state, progress and latest held-out accuracy; filter by state/experiment/tag.
        `skipped` lists run records the registry could not index (with why and the fix)."""
        return training.list_runs(files(), state=state, experiment=experiment, tag=tag, limit=limit)

    @mcp.tool(annotations=READ_ONLY)
    @agent_errors
    @in_thread
    def run_status(run_id: RunId,
                   log_lines: Annotated[int, Field(ge=0, le=200)] = 20) -> training.RunStatus:
        """State (queued/running/succeeded/failed/stopped) with its message, step/total, latest evaluation, the
        worker log tail and what to do next. Poll this after start_training."""
        return training.run_status(files(), run_id, log_lines=log_lines)

    @mcp.tool(annotations=DESTRUCTIVE)
    @agent_errors
    @in_thread
    def stop_run(run_id: RunId,
                 force: Annotated[bool, Field(description="SIGKILL at once instead of a graceful stop "
                                                          "after a checkpoint")] = False) -> training.RunView:
        """Stop a queued or running run (graceful: it checkpoints first, so resume_run can continue it)."""
        return training.stop_run(files(), run_id, force=force)

    @mcp.tool(annotations=STARTS)
    @agent_errors
    @in_thread
    def resume_run(run_id: RunId) -> training.RunView:
        """Continue a failed or stopped run from its newest checkpoint (a new run id in the same directory)."""
        return training.resume_run(files(), run_id)


EVALUATES = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=True)


def _evaluate_tool(mcp: MCPServer, gate: EvalGate) -> None:
    @mcp.tool(annotations=EVALUATES)
    @agent_errors
    async def evaluate(
        ctx: Context,
        backend: Annotated[Literal["channel", "local"], Field(
            description="channel: the configured API model (a provider, or a checkpoint served with vapo-mcp "
                        "serve-model); local: a run's checkpoint, in a worker process")] = "channel",
        run_id: Annotated[RunId | None, Field(description="local: the run whose checkpoint to evaluate; both "
                                                          "backends: use that run's eval settings")] = None,
        step: Annotated[int | None, Field(ge=0, description="local: the checkpoint's policy step (default: the "
                                                            "newest that verifies)")] = None,
        model: Annotated[str | None, Field(max_length=200, description="channel: model id (default: "
                                                                       "models.reasoning, with the fallback)")] = None,
        benchmark: Annotated[str | None, Field(max_length=300, description="builtin:addition, builtin:chain, a "
                                               "JSONL name (<data_dir>/<name>.jsonl) or .jsonl path (default: "
                                               "eval.benchmark)")] = None,
        num_problems: Annotated[int | None, Field(ge=1, le=1000, description="held-out problems (default: "
                                                  "eval.num_problems, at most 1000)")] = None,
        samples_per_problem: Annotated[int | None, Field(ge=0, le=16, description="k of avg@k (default: "
                                                         "eval.samples_per_problem, at most 16; 0 = greedy only)")] = None,
        max_tokens: Annotated[int | None, Field(ge=1, le=32768, description="new tokens per answer (default: "
                                                                            "model.max_tokens)")] = None,
        timeout_seconds: Annotated[int, Field(ge=10, le=3600, description="give up after this long; unanswered "
                                                                          "requests count as failures")] = 600,
    ) -> evaluate_tools.EvalReport:
        """Held-out accuracy of a model, measured exactly like a run's evaluation (same problems, checker,
        greedy accuracy and avg@k, per bucket): the API model through the channel ("API model vs my policy"),
        or a run's checkpoint locally. Reports latency p50/p95, tokens, failures and which model answered. Use
        it to get a provider baseline for a benchmark, to compare a trained checkpoint with it, or to check a
        served checkpoint end to end. Runs to completion within the call (bounded by num_problems, samples
        and timeout_seconds) and reports progress; start small (num_problems 20-50). The server runs 2
        evaluations at once and lets 8 more wait (another is refused: call again later), and its channel
        requests count against the server's hourly budget (a call that would exceed it is refused)."""
        f = files()
        return await evaluate_tools.evaluate(
            f, backend=backend, run_id=run_id, step=step, model=model, benchmark=benchmark,
            num_problems=num_problems, samples_per_problem=samples_per_problem, max_tokens=max_tokens,
            timeout_s=timeout_seconds, caps=(1000, 16), on_progress=lambda p, m: ctx.report_progress(p, 1.0, m),
            gate=gate)
