"""`evaluate` / `vapo-mcp eval`: a model's accuracy on a benchmark, measured the way a run measures its policy
(docs/design.md §8: same held-out problems, same checker, same avg@k), so "the API model vs my policy" compares like
with like.

- **What is asked**: the task's `heldout(num_problems)` (a built-in task, or a JSONL name/path resolved like
  `eval.benchmark`); greedy accuracy (temperature 0) and sampled avg@k (k = samples_per_problem, at the
  config's temperature / top_p), per difficulty bucket when the task has buckets; `max_tokens` of the config.
- **Settings**: from the run's frozen config when a run is named, else from config.toml (+ preset); for a
  built-in task without a run, max_tokens is capped by the task's own answer length. The local backend encodes
  the prompts as the run does (`model.prompt_format` / `model.system_prompt`: chat template or plain).
- **Backends**: `local` loads a run's checkpoint (newest verified or `step`) or a model directory in a worker
  process (`python -m vapo_engine.serving.local_eval`, which calls the run's own evaluation function): this
  module and the MCP server never import torch. `channel` asks the configured API channel (tools.eval_channel):
  `models.reasoning` with the fallback, or `model`; the key only ever goes to the configured base URL.
- **Report**: accuracy (greedy, avg@k, per bucket, and the run's `eval/*` metric names), latency p50/p95 and
  tokens (channel), failures (count, kinds, first messages), which model answered, wall time.

Remote (HTTP) callers may only name JSONL files and model folders inside the allowed roots (tools.access).
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
from pydantic import BaseModel, Field

from vapo_engine.childenv import child_env
from vapo_engine.config import ConfigError, load_config, load_settings
from vapo_engine.config.path_fields import freeze_paths
from vapo_engine.errors import UserError
from vapo_engine.metrics import accuracies
from vapo_engine.providers import safe_text
from vapo_engine.providers.pool import percentile
from vapo_engine.realmodels.source import packaged_name
from vapo_engine.runs import load_run
from vapo_engine.serving.source import ModelSource, resolve_source
from vapo_engine.tasks import TaskError, get_task

from . import access
from .channel_support import Progress, load_channel, report_progress, scrubbed
from .eval_channel import ChannelRun, run_channel
from .eval_gate import EvalGate, Reservation
from .paths import Files, ToolInputError, manager_for


class Failures(BaseModel):
    count: int = 0
    kinds: dict[str, int] = Field(default_factory=dict, description="failures by kind (auth, rate_limit, ...)")
    first: list[str] = Field(default_factory=list, description="the first distinct error messages (≤ 3)")


class EvalReport(BaseModel):
    """Result of `evaluate`: accuracy on the held-out problems and how the requests went."""

    ok: bool = Field(description="an accuracy was measured (some answers arrived and nothing fatal happened)")
    backend: Literal["local", "channel"]
    benchmark: str
    model: str = Field(description="the model that answered (channel: the most frequent; local: run@step or dir)")
    models_used: dict[str, int] = Field(default_factory=dict)
    run_id: str | None = None
    step: int | None = None
    problems: int
    samples_per_problem: int
    max_tokens: int
    temperature: float
    top_p: float
    greedy_accuracy: float | None = None
    sampled_accuracy: float | None = Field(None, description="avg@k over samples_per_problem samples")
    buckets: dict[str, dict[str, float]] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict, description="the run's eval/* names and values")
    response_length: float | None = Field(None, description="mean greedy answer length in tokens")
    latency_ms: dict[str, float] | None = None
    tokens: dict[str, int] | None = None
    requests: int = 0
    failures: Failures = Field(default_factory=Failures)
    complete: bool = True
    seconds: float = 0.0
    settings_from: str = ""
    summary: str = ""


@dataclass(frozen=True)
class EvalPlan:
    benchmark: str
    data_dir: str
    num_problems: int
    samples: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    settings_from: str
    run_id: str | None = None
    step: int | None = None
    prompt_format: str = "auto"
    """model.prompt_format of the settings (the local backend's prompts; vapo_engine.prompts)."""
    system_prompt: str | None = None
    """model.system_prompt of the settings (None = the task's format instruction)."""


# --- planning ---------------------------------------------------------------------------------------------
def _confined_task(f: Files, spec: str, data_dir: str):
    policy = access.current()
    if policy.confines_paths:
        roots = access.allowed_roots(f, policy)
        for candidate in access.jsonl_candidates(spec, Path(data_dir)):
            access.confine(candidate, f, policy, roots=roots, shown=spec)
    try:
        return get_task(spec, data_dir)
    except TaskError as e:
        raise ToolInputError(str(e)) from None


def make_plan(f: Files, *, run_dir: Path | None, step: int | None, benchmark: str | None,
              num_problems: int | None, samples: int | None, max_tokens: int | None,
              preset: str | None = None, caps: tuple[int, int] | None = None) -> tuple[EvalPlan, object]:
    """The evaluation settings (run config or config.toml, then the explicit arguments) and the task.
    `caps` = (most problems, most samples) a caller allows, also when the config's defaults are larger."""
    if run_dir is not None:
        info, cfg = load_run(run_dir)
        origin, run_id, seed = f"run {info.run_id} config", info.run_id, info.seed + 7919 * (step or 0)
    else:
        cfg = freeze_paths(load_config(f.config, preset=access.preset_for(f, preset)), f.config.resolve().parent)
        origin, run_id, seed = f"{f.config}" + (f" + preset {preset}" if preset else ""), None, _seed(f)
    spec = (benchmark or cfg.eval.benchmark).strip()
    task = _confined_task(f, spec, cfg.data.data_dir)
    limit = max_tokens or cfg.model.max_tokens
    if max_tokens is None and run_dir is None and getattr(task, "max_new_tokens", None):
        limit = min(limit, task.max_new_tokens)
    n = num_problems or cfg.eval.num_problems
    k = cfg.eval.samples_per_problem if samples is None else samples
    if caps:
        n, k = min(n, caps[0]), min(k, caps[1])
    plan = EvalPlan(spec, cfg.data.data_dir, n, k, limit, cfg.model.temperature, cfg.model.top_p, seed, origin,
                    run_id, step, cfg.model.prompt_format, cfg.model.system_prompt)
    return plan, task


def _seed(f: Files) -> int:
    """settings.json's experiment.seed (the sampled accuracy's seed without a run); 0 when it does not load."""
    try:
        return load_settings(f.settings).experiment.seed
    except ConfigError:
        return 0


def _run_dir(f: Files, run_id: str) -> Path:
    mgr, _ = manager_for(f)
    return Path(mgr.get(run_id).run_dir)


def _check_args(backend: str, run_id, step, model_dir, model) -> None:
    if backend == "local" and not (run_id or model_dir):
        raise ToolInputError("the local backend needs a model: pass run_id (a run's checkpoint) or model_dir, or "
                             "use backend 'channel' to evaluate the API model")
    if run_id and model_dir:
        raise ToolInputError("pass run_id or model_dir, not both")
    if backend == "channel" and (model_dir or step is not None):
        raise ToolInputError("model_dir and step apply to the local backend; for the channel pass model (a model "
                             "id at the configured base URL), or use backend 'local'")
    if backend == "local" and model:
        raise ToolInputError("model names an API model (channel backend); for a local model pass run_id or "
                             "model_dir")


# --- the entry point --------------------------------------------------------------------------------------
async def evaluate(f: Files, *, backend: Literal["local", "channel"] = "local", run_id: str | None = None,
                   step: int | None = None, model_dir: str | None = None, model: str | None = None,
                   benchmark: str | None = None, num_problems: int | None = None,
                   samples_per_problem: int | None = None, max_tokens: int | None = None,
                   preset: str | None = None, concurrency: int = 8, timeout_s: float = 3600.0,
                   device: str = "auto", caps: tuple[int, int] | None = None,
                   on_progress: Progress | None = None, gate: EvalGate | None = None) -> EvalReport:
    """Evaluate and report (see the module docstring); user mistakes raise ToolInputError / UserError. `gate`
    (tools.eval_gate): the server's bound on evaluations at once and on the requests they send."""
    _check_args(backend, run_id, step, model_dir, model)
    if gate is not None and gate.inside >= gate.capacity:
        raise ToolInputError(gate.busy_message())

    def prepare() -> tuple[EvalPlan, object, ModelSource | None]:  # disk work (checkpoint hashes): off the loop
        run_dir = _run_dir(f, run_id) if run_id else None
        source = None
        if backend == "local":  # a packaged model's name (builtin:…) is no path to confine
            where = model_dir if packaged_name(model_dir) else run_dir or access.confine(model_dir, f)
            source = resolve_source(where, step=step)
        plan, task = make_plan(f, run_dir=run_dir, step=source.step if source else step, benchmark=benchmark,
                               num_problems=num_problems, samples=samples_per_problem, max_tokens=max_tokens,
                               preset=preset, caps=caps)
        return plan, task, source

    plan, task, source = await anyio.to_thread.run_sync(prepare)
    planned = 0 if backend == "local" else plan.num_problems * (1 + (plan.samples if plan.temperature > 0 else 0))
    async with (gate.admitted(planned) if gate is not None else _unbounded()) as turn:
        await report_progress(on_progress, 0.02, f"evaluating on {plan.benchmark}")
        if backend == "local":
            report = await run_local(plan, source, device=device, timeout_s=timeout_s)
        else:
            report = await _channel_report(f, plan, task, model, concurrency, timeout_s, on_progress,
                                           turn.count_request)
    await report_progress(on_progress, 1.0, report.summary[:120])
    return report


@asynccontextmanager
async def _unbounded():
    yield Reservation(0)


async def _channel_report(f: Files, plan: EvalPlan, task, model: str | None, concurrency: int,
                          timeout_s: float, on_progress: Progress | None, on_request=None) -> EvalReport:
    channel = await anyio.to_thread.run_sync(load_channel, f.settings, f.config)
    problems = await anyio.to_thread.run_sync(task.heldout, plan.num_problems)
    last = [0.0]

    async def progress(done: int, total: int) -> None:
        if done == total or done / total - last[0] >= 0.05:
            last[0] = done / total
            await report_progress(on_progress, 0.05 + 0.9 * done / total, f"{done}/{total} answers")

    requested = model or channel.reasoning_model
    run = await run_channel(channel, task, problems, model=requested,
                            fallback=None if model else channel.fallback_model, max_tokens=plan.max_tokens,
                            temperature=plan.temperature, top_p=plan.top_p, samples=plan.samples,
                            concurrency=concurrency, deadline_s=timeout_s, on_progress=progress,
                            on_request=on_request)
    return scrubbed(channel_report(plan, task, problems, run, requested), channel)


def channel_report(plan: EvalPlan, task, problems: list, run: ChannelRun, requested: str) -> EvalReport:
    calls = run.greedy + run.sampled
    answered = [c for c in calls if c.ok]
    metrics = accuracies("greedy", task, problems, [c.reward for c in run.greedy])
    if run.sampled:
        many = [p for p in problems for _ in range(plan.samples)]
        metrics |= accuracies("sampled", task, many, [c.reward for c in run.sampled])
    greedy_ok = [c for c in run.greedy if c.ok]
    if greedy_ok:
        metrics["eval/response_length"] = sum(c.completion_tokens for c in greedy_ok) / len(greedy_ok)
    used = Counter(c.model_used for c in answered)
    failed = [c for c in calls if not c.ok]
    kinds = Counter((c.error_kind or "error").removeprefix("fatal:") for c in failed)
    first = list(dict.fromkeys(c.error for c in failed if c.error))[:3]
    lat = [c.latency_s * 1000 for c in answered if c.latency_s is not None]
    report = from_metrics(
        plan, metrics, backend="channel", model=used.most_common(1)[0][0] if used else requested,
        models_used=dict(used), requests=len(calls), complete=run.complete, seconds=run.seconds,
        latency_ms={"p50": percentile(lat, 0.5), "p95": percentile(lat, 0.95)} if lat else None,
        tokens={"prompt": sum(c.prompt_tokens for c in answered),
                "completion": sum(c.completion_tokens for c in answered)},
        failures=Failures(count=len(failed), kinds=dict(kinds), first=first),
        ok=bool(answered) and run.stopped_early is None)
    return report.model_copy(update={"summary": summarise(report, run.stopped_early)})


def from_metrics(plan: EvalPlan, metrics: dict[str, float], **fields) -> EvalReport:
    buckets: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        m = re.fullmatch(r"eval/(greedy|sampled)_accuracy_(.+)", name)
        if m:
            buckets.setdefault(m.group(2), {})[m.group(1)] = value
    problems = fields.pop("problems", None)
    return EvalReport(
        benchmark=plan.benchmark, run_id=plan.run_id, step=plan.step, samples_per_problem=plan.samples,
        problems=problems if problems is not None else plan.num_problems, max_tokens=plan.max_tokens,
        temperature=plan.temperature, top_p=plan.top_p, greedy_accuracy=metrics.get("eval/greedy_accuracy"),
        sampled_accuracy=metrics.get("eval/sampled_accuracy"), buckets=buckets, metrics=metrics,
        response_length=metrics.get("eval/response_length"), settings_from=plan.settings_from, **fields)


def summarise(r: EvalReport, stopped: str | None = None) -> str:
    if stopped:
        return f"evaluation stopped: {stopped}"
    if not r.ok:
        first = r.failures.first[0] if r.failures.first else "no answer arrived"
        return f"no accuracy measured: {first}"
    acc = f"greedy {r.greedy_accuracy:.1%}" if r.greedy_accuracy is not None else "greedy -"
    if r.sampled_accuracy is not None:
        acc += f", avg@{r.samples_per_problem} {r.sampled_accuracy:.1%}"
    tail = f"; {r.failures.count} failed request(s)" if r.failures.count else ""
    tail += "" if r.complete else " (incomplete: deadline reached)"
    return f"{acc} on {r.problems} {r.benchmark} problems, model {r.model} ({r.backend}){tail}"


class EvalWorkerError(UserError):
    """The local evaluation worker failed or timed out; the message says what to change."""


async def run_local(plan: EvalPlan, source: ModelSource, *, device: str = "auto",
                    timeout_s: float = 3600.0) -> EvalReport:
    """The run's own evaluation of `source` in a worker process (torch stays out of this process)."""
    spec = {"model_dir": str(source.model_dir), "benchmark": plan.benchmark, "data_dir": plan.data_dir,
            "num_problems": plan.num_problems, "samples_per_problem": plan.samples, "max_tokens": plan.max_tokens,
            "temperature": plan.temperature, "top_p": plan.top_p, "seed": plan.seed, "device": device,
            "prompt_format": plan.prompt_format, "system_prompt": plan.system_prompt}
    cmd = [sys.executable, "-m", "vapo_engine.serving.local_eval"]
    try:
        with anyio.fail_after(timeout_s):
            code, stdout, stderr = await _run_worker(cmd, json.dumps(spec).encode())
    except TimeoutError:
        raise EvalWorkerError(f"the local evaluation took longer than {timeout_s:g} s and was stopped; pass fewer "
                              "problems (num_problems) or samples, or a longer timeout") from None
    out = _last_json(stdout.decode("utf-8", "replace"))
    if out is None or not out.get("ok"):
        err = stderr.decode("utf-8", "replace").strip().splitlines()
        why = out.get("error") if out else f"exit {code}: {err[-1] if err else 'no output'}"
        raise EvalWorkerError(f"local evaluation of {source.model_dir} failed: {safe_text(why, 600)}; check that "
                              "the folder holds a complete model (config.json, safetensors weights, tokenizer) or "
                              "try another checkpoint (step)")
    label = f"{source.run_id}@step-{source.step}" if source.run_id else str(source.model_dir)
    report = from_metrics(plan, {k: float(v) for k, v in out["metrics"].items()}, backend="local", model=label,
                          problems=int(out["problems"]), seconds=float(out["seconds"]), ok=True)
    return report.model_copy(update={"summary": summarise(report)})


async def _run_worker(cmd: list[str], payload: bytes) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of the worker fed `payload`. Cancelled or timed out, the worker is killed at
    once — never left running to its end (a cancelled `evaluate` task frees its ~400 MB)."""
    out, err = bytearray(), bytearray()

    async def drain(stream, into: bytearray) -> None:
        async for chunk in stream:
            into += chunk
    with anyio.CancelScope(shield=True):  # a cancel while it starts must not leave it running unowned
        process = await anyio.open_process(cmd, env=child_env())
    async with process:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain, process.stdout, out)
                tg.start_soon(drain, process.stderr, err)
                await process.stdin.send(payload)
                await process.stdin.aclose()
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
    return code, bytes(out), bytes(err)


def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        return data if isinstance(data, dict) else None
    return None


def evaluate_sync(*args, **kw) -> EvalReport:
    """`evaluate` for synchronous callers (the CLI)."""
    return anyio.run(lambda: evaluate(*args, **kw))


__all__ = ["EvalPlan", "EvalReport", "Failures", "accuracies", "channel_report", "evaluate", "evaluate_sync",
           "make_plan", "summarise"]
