"""Training jobs as agent operations: start, ablate, list, status, stop, resume. Plain functions returning
pydantic models; no mcp, no torch. Long work never blocks: each call returns at once with a run id to poll.
"""
from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vapo_engine.config import TrainConfig, load_config, resolve_channel
from vapo_engine.config.lora_model import peft_missing
from vapo_engine.config.path_fields import freeze_paths
from vapo_engine.jobs import RunSnapshot, RunViews
from vapo_engine.prompts import check_prompts
from vapo_engine.providers.redaction import scrub_model
from vapo_engine.rundir import CONFIG_JSON
from vapo_engine.runs import create_run
from vapo_engine.sinks import sink_factories
from vapo_engine.tasks import TaskError, get_task
from vapo_engine.variants import DEFAULT_ABLATION, VARIANTS

from . import access, hints
from .doctor import doctor, refuse_on_error
from .paths import Files, ToolInputError, known_secrets, manager_for


class RunView(BaseModel):
    run_id: str
    state: str
    message: str
    experiment: str
    tags: list[str]
    run_dir: str
    variant: str | None = None
    group_id: str | None = None
    resumed_from: str | None = None
    step: int = Field(0, description="latest policy step with metrics")
    total_steps: int | None = None
    latest_eval: dict[str, float] = Field(default_factory=dict)


class ProviderSamplesArgs(BaseModel):
    """[provider_rollouts] for one run: answers of the API channel's model as extra positives. The channel
    itself (base URL, key) is settings.json's and the environment's: a tool call can never set or redirect it."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    model: str | None = Field(None, max_length=200, description="model id (default: settings.json models.reasoning)")
    samples_per_prompt: int | None = Field(None, ge=1, le=64, description="answers per prompt (default group_size)")
    max_requests: int | None = Field(None, ge=1, le=100_000, description="prompts sent per run at most (cost cap)")
    concurrency: int | None = Field(None, ge=1, le=64, description="requests in flight at most (lowered on 429)")
    temperature: float | None = Field(None, ge=0, le=5)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)

    def overrides(self) -> list[str]:
        return [f"provider_rollouts.{k}={json.dumps(v)}" for k, v in self.model_dump(exclude_none=True).items()]


class StartResult(BaseModel):
    run: RunView
    poll: str = Field(description="what to call next")
    warnings: list[str] = Field(default_factory=list)


class AblationStart(BaseModel):
    ablation_id: str
    runs: list[RunView]
    poll: str


class RunList(BaseModel):
    runs: list[RunView]
    skipped: list[str] = Field(default_factory=list, description="run records the registry could not index "
                               "(a malformed or foreign record in a run directory), each with why and the fix")


class RunStatus(BaseModel):
    run: RunView
    log_tail: str = Field(description="last lines of the worker log (bounded)")
    provider_down: str | None = Field(None, description="why [provider_rollouts] stopped asking the API channel "
                                      "(the run goes on with its own samples), with the fix")
    rollout_servers: str | None = Field(None, description="the run's inference servers (rollout.urls) do not answer: "
                                        "it waits for them, or gave up; which URLs and the fix")
    next_steps: list[str]
    skipped: list[str] = Field(default_factory=list, description="run records the registry could not index")


def views_for(f: Files, *, tick: bool = False) -> RunViews:
    """The read model of these files' runs (vapo_engine.jobs.views); `tick` first advances the queue (starts
    queued runs that now have room, notices finished ones)."""
    mgr, _ = manager_for(f)
    if tick:
        mgr.tick()
    return RunViews(mgr)


def _view(snap: RunSnapshot) -> RunView:
    """The run as a tool result: its record with its progress and latest evaluation."""
    rec = snap.record
    return RunView(run_id=rec.run_id, state=rec.state.value,
                   message=hints.for_caller(rec.message, run_id=rec.run_id, run_dir=rec.run_dir),
                   experiment=rec.experiment,
                   tags=list(rec.tags), run_dir=str(rec.run_dir), variant=rec.variant, group_id=rec.group_id,
                   resumed_from=rec.resumed_from, step=snap.step, total_steps=snap.total_steps,
                   latest_eval=snap.latest_eval)


def prepare_config(f: Files, preset: str | None, overrides: list[str]) -> TrainConfig:
    """Validate config + preset + overrides, the datasets they name, the metric sinks and the prompt format the
    model can take (errors say what to fix), under the caller's policy (tools.access): a tool call may not move the
    rendezvous, a remote one may not name paths outside the allowed roots. Both are checked before any data
    file is opened."""
    policy = access.current()
    preset = access.preset_for(f, preset, policy)
    cfg = freeze_paths(load_config(f.config, overrides, preset=preset), f.config.resolve().parent)
    access.check_config(f, cfg, policy)
    sink_factories(list(cfg.logging.sinks))  # an unknown metric sink: a UserError naming the known ones
    if why := peft_missing(cfg.lora):
        raise ToolInputError(why)
    if why := check_prompts(cfg.model).error:
        raise ToolInputError(why)
    for spec in (cfg.data.train, cfg.eval.benchmark):
        try:
            get_task(spec, cfg.data.data_dir)
        except TaskError as e:
            raise ToolInputError(str(e)) from None
    return cfg


def start_training(f: Files, *, preset: str | None = None, overrides: list[str] = (), tags: list[str] = (),
                   group_id: str | None = None, variant: str | None = None, value_only: bool = False,
                   value_out: str | None = None, provider: ProviderSamplesArgs | None = None) -> StartResult:
    """Validate config + preset + overrides and the datasets, run the preflight doctor (an error refuses the run
    with every finding; its warnings come back with the result), then queue the run. `value_only`: value
    pretraining alone, saving the value model (to `value_out`, default `<run dir>/value_model`). `provider`:
    provider samples (its settings become `provider_rollouts.*` overrides)."""
    overrides = [*overrides, *(provider.overrides() if provider else [])]
    cfg = prepare_config(f, preset, list(overrides))
    preflight = refuse_on_error(doctor(f, preset=preset, overrides=list(overrides)))  # every finding, before the run
    if value_only and not cfg.decisions.uses_critic:
        raise ToolInputError(f"this config trains no value model (training.algorithm = {cfg.training.algorithm}); "
                             "use vapo or ppo")
    extra = {"mode": "value_pretrain", "value_out": value_out} if value_only else {}
    started = _submit(f, cfg, preset=preset, overrides=list(overrides), tags=list(tags), group_id=group_id,
                      variant=variant, extra=extra)
    return started.model_copy(update={"warnings": [*started.warnings, *preflight]})


def _submit(f: Files, cfg: TrainConfig, *, preset: str | None, overrides: list[str], tags: list[str],
            group_id: str | None, variant: str | None, extra: dict | None = None) -> StartResult:
    """Create the run directory of an already validated config and hand it to the run manager."""
    mgr, settings = manager_for(f)
    mgr.check_room()
    if tags:
        exp = settings.experiment.model_copy(update={"tags": [*settings.experiment.tags, *tags]})
        settings = settings.model_copy(update={"experiment": exp})
    channel, warns = resolve_channel(settings, cfg, dotenv_path=f.dotenv)
    info = create_run(cfg, settings, mgr.root, channel_public=channel.public(), overrides=overrides,
                      preset=preset, extra={"group_id": group_id, "variant": variant, **(extra or {})},
                      secrets=channel.secrets())
    try:
        rec = mgr.submit(info.run_id, info.experiment, info.tags, info.run_dir, group_id=group_id, variant=variant,
                         nprocs=cfg.distributed.nproc_per_node)
    except BaseException:  # refused (a full queue another start filled since check_room) or failed: leave nothing
        shutil.rmtree(info.run_dir, ignore_errors=True)
        raise
    return StartResult(run=_view(RunViews(mgr).of(rec)),
                       poll=hints.for_caller(f"run_status(run_id='{info.run_id}') until succeeded/failed, then "
                                             f"report_metrics(run_id='{info.run_id}')"),
                       warnings=[str(w) for w in warns if w.key != "api.api_key_env"])


def ablate(f: Files, *, variants: list[str] | None = None, preset: str | None = None,
           overrides: list[str] = ()) -> AblationStart:
    """One run per variant (full VAPO always included), each with the same seed and the same number of policy
    steps (not the same compute: value pretraining, a critic or extra losses cost more in some arms); all
    configs are validated before the first run starts."""
    names = list(variants or DEFAULT_ABLATION)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ToolInputError(f"unknown variant(s) {unknown}; valid: {', '.join(VARIANTS)}")
    if "vapo" not in names:
        names.insert(0, "vapo")
    base = prepare_config(f, preset, list(overrides))
    manager_for(f)[0].check_room(len(names))
    plans = {}
    for name in names:
        over = [*overrides, *VARIANTS[name].apply(base)]
        plans[name] = (over, prepare_config(f, preset, over))
    ablation_id = "abl-" + secrets.token_hex(4)
    runs = [_submit(f, cfg, preset=preset, overrides=over, tags=[ablation_id, name], group_id=ablation_id,
                    variant=name).run for name, (over, cfg) in plans.items()]
    return AblationStart(ablation_id=ablation_id, runs=runs, poll=hints.for_caller(
        f"report_metrics(run_id='{ablation_id}') returns the comparison table; runs execute one after another "
        "(queue)"))


def list_runs(f: Files, *, state: str | None = None, experiment: str | None = None, tag: str | None = None,
              limit: int = 20) -> RunList:
    views = views_for(f, tick=True)
    return RunList(runs=[_view(s) for s in views.list(state=state, experiment=experiment, tag=tag, limit=limit)],
                   skipped=views.skipped())


def run_status(f: Files, run_id: str, *, log_lines: int = 20) -> RunStatus:
    views = views_for(f, tick=True)
    snap = views.get(run_id)
    nxt = _next_steps(run_id, snap.record.state.value, run_dir=snap.record.run_dir)
    down = snap.provider_down()
    if down is not None:
        nxt = [*nxt, hints.for_caller("fix the channel (provider_down says how), check_channel, then resume_run to "
                                      "use it again", run_id=run_id)]
    provider = (hints.for_caller(f"{down.get('kind')}: {down.get('reason')} — fix: {down.get('fix')}"[:800],
                                 run_id=run_id) if down is not None else None)
    view, servers = _view(snap), snap.rollout_servers()
    servers = None if servers is None else hints.for_caller(servers, run_id=run_id)
    if servers is not None and snap.record.state.value == "running":
        view = view.model_copy(update={"message": servers[:300]})
        nxt = [*nxt, ("start the inference servers at rollout.urls (vapo-mcp serve-model MODEL --port PORT "
                      "--weight-root DIR, or vLLM / SGLang): the run goes on by itself once one answers")]
    status = RunStatus(run=view, log_tail=snap.log_tail(log_lines), provider_down=provider, rollout_servers=servers,
                       next_steps=nxt, skipped=views.skipped())
    return scrub_model(status, known_secrets(f))  # the log and the run files may hold the key or any credential


def _next_steps(run_id: str, state: str, *, run_dir: Path) -> list[str]:
    """What to do next with a run in `state`, as tool calls (tools.hints spells them as `vapo-mcp` commands for
    the CLI)."""
    steps = {"queued": ["wait: it starts when the running run finishes (list_runs shows the queue)"],
             "running": [f"poll run_status('{run_id}') again", f"report_metrics('{run_id}') for curves",
                         f"stop_run('{run_id}') to stop after a checkpoint"],
             "succeeded": [f"report_metrics('{run_id}')", f"diagnose_error(run_id='{run_id}')"],
             "failed": [f"diagnose_error(run_id='{run_id}')", f"resume_run('{run_id}') if a checkpoint exists"],
             "stopped": [f"resume_run('{run_id}') to continue"]}[state]
    return [hints.for_caller(s, run_id=run_id, run_dir=run_dir) for s in steps]


def stop_run(f: Files, run_id: str, *, force: bool = False) -> RunView:
    views = views_for(f)
    return _view(views.of(views.manager.stop(run_id, force=force)))


def resume_run(f: Files, run_id: str, *, trust_run_config: bool = False) -> RunView:
    """Resume a run; its frozen config.json is checked like a new run's first (a run directory is data: a
    planted config may not move the rendezvous, the rollout replicas or the metric tracker, nor — for a remote
    caller — name paths outside the roots). From the CLI the same rules as a local tool call's apply, since
    whoever can write the run directory wrote that file; `trust_run_config` (the CLI's --trust-run-config, never a
    tool call's) skips them for a config the user set up that way on purpose."""
    views = views_for(f)
    frozen = views.get(run_id).rundir.read_json(CONFIG_JSON)
    if frozen is None:
        raise ToolInputError(f"run {run_id}'s config.json is missing or unreadable; it cannot be resumed: "
                             "start_training again")
    try:
        cfg = TrainConfig.model_validate(frozen)
    except ValidationError as e:
        raise ToolInputError(f"run {run_id}'s config.json does not validate ({e.error_count()} error(s), first at "
                             f"{'.'.join(map(str, e.errors()[0]['loc']))}); it cannot be resumed: start_training "
                             "again") from None
    policy = access.current()
    if policy.is_tool_call or not trust_run_config:
        try:
            access.check_config(f, cfg, policy if policy.is_tool_call else access.Policy("stdio"))
        except ToolInputError as e:
            hint = ("" if policy.is_tool_call else f". If you set this yourself (vapo-mcp train --set …) and trust the "
                    f"run directory, resume with: vapo-mcp runs resume {run_id} --trust-run-config")
            raise ToolInputError(f"run {run_id}'s config.json (a run directory is data, checked like a tool call's "
                                 f"config) is refused: {e}{hint}") from None
    return _view(views.of(views.manager.resume(run_id)))
