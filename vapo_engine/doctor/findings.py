"""What the preflight doctor reports: findings (severity, check, what, evidence numbers, fix) and the report.

Torch-free. A finding is data an agent or a person can act on: `what` says what is wrong (or what was found),
`evidence` the numbers behind it, `fix` what to change. Errors stop `start_training`; warnings and info do not.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Severity = Literal["error", "warning", "info"]


class Finding(BaseModel):
    """One result of one check."""

    severity: Severity
    check: str = Field(description="which check: config, memory, disk, data, template, threads, network")
    what: str
    evidence: dict[str, float | int | str | bool | None] = Field(default_factory=dict)
    fix: str | None = None

    def line(self) -> str:
        """One line for people: `error [memory] what (k=v, …) — fix: …`."""
        ev = ", ".join(f"{k}={v}" for k, v in self.evidence.items())
        return (f"{self.severity} [{self.check}] {self.what}" + (f" ({ev})" if ev else "")
                + (f" — fix: {self.fix}" if self.fix else ""))


class DoctorReport(BaseModel):
    """Every finding of one preflight, errors first."""

    ok: bool = Field(description="no error: a run of this config may start")
    findings: list[Finding]
    errors: int = 0
    warnings: int = 0

    @classmethod
    def of(cls, findings: list[Finding]) -> DoctorReport:
        order = {"error": 0, "warning": 1, "info": 2}
        found = sorted(findings, key=lambda f: order[f.severity])
        n = {s: sum(f.severity == s for f in found) for s in order}
        return cls(ok=n["error"] == 0, findings=found, errors=n["error"], warnings=n["warning"])

    def text(self) -> str:
        """The report for people: one line per finding, then the verdict."""
        verdict = "ok: no errors" if self.ok else f"{self.errors} error(s): a run of this config would fail"
        return "\n".join([*(f.line() for f in self.findings), f"doctor: {verdict}, {self.warnings} warning(s)"])


def error(check: str, what: str, fix: str | None, **evidence) -> Finding:
    return Finding(severity="error", check=check, what=what, fix=fix, evidence=evidence)


def warning(check: str, what: str, fix: str | None, **evidence) -> Finding:
    return Finding(severity="warning", check=check, what=what, fix=fix, evidence=evidence)


def info(check: str, what: str, **evidence) -> Finding:
    return Finding(severity="info", check=check, what=what, evidence=evidence)
