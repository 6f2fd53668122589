"""The preflight doctor as an agent operation: config + preset + overrides checked before a run is paid for
(vapo_engine.doctor: divisibility, memory per rank, disk, datasets, prompt format, threads, channel and
rollout server), under the caller's access policy. No mcp, no torch."""
from __future__ import annotations

from vapo_engine.config import load_settings, resolve_channel
from vapo_engine.doctor import DoctorReport, Host, run_doctor
from vapo_engine.runs import runs_root

from . import access
from .paths import Files, ToolInputError

__all__ = ["DoctorReport", "doctor", "refuse_on_error"]


def doctor(f: Files, *, preset: str | None = None, overrides: list[str] = (), host: Host | None = None) -> DoctorReport:
    """Every finding for this config, each with its fix; `host` replaces probed machine values (tests, planning
    for another machine). Paths a remote caller may not name are refused before anything reads them."""
    policy = access.current()
    preset = access.preset_for(f, preset, policy)
    settings = load_settings(f.settings)
    channel, _ = resolve_channel(settings, dotenv_path=f.dotenv)
    return run_doctor(f.config, preset=preset, overrides=list(overrides), log_dir=runs_root(settings, f.settings),
                      channel_url=channel.base_url, host=host, admit=lambda cfg: access.check_config(f, cfg, policy))


def refuse_on_error(report: DoctorReport) -> list[str]:
    """`ToolInputError` listing every finding when the report has an error; else the warnings, one line each."""
    if not report.ok:
        lines = [f.line() for f in report.findings if f.severity != "info"]
        raise ToolInputError("preflight (doctor) found problems that would stop the run:\n" + "\n".join(lines))
    return [f.line() for f in report.findings if f.severity == "warning"]
