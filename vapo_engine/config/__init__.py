"""Configuration: typed models of config.toml and settings.json, their loaders, and the effective channel."""
from .effective import BASE_URL_ENV, Channel, config_warnings, resolve_channel
from .errors import ConfigError, ConfigIssue
from .loader import load_config, load_settings, parse_overrides, preset_names
from .secrets import Secret, redact
from .settings_model import Settings
from .train_model import TrainConfig

__all__ = ["BASE_URL_ENV", "Channel", "ConfigError", "ConfigIssue", "Secret", "Settings", "TrainConfig",
           "config_warnings", "load_config", "load_settings", "parse_overrides", "preset_names", "redact", "resolve_channel"]
