"""The preflight doctor: everything that would stop a run at step 1, found before any weights load.

`run_doctor` loads the config (every cross-field problem at once), reads the model's config.json and tokenizer
(never its weights) and reports findings — severity, what, the numbers, the fix — for: batch / mini-batch /
group / world-size divisibility; memory per rank for the strategy and precision (measured bytes per parameter)
against the GPU or RAM; disk for the checkpoints kept; the datasets; the chat template round trip; the thread
budget; the API channel (provider samples), rollout server and MCP tool servers. `vapo-mcp doctor`, the `doctor` tool and
`start_training` (which refuses on an error) call it. Torch is imported only by the checks that need it (a
tokenizer, an architecture without a formula, a rollout backend), never on import.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vapo_engine.config import ConfigError, load_config
from vapo_engine.config.lora_model import peft_missing
from vapo_engine.config.path_fields import freeze_paths
from vapo_engine.errors import UserError
from vapo_engine.realmodels.source import is_gguf_spec

from .findings import DoctorReport, Finding, error, info, warning
from .host import Host
from .inputs import data_findings, model_dir, template_findings
from .network import channel_findings, rollout_findings, tcp_problem
from .resources import disk_findings, memory_findings, thread_findings
from .sizes import read_shape
from .tools import tool_findings

__all__ = ["DoctorReport", "Finding", "Host", "run_doctor", "tcp_problem"]

DIVISIBILITY = ("training.batch_size", "training.mini_batch_size", "training.micro_batch_size", "vapo.group_size",
                "distributed.nproc_per_node")


def run_doctor(config_path: str | Path, *, preset: str | None = None, overrides: list[str] | tuple = (),
               log_dir: str | Path, channel_url: str | None = None, host: Host | None = None,
               admit: Callable[[object], None] | None = None) -> DoctorReport:
    """Every finding for config.toml + preset + overrides. `log_dir`: where the run's checkpoints would go;
    `channel_url`: the API channel's base URL (settings.json); `host`: the machine, probed where unset;
    `admit(config)`: the caller's access check, run on the loaded config before any file it names is read (its
    exception propagates)."""
    try:
        cfg = load_config(config_path, list(overrides), preset=preset, defer_cross_checks=True)
    except ConfigError as e:
        return DoctorReport.of([error("config", f"{i.key or i.file}: {i.message}", i.fix or None, source=i.file)
                                for i in e.issues])
    cfg = freeze_paths(cfg, Path(config_path).resolve().parent)
    if admit is not None:
        admit(cfg)
    found = config_findings(cfg)
    host = (host or Host()).probed(cfg.training.device, Path(log_dir))
    data, task = _guarded("data", lambda: data_findings(cfg), ([], None))
    found += data
    found += _guarded("template", lambda: template_findings(cfg, task))
    found += _guarded("memory", lambda: _sized(cfg, host, Path(log_dir)))
    found += _guarded("threads", lambda: thread_findings(cfg, host))
    found += _guarded("network", lambda: channel_findings(cfg, channel_url) + rollout_findings(cfg))
    found += _guarded("tools", lambda: tool_findings(cfg))
    return DoctorReport.of(found)


def config_findings(cfg) -> list[Finding]:
    """Every cross-field problem of the config (not only the first), the metric sinks and the LoRA package."""
    t, d = cfg.training, cfg.distributed
    numbers = {"batch_size": t.batch_size, "group_size": cfg.vapo.group_size, "mini_batch_size": cfg.mini_batch_size,
               "micro_batch_size": cfg.micro_batch_size, "world_size": d.world_size}
    out = [error("config", f"{p.key}: {p.message}", p.fix, **(numbers if p.key in DIVISIBILITY else {}))
           for p in cfg.cross_check_problems()]
    from vapo_engine.sinks import sink_factories
    try:
        sink_factories(list(cfg.logging.sinks))
    except UserError as e:
        out.append(error("config", str(e), "use the known sink names it lists"))
    if why := peft_missing(cfg.lora):
        out.append(error("config", why, "install peft: pip install 'vapo-mcp[lora]'"))
    if not out:
        out.append(info("config", f"batch {t.batch_size} = {cfg.prompts_per_step} prompts × group "
                        f"{cfg.vapo.group_size}; mini-batch {cfg.mini_batch_size}, micro-batch "
                        f"{cfg.micro_batch_size}, over {d.world_size} rank(s)", **numbers))
    return out


def _sized(cfg, host: Host, log_dir: Path) -> list[Finding]:
    """Memory and disk from the model's parameter counts (config.json of the model directory, no weights)."""
    folder = model_dir(cfg)
    gguf = cfg.model.local_path or cfg.model.builtin
    if folder is None and is_gguf_spec(gguf):
        return [info("memory", f"{gguf} is converted to a Hugging Face folder on first use: memory and disk are "
                     "checked from then on")]
    if cfg.model.local_path and folder is not None and not folder.is_dir():
        what = "is a file, not a model directory" if folder.exists() else "does not exist"
        return [error("memory", f"model.local_path {folder} {what}: the model cannot be loaded",
                      "point model.local_path at a Hugging Face model directory (one with config.json, saved with "
                      "save_pretrained or downloaded with `huggingface-cli download MODEL --local-dir DIR`), or "
                      "remove it to use model.name")]
    if folder is None or not (folder / "config.json").is_file():
        where = f"model.local_path {folder}" if cfg.model.local_path else "the built-in model"
        sev = error if cfg.model.local_path else warning
        return [sev("memory", f"{where} has no config.json: parameters cannot be counted",
                    "point model.local_path at a Hugging Face model directory (save_pretrained)")]
    shape = read_shape(folder)
    return [*memory_findings(cfg, shape, host), *disk_findings(cfg, shape, host, log_dir)]


def _guarded(check: str, fn: Callable, empty=None):
    """`fn()`, or a warning when the check itself could not run (the doctor reports; it never crashes)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        found = [warning(check, f"the {check} check could not run ({type(e).__name__}: {str(e)[:200]})",
                         "run vapo-mcp doctor again; report it if it persists")]
        return (found, None) if isinstance(empty, tuple) else found
