"""settings.json: the API channel and the runtime (tool/agent side). docs/design.md §2.

The API key is never stored here: `api.api_key_env` names the environment variable holding it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .base import PathText, Section
from .errors import FieldProblem

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class ApiSettings(Section):
    base_url: str = Field("https://taotoken.net/api", min_length=1)
    """Base URL of the OpenAI-compatible API (scheme required). `TAOTOKEN_BASE_URL` overrides it."""
    api_key_env: str = Field("TAOTOKEN_API_KEY", pattern=_ENV_NAME)
    """Name of the environment variable (or `.env` entry) holding the key; never the key itself."""
    default_headers: dict[str, str] = Field(default_factory=lambda: {"Content-Type": "application/json"})
    """Headers sent with every request (an Authorization header here is refused: use api_key_env)."""

    @field_validator("default_headers")
    @classmethod
    def _no_auth_header(cls, v: dict[str, str]) -> dict[str, str]:
        if any(k.lower() == "authorization" for k in v):
            raise FieldProblem("api.default_headers", "must not contain Authorization (the key would sit "
                               "in a file)", "remove it and export the key in the variable named by "
                               "api.api_key_env")
        return v


class ModelSettings(Section):
    reasoning: str = Field("qwen-32b", min_length=1)
    """Provider model id used for check_channel / smoke_test / API evaluation."""
    fallback: str | None = Field("qwen-14b", min_length=1)
    """Used when the reasoning model is unavailable (404 model-not-found, 5xx or 429 after retries)."""


class RuntimeSettings(Section):
    stream: bool = True
    """Use SSE streaming for chat calls."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the server, CLI and workers (logs go to stderr and the run directory)."""
    log_dir: PathText = Field("./logs/vapo", min_length=1)
    """Where runs live: <log_dir>/<experiment.name>/<run id>/ (relative paths: to settings.json's folder)."""
    max_queued_runs: int = Field(16, ge=1, le=10_000)
    """The most runs that may wait in the queue at once (all servers on this log_dir); beyond it,
    start_training / ablate / resume_run are refused with what to do (wait, or stop queued runs)."""


class ExperimentSettings(Section):
    name: str = Field("vapo-aime-qwen32b", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    """Experiment name; runs are grouped under a folder of this name (letters, digits, . _ -)."""
    tags: list[str] = Field(default_factory=list, max_length=32)
    """Free-form tags stored with every run, to find runs by tag."""
    seed: int = Field(42, ge=0, le=2**31 - 1)
    """Global random seed of runs (torch, python, numpy, data generation)."""


class Settings(Section):
    """The whole settings.json file."""

    provider: str = Field("taotoken", min_length=1)
    """Free-form provider name, shown in reports."""
    api: ApiSettings = Field(default_factory=ApiSettings)
    """The API channel."""
    models: ModelSettings = Field(default_factory=ModelSettings)
    """Provider model ids."""
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    """Streaming, logging and run storage."""
    experiment: ExperimentSettings = Field(default_factory=ExperimentSettings)
    """Experiment name, tags and seed."""
