"""Secrets that cannot leak by accident: `Secret` prints redacted, `redact` is the one redaction format.

Format (SPEC §6): prefix + last 4 + length, e.g. ``sk-…c0de (len 51)``. Short values show less.
"""
from __future__ import annotations


def redact(value: str | None) -> str:
    """Redacted form of a secret: first 3 and last 4 characters plus the length (less when short)."""
    if not value:
        return "<empty>"
    n = len(value)
    if n < 8:
        return f"…(len {n})"
    if n < 16:
        return f"…{value[-2:]} (len {n})"
    return f"{value[:3]}…{value[-4:]} (len {n})"


class Secret:
    """A string whose str/repr/format are redacted; call `reveal()` only where the raw value is sent."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    @property
    def redacted(self) -> str:
        return redact(self._value)

    def __repr__(self) -> str:
        return f"Secret({self.redacted})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __len__(self) -> int:
        return len(self._value)
