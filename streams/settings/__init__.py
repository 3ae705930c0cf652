"""One settings object for the whole application.

Read from, in order of precedence: keyword arguments, environment variables prefixed
``TRAJSTREAM_`` (nested with ``__``, e.g. ``TRAJSTREAM_COMMIT__INTERVAL_S=60``), a config file
(TOML or YAML) named by ``--config`` or else ``TRAJSTREAM_CONFIG``, then defaults. The standard
``KAFKA_BOOTSTRAP_SERVERS`` variable is honoured for the broker too. A bad value fails at start
with :class:`~streams.errors.ConfigError` naming the setting and the environment variable.

May import: pydantic, pydantic-settings, :mod:`streams.errors`.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    SecretStr,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from ..errors import ConfigError
from .gateway import (
    BreakerSettings,
    CompareSettings,
    GatewayKey,
    GatewaySettings,
    RolloutSettings,
)
from .kafka import KafkaSecuritySettings, KafkaSettings, SchemaRegistrySettings
from .pipeline import (
    AssemblySettings,
    CommitSettings,
    JudgeSettings,
    RewardSettings,
    SelectionSettings,
    TrinitySettings,
    WindowSettings,
)
from .sections import PositiveFloat, PositiveInt, Section
from .service import ObserveSettings, OtlpSettings

__all__ = [
    "FAUST_ENV_OVERRIDES",
    "RECORD_HEADROOM",
    "AssemblySettings",
    "BreakerSettings",
    "CommitSettings",
    "CompareSettings",
    "GatewayKey",
    "GatewaySettings",
    "JudgeSettings",
    "KafkaSecuritySettings",
    "KafkaSettings",
    "ObserveSettings",
    "OtlpSettings",
    "PositiveFloat",
    "PositiveInt",
    "RewardSettings",
    "RolloutSettings",
    "SchemaRegistrySettings",
    "Section",
    "SelectionSettings",
    "Settings",
    "TrinitySettings",
    "WindowSettings",
    "check_faust_environment",
    "check_together",
    "current_settings",
    "load_settings",
]


class Settings(BaseSettings):
    """Every setting of trajstream, with its environment variable in brackets in docs/reference/settings.md (generated)."""

    model_config = SettingsConfigDict(
        env_prefix="TRAJSTREAM_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    app_id: str = Field(
        default="trajstream",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="the workers' consumer group and the names of their tables",
    )
    cache_dir: Path = Field(
        default=Path(".cache/trajstream"),
        description="the local broker's jars and state (`trajstream broker`)",
    )
    data_dir: Path = Field(
        default=Path(".cache/trajstream/worker"), description="the worker's data directory"
    )
    log_level: Literal["debug", "info", "warn", "error"] = Field(
        default="info", description="the log level of every command (the worker passes it to Faust)"
    )
    stop_timeout_s: PositiveFloat = Field(
        default=15.0,
        description="a worker's graceful stop (final commit, flush) gets this long after "
        "SIGTERM; then it exits at once, committing nothing unconfirmed",
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    trinity: TrinitySettings = Field(default_factory=TrinitySettings)
    selection: SelectionSettings = Field(default_factory=SelectionSettings)
    assembly: AssemblySettings = Field(default_factory=AssemblySettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    windows: WindowSettings = Field(default_factory=WindowSettings)
    commit: CommitSettings = Field(default_factory=CommitSettings)
    compare: CompareSettings = Field(default_factory=CompareSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)

    otlp: OtlpSettings = Field(default_factory=OtlpSettings)

    observe: ObserveSettings = Field(default_factory=ObserveSettings)
    config: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("TRAJSTREAM_CONFIG"),
        description="the settings file read (TOML or YAML); `--config FILE` wins over it",
    )

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
        # --config (load_settings(config)) wins over TRAJSTREAM_CONFIG
        path = _CONFIG_FILE.get("path") or os.environ.get("TRAJSTREAM_CONFIG")
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
    env_config = None if config is not None else os.environ.get("TRAJSTREAM_CONFIG")
    if env_config and not Path(env_config).is_file():
        raise ConfigError(f"TRAJSTREAM_CONFIG={env_config}: no such file")
    if env_config and Path(env_config).suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"TRAJSTREAM_CONFIG={env_config}: use a .toml or .yaml file")
    _check_env_names(os.environ)
    try:
        settings = Settings(**overrides)
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc
    check_together(settings)
    if config is not None:  # the file read, whatever TRAJSTREAM_CONFIG says
        settings.config = Path(config)
    return settings


def current_settings() -> Settings:
    """The settings this process loads now, for a library default left unset (the SDK's topic
    prefix): the file of the last ``load_settings(config)`` (a command's ``--config``), else
    ``TRAJSTREAM_CONFIG``, then the environment and the defaults, checked as at a start."""
    return load_settings(_CONFIG_FILE.get("path"))


RECORD_HEADROOM = 64 * 1024
"""Bytes a record needs beside a call's events: a trajectory's own fields, a dead letter's
reason, Avro framing."""


def check_together(settings: Settings) -> None:
    """Settings that are each valid but not together."""
    room = settings.kafka.max_record_bytes - RECORD_HEADROOM
    if settings.assembly.max_bytes > room:
        raise ConfigError(
            f"bad setting assembly.max_bytes [TRAJSTREAM_ASSEMBLY__MAX_BYTES]: "
            f"{settings.assembly.max_bytes} does not fit in one Kafka record: an open call and "
            f"its trajectory are stored as one, and kafka.max_record_bytes "
            f"[TRAJSTREAM_KAFKA__MAX_RECORD_BYTES] is {settings.kafka.max_record_bytes} "
            f"({RECORD_HEADROOM} of them are kept for the record's own fields); use at most "
            f"{room}, or raise kafka.max_record_bytes (and the brokers' message.max.bytes)"
        )


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
            # an optional section (``SchemaRegistrySettings | None``) nests like a section
            for member in typing.get_args(annotation) or (annotation,):
                if isinstance(member, type) and issubclass(member, BaseModel):
                    annotation = member
            nested = isinstance(annotation, type) and issubclass(annotation, BaseModel)
            fields = annotation.model_fields if nested else None


_SECRET_NAMES = {"password", "ssl_key_password", "headers", "bearer_token"}


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
        if (
            isinstance(value, SecretStr)
            or any(p in _SECRET_NAMES for p in loc)
            or any("api_key" in str(part) for part in loc)
        ):
            shown = ""  # never echo a secret
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"bad setting {dotted} [{env}]: {msg}{shown}")
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
