"""Shared base for every config model: frozen, unknown keys forbidden, field docstrings as descriptions."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A table of a config file. Frozen (derive new configs with `model_copy(update=...)`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              validate_default=True)
