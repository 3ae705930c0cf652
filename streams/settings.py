"""One settings object for the whole application.

Read from, in order of precedence: keyword arguments, environment variables prefixed
``TRAJSTREAM_`` (nested with ``__``, e.g. ``TRAJSTREAM_COMMIT__INTERVAL_S=60``), a config file
(TOML or YAML) named by ``TRAJSTREAM_CONFIG`` or ``--config``, then defaults. The standard
``KAFKA_BOOTSTRAP_SERVERS`` variable is honoured for the broker too. A bad value fails at start
with :class:`~streams.errors.ConfigError` naming the setting and the environment variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import pydantic
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from .errors import ConfigError

__all__ = ["FAUST_ENV_OVERRIDES", "Settings", "check_faust_environment", "load_settings"]

PositiveFloat = pydantic.PositiveFloat
PositiveInt = pydantic.PositiveInt


class _Section(BaseModel):
    """A section of the settings; a misspelt key in a config file is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class KafkaSettings(_Section):
    bootstrap_servers: str | None = Field(
        default=None,
        description="host:port[,host:port]; unset: the local broker started by `trajstream broker start`",
    )
    topic_prefix: str = Field(default="trajstream", pattern=r"^[A-Za-z0-9._-]+$")
    partitions: PositiveInt = Field(default=4, description="partitions of the keyed topics")
    replication_factor: PositiveInt = 1


class TrinitySettings(_Section):
    url: str = Field(default="http://127.0.0.1:8010", pattern=r"^https?://")

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        # aiohttp/httpx would send them, or fail on every request; they do not belong in a
        # setting that is printed by `trajstream settings` and logged
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "a URL with credentials (user:password@) is not accepted; put the credentials "
                "in front of Trinity (a proxy) or remove them"
            )
        return v
    timeout_s: PositiveFloat = 10.0
    max_connections: PositiveInt = 16
    retry_max_age_s: PositiveFloat = Field(
        default=3600.0, description="give up on a feedback (dead letter) after retrying this long"
    )


class SelectionSettings(_Section):
    strategy: str = Field(default="any(marked,sampling)", min_length=1)
    rate: float = Field(default=0.1, ge=0.0, le=1.0)
    mark_ttl_s: PositiveFloat = 60.0


class AssemblySettings(_Section):
    max_steps: PositiveInt = 256
    max_bytes: PositiveInt = 1_000_000
    abandon_after_s: PositiveFloat = 600.0
    late_retention_s: PositiveFloat = Field(
        default=900.0, description="how long a closed call is remembered to record late events"
    )
    tick_s: PositiveFloat = 5.0


class RewardSettings(_Section):
    function: str = Field(default="streams.rewards:success", min_length=1)
    weights: dict[str, float] = Field(default_factory=dict)
    feedback_grace_s: float = Field(default=0.0, ge=0.0)
    score_incomplete: bool = Field(
        default=False, description="also reward trajectories closed as abandoned or oversized"
    )


class WindowSettings(_Section):
    size_s: PositiveInt = Field(default=60, description="tumbling window size, whole seconds")
    grace_s: float = Field(default=10.0, ge=0.0)
    drift_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    drift_history: int = Field(default=5, ge=2)


class CommitSettings(_Section):
    interval_s: PositiveFloat = 300.0
    min_batch: PositiveInt = 1
    commit_empty: bool = False
    tick_s: PositiveFloat = 1.0


class Settings(BaseSettings):
    """Every setting of trajstream, with its environment variable in brackets in the README."""

    model_config = SettingsConfigDict(
        env_prefix="TRAJSTREAM_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    app_id: str = Field(default="trajstream", pattern=r"^[A-Za-z0-9._-]+$")
    cache_dir: Path = Path(".cache/trajstream")
    data_dir: Path = Path(".cache/trajstream/worker")
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    trinity: TrinitySettings = Field(default_factory=TrinitySettings)
    selection: SelectionSettings = Field(default_factory=SelectionSettings)
    assembly: AssemblySettings = Field(default_factory=AssemblySettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    windows: WindowSettings = Field(default_factory=WindowSettings)
    commit: CommitSettings = Field(default_factory=CommitSettings)
    config: Path | None = Field(default=None, validation_alias=AliasChoices("TRAJSTREAM_CONFIG"))

    @field_validator("cache_dir", "data_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("TRAJSTREAM_CONFIG") or _CONFIG_FILE.get("path")
        if path:
            suffix = Path(path).suffix.lower()
            if suffix == ".toml":
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
            elif suffix in (".yaml", ".yml"):
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    @property
    def bootstrap_servers(self) -> str | None:
        return self.kafka.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None


_CONFIG_FILE: dict[str, str] = {}


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings, turning any invalid value into a ConfigError that names it."""
    _CONFIG_FILE.clear()
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        if path.suffix.lower() not in (".toml", ".yaml", ".yml"):
            raise ConfigError(f"config file {path}: use a .toml or .yaml file")
        _CONFIG_FILE["path"] = str(path)
    env_config = os.environ.get("TRAJSTREAM_CONFIG")
    if env_config and not Path(env_config).is_file():
        raise ConfigError(f"TRAJSTREAM_CONFIG={env_config}: no such file")
    if env_config and Path(env_config).suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"TRAJSTREAM_CONFIG={env_config}: use a .toml or .yaml file")
    _check_env_names(os.environ)
    try:
        return Settings(**overrides)
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc


_NOT_SETTINGS = {"TRAJSTREAM_CONFIG", "TRAJSTREAM_VENV"}  # read by load_settings / ./dev


def _check_env_names(environ: Mapping[str, str]) -> None:
    """A misspelt variable would be ignored silently; name it instead."""
    for key in environ:
        if not key.startswith("TRAJSTREAM_") or key in _NOT_SETTINGS:
            continue
        path = key[len("TRAJSTREAM_") :].lower().split("__")
        fields: Mapping[str, Any] | None = Settings.model_fields
        for part in path:
            if fields is None or part not in fields:
                raise ConfigError(f"unknown setting {key}: no such setting {'.'.join(path)}")
            annotation = fields[part].annotation
            nested = isinstance(annotation, type) and issubclass(annotation, BaseModel)
            fields = annotation.model_fields if nested else None


def _describe(exc: pydantic.ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        dotted = ".".join(loc) or "settings"
        env = "TRAJSTREAM_" + "__".join(p.upper() for p in loc)
        value = err.get("input")
        if isinstance(value, str):
            value = re.sub(r"//[^/@\s]*@", "//***@", value)  # never echo URL credentials
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"bad setting {dotted} [{env}]: {err['msg']}{shown}")
    return "; ".join(lines)


# Faust reads these environment variables in faust.App's settings and lets them win over the
# values the worker passes (faust/types/settings/base.py ``_init_settings``): each would
# override a trajstream setting, or a value trajstream's guarantees rest on, without a word.
FAUST_ENV_OVERRIDES: dict[str, str] = {
    "BROKER_URL": "kafka.bootstrap_servers",
    "BROKER_CONSUMER_URL": "kafka.bootstrap_servers",
    "BROKER_PRODUCER_URL": "kafka.bootstrap_servers",
    "TOPIC_PARTITIONS": "kafka.partitions",
    "TOPIC_REPLICATION_FACTOR": "kafka.replication_factor",
    "APP_DATADIR": "data_dir",
    "APP_STORE": "the table store (fixed: memory, tables live in changelog topics)",
    "TABLE_STANDBY_REPLICAS": "standby replicas (fixed: 0)",
    "CONSUMER_AUTO_OFFSET_RESET": "the offset reset (fixed: earliest, nothing is skipped)",
    "PRODUCER_ACKS": "producer acks (fixed: all)",
    "BROKER_COMMIT_INTERVAL": "the offset commit interval (fixed: 1 s)",
    "APP_WEB_ENABLED": "Faust's web server (fixed: off)",
    "PROCESSING_GUARANTEE": "the processing guarantee (fixed: at-least-once)",
    "APP_ENV_PREFIX": "the names of Faust's environment variables",
}


def check_faust_environment(environ: Mapping[str, str]) -> None:
    """Refuse to start a worker when a Faust environment variable would override a setting.

    Refusing (rather than removing the variable) keeps the deployment's environment honest: the
    operator learns which variable to drop. Faust variables that override nothing trajstream
    sets (e.g. ``BROKER_SESSION_TIMEOUT``) are left to Faust.
    """
    found = [name for name in FAUST_ENV_OVERRIDES if environ.get(name) is not None]
    if found:
        details = "; ".join(f"{name} would override {FAUST_ENV_OVERRIDES[name]}" for name in found)
        raise ConfigError(
            f"Faust environment variable set: {details}. Unset it and use the trajstream "
            "setting (TRAJSTREAM_..., see `trajstream settings`)"
        )
