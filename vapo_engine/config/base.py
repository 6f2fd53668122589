"""Shared base for every config model: frozen, unknown keys forbidden, field docstrings as descriptions."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class Section(BaseModel):
    """A table of a config file. Frozen (derive new configs with `model_copy(update=...)`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              validate_default=True)


def _plain_path(value: str) -> str:
    """A path must be text a file system takes: no NUL, no other control character (a clear error here,
    rather than a bare "embedded null byte" from whichever call first touches it)."""
    bad = next((i for i, c in enumerate(value) if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"contains the control character {value[bad]!r} at position {bad}; a path cannot "
                         "contain a NUL or other control character: remove it")
    return value


PathText = Annotated[str, AfterValidator(_plain_path)]
"""A str field that names a file or folder (or a name resolved to one)."""
