"""Build everything a run needs from its run directory: models, optimizers, schedules, tasks, replay,
random streams and the metrics sink — fresh, or restored from the newest complete checkpoint.

AdamW for actor and critic with warmup-then-constant learning rates, over the parameters that train
(all of them, or the LoRA adapters and value head with [lora]). The reference model is always the *initial*
policy, also on resume (with LoRA: the policy with its adapters switched off). The prompt format
(vapo_engine.prompts: the chat template or plain text) is resolved once, from the loaded tokenizer, for the
training task and for the held-out task (each with its own format instruction as the default system message).
This file does not run the loop.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from vapo_engine.algo.schedule import warmup_constant
from vapo_engine.config import TrainConfig
from vapo_engine.prompts import BUILTIN, PLAIN, PromptFormat, resolve_prompt_format
from vapo_engine.prompts import describe as describe_prompts
from vapo_engine.realmodels.source import packaged_name
from vapo_engine.rollout.episodes import SINGLE_TURN, open_episode
from vapo_engine.rundir import RunDir
from vapo_engine.runs import RunInfo, load_run
from vapo_engine.sinks import NullLogger, open_sinks
from vapo_engine.tasks import Task, get_task
from vapo_engine.tasks.verifiers import Judge, make_judge

from .checkpoint import load_newest
from .distributed import World, init_world
from .fsdp import load_full_optimizer_state, shard_models
from .lora import attach_adapters, describe, trainable
from .memory import apply_memory_options
from .models import ModelLoadError, Models, load_models, pick_autocast, pick_device, resolve_model_path
from .offpolicy import Prefetch
from .parallel import ONE_PROCESS, Parallel
from .provider_samples import NullProviderSamples, ProviderSamples, provider_samples
from .replay import ReplayBuffer
from .sharded_checkpoint import SHARDED, load_sharded
from .update import UpdateSpec


class MetricLog(Protocol):
    """Where the run's metric records go (rank 0's metrics.jsonl, a null sink on the other ranks)."""

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> dict: ...

    def close(self) -> None: ...


@dataclass
class History:
    """What a run remembers besides counters, kept in its checkpoints (the trainer state's `history`)."""

    start_eval: dict[str, float] | None = None
    """The starting policy's evaluation (None until it ran)."""
    last_eval: dict[str, float] = field(default_factory=dict)
    """The latest evaluation (a stopped run's final numbers)."""
    pretrain_ev: list[float] = field(default_factory=list)
    """Held-out explained variance of each value-pretraining round (NaN where undefined)."""
    pretrain_stopped_at: int | None = None
    """The round at which value pretraining plateaued and stopped early (None: it did not)."""

    def state_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_state(cls, st: dict) -> History:
        return cls(start_eval=st.get("start_eval"), last_eval=st.get("last_eval", {}),
                   pretrain_ev=list(st.get("pretrain_ev", [])), pretrain_stopped_at=st.get("pretrain_stopped_at"))


@dataclass
class Trainer:
    cfg: TrainConfig
    info: RunInfo
    models: Models
    opt_actor: torch.optim.Optimizer
    opt_critic: torch.optim.Optimizer | None
    sched_actor: torch.optim.lr_scheduler.LRScheduler
    sched_critic: torch.optim.lr_scheduler.LRScheduler | None
    task: Task
    eval_task: Task
    replay: ReplayBuffer
    spec: UpdateSpec
    parallel: Parallel = ONE_PROCESS
    """How the processes work together (one process, ddp or fsdp)."""
    logger: MetricLog = field(default_factory=NullLogger)
    provider: ProviderSamples | NullProviderSamples = field(default_factory=NullProviderSamples)
    prompts: PromptFormat = PLAIN
    """How the training task's prompts are encoded (rollouts, replayed provider answers)."""
    eval_prompts: PromptFormat = PLAIN
    """How the held-out task's prompts are encoded (the run's evaluation, like `vapo-mcp eval`)."""
    step: int = 0
    """Policy optimizer steps done."""
    pretrain_step: int = 0
    """Value-pretraining rounds done."""
    rollout_step: int = 0
    """Policy rollouts done."""
    history: History = field(default_factory=History)
    prefetch: Prefetch = field(default_factory=Prefetch)
    """The next rollout sampled ahead with rollout.max_off_policy_steps > 0; the stale samples dropped."""
    episode: object = SINGLE_TURN
    """How responses are made (rollout.episode: single turn, or tool calls to MCP servers; rollout/episodes.py)."""
    judge: Judge | None = None
    """What scores the training task's responses (data.verifier; None = the task's default verifier)."""
    eval_judge: Judge | None = None
    """What scores the held-out task's responses."""

    @property
    def world(self) -> World:
        """This process's place in the process group (rank, world size)."""
        return self.parallel.world

    @property
    def uses_critic(self) -> bool:
        return self.models.value is not None

    def state_dict(self) -> dict:
        """What a checkpoint keeps besides the weights (no generator state: every random draw comes from a
        stream seeded by the run seed and the step, trainer/streams.py)."""
        return {"step": self.step, "pretrain_step": self.pretrain_step, "rollout_step": self.rollout_step,
                "opt_actor": self.opt_actor.state_dict(), "sched_actor": self.sched_actor.state_dict(),
                "opt_critic": self.opt_critic.state_dict() if self.opt_critic else None,
                "sched_critic": self.sched_critic.state_dict() if self.sched_critic else None,
                "replay": self.replay.state_dict(), "history": self.history.state_dict(),
                "world_size": self.parallel.size}


def _warmup_constant(opt: torch.optim.Optimizer, warmup: int):
    return torch.optim.lr_scheduler.LambdaLR(opt, warmup_constant(warmup))


def build_trainer(run_dir: Path, *, resume: bool = False, write: bool = True, log=print) -> Trainer:
    """Everything for `run_dir`; with `resume`, weights and state come from the newest checkpoint that
    verifies and loads (damaged ones are named and skipped, see checkpoint.load_newest). A run directory with a
    symlink where the trainer writes (checkpoints/, tb/, …) is refused before anything loads."""
    if write:
        RunDir(run_dir).refuse_linked_subfolders()
    info, cfg = load_run(run_dir)
    world = init_world(cfg.distributed.backend, cfg.training.device)
    parallel = Parallel.of(cfg, world)
    torch.manual_seed(info.seed + 1_000_003 * world.rank)
    base = _base_model(cfg, world, log)
    resolve_prompt_format(cfg.model, base, where=_model_name(cfg, base))  # before any weights load
    device = pick_device(cfg.training.device, world.local_rank)
    data_dir = Path(cfg.data.data_dir)
    tasks = (get_task(cfg.data.train, data_dir), get_task(cfg.eval.benchmark, data_dir))  # not a checkpoint's fault
    judges = [make_judge(cfg.data.verifier, t, cfg.data.verifier_timeout_s) for t in tasks]  # unknown name: now
    episode = open_episode(cfg.rollout, _model_name(cfg, base), log if world.is_main else (lambda m: None))
    try:
        tr = _models_and_state(run_dir, cfg, info, base, device, parallel, tasks, resume, write, log)
    except BaseException:
        episode.close()  # the tool servers started above
        raise
    tr.episode, (tr.judge, tr.eval_judge) = episode, judges
    if episode is not SINGLE_TURN and world.is_main:
        log(f"episodes: {episode.describe()}")
    return tr


def _models_and_state(run_dir: Path, cfg: TrainConfig, info: RunInfo, base: Path, device, parallel: Parallel,
                      tasks: tuple[Task, Task], resume: bool, write: bool, log) -> Trainer:
    """The trainer with its models and state (fresh, or the newest checkpoint that loads), prompts, metric sinks
    and provider samples."""
    world = parallel.world
    make = (lambda ckpt: _assemble(cfg, info, _models(cfg, base, ckpt, device, parallel, info.seed), parallel,
                                   tasks))
    tr = None
    if resume and RunDir(run_dir).checkpoint_dirs():
        ckpt, tr = load_newest(run_dir, lambda c, st: _restore(make(c), st, c), log=log)
        log(f"resumed from {ckpt.name} (policy step {tr.step})")
    tr = tr or make(None)
    if cfg.lora.enabled and world.is_main:
        log(describe(tr.models))
    _set_prompts(tr, base, log if world.is_main else (lambda m: None))
    tr.logger = open_sinks(run_dir, cfg, write=write and world.is_main, log=log)
    tr.provider = provider_samples(cfg, run_dir, tr.models.tokenizer, tr.task, is_main=write and world.is_main,
                                   log=log, prompt_format=tr.prompts)
    return tr


def _set_prompts(tr: Trainer, base: Path, log) -> None:
    """The prompt formats of the training and held-out tasks, from the loaded tokenizer; one log line."""
    tok, model, where = tr.models.tokenizer, tr.cfg.model, _model_name(tr.cfg, base)
    tr.prompts = resolve_prompt_format(model, tok, tr.task, where=where)
    tr.eval_prompts = resolve_prompt_format(model, tok, tr.eval_task, where=where)
    log(f"prompts: {describe_prompts(tr.prompts, model, where)}")


def _model_name(cfg: TrainConfig, base: Path) -> str:
    if not cfg.model.local_path and packaged_name(cfg.model.builtin):
        return cfg.model.builtin  # a real pretrained model shipped by a package (vapo_engine/realmodels)
    return str(base) if cfg.model.local_path else BUILTIN


def _base_model(cfg: TrainConfig, world: World, log) -> Path:
    """The initial weights; rank 0 builds the built-in tiny model once while the others wait, then every
    rank resolves the (now cached) path itself — nothing but tensors crosses ranks."""
    task = cfg.model.builtin or cfg.data.train.strip()  # the built-in model to start from (local_path unset)
    if world.is_main:
        base = resolve_model_path(cfg.model.local_path, log=log, task=task)
    world.barrier()
    return base if world.is_main else resolve_model_path(cfg.model.local_path, log=lambda m: None, task=task)


def _models(cfg: TrainConfig, base: Path, ckpt: Path | None, device, parallel: Parallel, seed: int = 0
            ) -> Models:
    """Fresh: the base model (+ adapters). Resume: the checkpoint's full weights, or with LoRA the base model
    and the checkpoint's adapters (its merged `policy/` is for serving, not for training on). The value model:
    the checkpoint's, or [critic]'s / model.value_path's folder, or the base model scaled by [critic]'s ratios
    (the same weights again on resume with value adapters: `seed` is the run's)."""
    lora, kl = cfg.lora.enabled, cfg.training.kl_coef > 0
    value_adapted = lora and cfg.lora.value_lora
    own = cfg.critic.model_path or cfg.model.value_path
    value_src = (ckpt / "value") if ckpt and not value_adapted else (own or base)
    shape = (cfg.critic.width_ratio, cfg.critic.depth_ratio) if value_src == base else None
    sharded = parallel.sharded
    if sharded and cfg.distributed.cpu_offload and device.type != "cuda":
        raise ModelLoadError("distributed.cpu_offload = true needs CUDA devices (FSDP2 offloads shards from the "
                             f"accelerator to host memory; this run is on {device.type}, where the shards "
                             "already live in host memory): set distributed.cpu_offload = false")
    models = load_models(ckpt / "policy" if ckpt and not lora else base, value_path=value_src,
                         need_value=cfg.decisions.uses_critic, reference_path=base if kl and not lora else None,
                         device=torch.device("cpu") if sharded else device,
                         autocast_dtype=pick_autocast(cfg.model.dtype, device), rollout=cfg.rollout,
                         value_shape=shape, seed=seed, value_head=cfg.critic.head)
    apply_memory_options(models, cfg)  # before sharding / adapters: checkpointing on the HF decoder layers
    if sharded:  # every rank loaded the same files (a fresh value head is zero): shard, shards go to `device`
        models.device = device
        return shard_models(models, parallel.world, cfg.distributed.cpu_offload)
    if lora:
        models = attach_adapters(models, cfg.lora, ckpt=ckpt, kl=kl)
    for m in (models.policy, models.value):
        parallel.world.broadcast_parameters(m)
    return models


def _assemble(cfg: TrainConfig, info: RunInfo, models: Models, parallel: Parallel, tasks: tuple[Task, Task]
              ) -> Trainer:
    t = cfg.training
    opt_a = torch.optim.AdamW(trainable(models.policy), lr=t.learning_rate, weight_decay=t.weight_decay)
    opt_c = torch.optim.AdamW(trainable(models.value), lr=cfg.vapo.value_learning_rate,
                              weight_decay=t.weight_decay) if models.value is not None else None
    return Trainer(cfg, info, models, opt_a, opt_c, sched_actor=_warmup_constant(opt_a, t.warmup_steps),
                   sched_critic=_warmup_constant(opt_c, t.warmup_steps) if opt_c else None, task=tasks[0],
                   eval_task=tasks[1], replay=ReplayBuffer(cfg.vapo.replay_buffer_size),
                   spec=UpdateSpec.of(cfg, parallel.size), parallel=parallel)


def _restore(tr: Trainer, st: dict, ckpt: Path) -> Trainer:
    tr.step, tr.pretrain_step, tr.rollout_step = st["step"], st["pretrain_step"], st["rollout_step"]
    _restore_optimizers(tr, st, ckpt)
    tr.sched_actor.load_state_dict(st["sched_actor"])
    if tr.opt_critic is not None and st.get("sched_critic"):
        tr.sched_critic.load_state_dict(st["sched_critic"])
    tr.replay.load_state_dict(st["replay"])
    tr.history = History.from_state(st.get("history", {}))
    torch.manual_seed(tr.info.seed + 1_000_003 * tr.world.rank + 7919 * tr.step)  # e.g. adapter dropout
    return tr


def _restore_optimizers(tr: Trainer, st: dict, ckpt: Path) -> None:
    """AdamW states from the DCP shards (an fsdp checkpoint, into any world size), or from the trainer state
    (a ddp / one-process checkpoint; into sharded models through their full-state-dict form)."""
    if st.get("optimizers") == SHARDED:
        load_sharded(ckpt, tr.models, tr.opt_actor, tr.opt_critic)
        return
    pairs = [(tr.models.policy, tr.opt_actor, st.get("opt_actor"))]
    if tr.opt_critic is not None:
        pairs.append((tr.models.value, tr.opt_critic, st.get("opt_critic")))
    for model, opt, saved in pairs:
        if saved is None:
            continue
        if tr.parallel.sharded:
            load_full_optimizer_state(model, opt, saved)
        else:
            opt.load_state_dict(saved)
