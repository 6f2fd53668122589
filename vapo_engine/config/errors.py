"""Config problems as data: one `ConfigIssue` per problem (file, key, message, fix), raised together.

Every loader in this package turns what went wrong (syntax, unknown key, bad value, cross-field rule) into
issues that name the file, the dotted key and the fix, so a CLI or a tool can print them without a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vapo_engine.errors import UserError


@dataclass(frozen=True)
class ConfigIssue:
    """One problem (or warning) in a config or settings file."""

    file: str
    key: str
    message: str
    fix: str = ""
    level: Literal["error", "warning"] = "error"
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        key = f" {self.key}:" if self.key else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{where}:{key} {self.message}.{fix}"

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ConfigError(UserError):
    """Raised with every error found in one load (not just the first)."""

    issues: list[ConfigIssue] = field(default_factory=list)

    def __str__(self) -> str:
        if len(self.issues) == 1:  # one line, as a terminal shows it best
            return f"configuration error: {self.issues[0]}"
        head = f"{len(self.issues)} configuration error(s):" if len(self.issues) > 1 else "configuration error:"
        return "\n".join([head, *(f"  - {i}" for i in self.issues)])


class FieldProblem(ValueError):
    """Raised inside a model validator to report a cross-field rule against a specific dotted key."""

    def __init__(self, key: str, message: str, fix: str):
        super().__init__(message)
        self.key, self.message, self.fix = key, message, fix
