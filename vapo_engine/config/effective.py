"""The effective channel: settings.json + environment + .env + config.toml [api], with provenance.

Precedence (docs/design.md §2.1): `TAOTOKEN_BASE_URL` overrides `api.base_url`; the key comes from the variable that
`api.api_key_env` names, the real environment winning over a `.env` file next to settings.json.
The result records which source won for each value and never shows the key unredacted — nor a key pasted
into `api.api_key_env` (the channel keeps only its display form, see `secrets.safe_env_name`), nor the
credentials of a `user:pass@` base URL in anything meant for display (`public()`, warnings).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dotenv import dotenv_values

from .errors import ConfigIssue
from .secrets import (
    Secret,
    channel_credentials,
    safe_channel_view,
    safe_env_name,
    strip_url_credentials,
)
from .settings_model import Settings
from .train_model import TrainConfig

BASE_URL_ENV = "TAOTOKEN_BASE_URL"


@dataclass(frozen=True, repr=False)
class Channel:
    """Everything needed to call the API, with where each value came from. Its repr is the public view."""

    base_url: str
    """The URL the client calls (credentials included, if the user wrote any): shown only via `public()`."""
    base_url_source: str
    api_key_env: str
    """The variable's name as it may be shown (redacted when a key was pasted in its place)."""
    key: Secret | None
    key_source: str
    headers: dict[str, str] = field(default_factory=dict)
    reasoning_model: str = "qwen-32b"
    fallback_model: str | None = None
    stream: bool = True
    timeout_seconds: float = 120.0
    max_retries: int = 3

    def secrets(self) -> list:
        """Everything of this channel no output may show, for scrubbing by value: the key, the values of
        credential-named default headers (X-Api-Key, …) and the base URL's user:password@."""
        return [*([self.key] if self.key else []), *channel_credentials(self.base_url, self.headers)]

    @property
    def key_redacted(self) -> str:
        return self.key.redacted if self.key else "<not set>"

    def __repr__(self) -> str:
        return f"Channel({self.public()})"

    def public(self) -> dict:
        """A JSON-safe view: the key redacted, base-URL credentials stripped."""
        return safe_channel_view({
            "base_url": self.base_url, "base_url_source": self.base_url_source, "api_key_env": self.api_key_env,
            "key": self.key_redacted, "key_source": self.key_source, "reasoning_model": self.reasoning_model,
            "fallback_model": self.fallback_model, "stream": self.stream, "timeout_seconds": self.timeout_seconds,
            "max_retries": self.max_retries})


def resolve_channel(settings: Settings, config: TrainConfig | None = None, *,
                    env: Mapping[str, str] | None = None, dotenv_path: str | Path | None = None,
                    settings_file: str = "settings.json") -> tuple[Channel, list[ConfigIssue]]:
    """Resolve the effective channel and the warnings a user should see (never errors: the key is only
    needed for API calls)."""
    env = os.environ if env is None else env
    dot = _dotenv(dotenv_path)
    warnings: list[ConfigIssue] = []
    base_url, base_src = settings.api.base_url, f"{settings_file} api.base_url"
    if env.get(BASE_URL_ENV):
        base_url, base_src = env[BASE_URL_ENV], f"environment {BASE_URL_ENV}"
    raw_name = settings.api.api_key_env
    key, key_src = _key(raw_name, env, dot, dotenv_path)
    name = safe_env_name(raw_name)
    key_src = key_src.replace(raw_name, name)
    if key is None and name != raw_name:
        warnings.append(_pasted_key_issue(settings_file, name))
    elif key is None:
        warnings.append(ConfigIssue(settings_file, "api.api_key_env", f"{name} is not set (not in the "
                                    f"environment, not in {dotenv_path or '.env'})", f"export {name}=<your key> "
                                    f"or add {name}=<your key> to .env (keep .env git-ignored); the key is "
                                    "needed only for API calls (check, smoke)", level="warning"))
    if config is not None:
        warnings += _cross_file(settings, config, settings_file)
    timeout, retries = (config.api.timeout_seconds, config.api.max_retries) if config else (120.0, 3)
    ch = Channel(base_url, base_src, name, key, key_src, dict(settings.api.default_headers),
                 settings.models.reasoning, settings.models.fallback, settings.runtime.stream, timeout, retries)
    return ch, warnings


def _pasted_key_issue(settings_file: str, shown: str) -> ConfigIssue:
    """`api.api_key_env` holds what looks like the key itself (an identifier-shaped token passes the name check)."""
    return ConfigIssue(settings_file, "api.api_key_env", f"looks like an API key ({shown}), not the name of an "
                       "environment variable, and no variable of that name is set",
                       "put the key in an environment variable (export TAOTOKEN_API_KEY=<your key>, or a "
                       "git-ignored .env) and set api.api_key_env to that variable's name; rotate the key if "
                       "this file was shared or committed", level="warning")


def _dotenv(path: str | Path | None) -> dict[str, str]:
    if path is None or not Path(path).is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def _key(name: str, env: Mapping[str, str], dot: dict, dotenv_path) -> tuple[Secret | None, str]:
    if env.get(name):
        return Secret(env[name]), f"environment variable {name}"
    if dot.get(name):
        return Secret(dot[name]), f".env file {dotenv_path} ({name})"
    return None, "missing"


def _cross_file(settings: Settings, config: TrainConfig, settings_file: str) -> list[ConfigIssue]:
    out = []
    pairs = (("base_url", settings.api.base_url, config.api.base_url),
             ("api_key_env", settings.api.api_key_env, config.api.api_key_env))
    for key, s_val, c_val in pairs:
        if s_val.rstrip("/") != c_val.rstrip("/"):
            s_val, c_val = _shown(key, s_val), _shown(key, c_val)
            out.append(ConfigIssue("config.toml", f"api.{key}", f"differs from {settings_file} api.{key} "
                                   f"({c_val!r} vs {s_val!r}); {settings_file} is used for every API call, "
                                   "config.toml [api] contributes only timeout_seconds and max_retries",
                                   f"make them equal (set api.{key} = {s_val!r} in config.toml)", level="warning"))
    return out


def _shown(key: str, value: str) -> str:
    """A base URL or variable name as a warning may quote it."""
    return strip_url_credentials(value) if key == "base_url" else safe_env_name(value)


def config_warnings(config: TrainConfig, file: str = "config.toml") -> list[ConfigIssue]:
    """Legal but suspicious settings that a user should know about."""
    v, out = config.vapo, []
    if not v.token_level_loss and v.loss_reduction != "seq_mean_token_mean":
        out.append(ConfigIssue(file, "vapo.loss_reduction", f"token_level_loss = false, so "
                               f"seq_mean_token_mean is used instead of {v.loss_reduction}",
                               "set loss_reduction = \"seq_mean_token_mean\" to make it explicit", level="warning"))
    m = config.model
    if m.temperature == 0:
        out.append(ConfigIssue(file, "model.temperature", "temperature 0 makes training rollouts greedy: every "
                               "sample of a group is the same answer, so there is nothing to compare and "
                               "nothing to explore (log-probs are then taken at T = 1)",
                               "sample at temperature 1.0 (the paper's RL setting) or 0.6-1.0", level="warning"))
    elif m.top_p < 1:
        out.append(ConfigIssue(file, "model.top_p", f"top_p = {m.top_p:g} samples from the top-p nucleus, but the "
                               f"trainer's log-probs are of the full distribution at T = {m.temperature:g} (not "
                               "renormalised over the nucleus), so PPO's ratio and the KL are approximate: "
                               "slightly off-policy wherever the nucleus cut off mass",
                               "set model.top_p = 1.0 for exact on-policy ratios (the paper samples RL rollouts "
                               "at T = 1.0, top_p = 1.0)", level="warning"))
    out += _offpolicy_warnings(config, file)
    if config.decisions.lambda_policy == "length_adaptive":
        lmin = 1 / v.alpha
        out.append(ConfigIssue(file, "vapo.alpha", f"responses of ≤ {lmin:g} tokens get λ_policy = 0 "
                               f"(clamp(1 − 1/(α·l))); at l = {config.model.max_tokens} λ = "
                               f"{max(0.0, 1 - lmin / config.model.max_tokens):.3f}",
                               "choose α ≈ 20 / mean response length (paper 0.05 assumes thousands of tokens)",
                               level="warning"))
    return out


def _offpolicy_warnings(config: TrainConfig, file: str) -> list[ConfigIssue]:
    """Importance sampling against a nucleus-truncated sampler; stale samples without a correction."""
    r, m, out = config.rollout, config.model, []
    if config.decisions.importance_sampling != "off" and m.top_p < 1 and m.temperature > 0:
        out.append(ConfigIssue(file, "rollout.is_mode", f"the importance weights compare the sampler's log-probs, "
                               f"taken within the top_p = {m.top_p:g} nucleus, with the trainer's over the full "
                               "vocabulary, so the cut-off mass reads as a mismatch on every token (weights < 1)",
                               "set model.top_p = 1.0 when sampling with another copy of the policy",
                               level="warning"))
    if r.max_off_policy_steps and config.decisions.importance_sampling == "off":
        out.append(ConfigIssue(file, "rollout.is_mode", f"max_off_policy_steps = {r.max_off_policy_steps} trains "
                               "on samples of older weights, and is_mode = \"off\" leaves that uncorrected",
                               "set rollout.is_mode = \"truncate\" (or \"auto\")", level="warning"))
    return out
