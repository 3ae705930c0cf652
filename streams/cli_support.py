"""What every command of the CLI needs: options that set a setting (:func:`setting_option`, read
back by :func:`setting_overrides`), the cluster to use (checked once), the topics a command
writes, and the schema registry's subjects. Below :mod:`streams.cli` and the
command modules (:mod:`streams.commands`, :mod:`streams.policy_cli`), so that they import it and
not each other.

May import: anything in the package but :mod:`streams.cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .errors import ConfigError
from .settings import Settings

__all__ = [
    "ensure_topics",
    "event_loop",
    "resolve_bootstrap",
    "setting_field",
    "setting_option",
    "setting_overrides",
    "subjects",
]

_OVERRIDES = "setting_overrides"  # the parsed arguments' {dest: setting path}


def setting_field(path: str) -> FieldInfo:
    """The field of :class:`~streams.settings.Settings` at a dotted ``path`` (``gateway.port``)."""
    model: type[BaseModel] = Settings
    *sections, name = path.split(".")
    for part in sections:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise KeyError(f"{path}: {part} is not a section")
        model = annotation
    return model.model_fields[name]


def setting_env(path: str) -> str:
    """The environment variable of the setting at ``path``."""
    return "TRAJSTREAM_" + "__".join(part.upper() for part in path.split("."))


def setting_option(
    parser: argparse.ArgumentParser, path: str, flag: str | None = None, *, lead: str = ""
) -> None:
    """Add the option that sets the setting at ``path`` for this run.

    Its type (or choices) and help come from the field of the settings (its description, the
    setting's name and environment variable, its default); ``flag`` is ``--<name>`` unless
    given, ``lead`` goes before the description. The option's default is None (the settings
    decide); :func:`setting_overrides` reads what was given back."""
    info = setting_field(path)
    name = path.rsplit(".", 1)[1]
    kw: dict[str, Any] = {}
    value_type = _value_type(info.annotation)
    if typing.get_origin(value_type) is Literal:
        kw["choices"] = list(typing.get_args(value_type))
    elif value_type in (int, float, Path):
        kw["type"] = value_type
    elif value_type is not str:
        raise TypeError(f"{path}: no command-line option for a {value_type} setting")
    text = "; ".join(t for t in (lead, info.description) if t)
    default = info.get_default(call_default_factory=True)
    where = f"{path} [{setting_env(path)}]" + ("" if default is None else f", default {default}")
    help_text = f"{text} ({where})" if text else where
    action = parser.add_argument(
        flag or "--" + name.replace("_", "-"), default=None, help=help_text.replace("%", "%%"), **kw
    )
    overrides = dict(parser.get_default(_OVERRIDES) or {})
    overrides[action.dest] = path
    parser.set_defaults(**{_OVERRIDES: overrides})


def _value_type(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def setting_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the parsed options of :func:`setting_option` set, nested as
    :func:`~streams.settings.load_settings` takes them (over the environment and the file)."""
    nested: dict[str, Any] = {}
    for dest, path in (getattr(args, _OVERRIDES, None) or {}).items():
        value = getattr(args, dest)
        if value is None:
            continue
        *sections, name = path.split(".")
        node = nested
        for part in sections:
            node = node.setdefault(part, {})
        node[name] = value
    return nested


def resolve_bootstrap(settings: Settings, *, check: bool = True) -> str:
    """The cluster to use: the configured one, else the running local broker.

    ``check`` connects and authenticates once first, so that a wrong password, an untrusted
    certificate or an unreachable cluster stops the command at once with one line naming the
    setting (instead of a client retrying in its logs).
    """
    bootstrap = _bootstrap(settings)
    if check:
        from .io.security import check_kafka

        asyncio.run(check_kafka(bootstrap, settings.kafka.security))
    return bootstrap


def _bootstrap(settings: Settings) -> str:
    if settings.bootstrap_servers:
        return settings.bootstrap_servers
    from .devtools.broker import status

    state = status(settings.cache_dir)
    if state is None:
        raise ConfigError(
            "no Kafka: set kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS or "
            "KAFKA_BOOTSTRAP_SERVERS], or start the local broker with `trajstream broker start`"
        )
    return state.bootstrap_servers


def ensure_topics(settings: Settings, bootstrap: str) -> list[str]:
    from .io.kafka import create_topics
    from .topics import Topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    return asyncio.run(
        create_topics(
            bootstrap,
            topics.all(),
            settings.kafka.replication_factor,
            security=settings.kafka.security,
            configs=topics.configs(),
            min_insync_replicas=settings.kafka.min_insync,
        )
    )


def subjects(settings: Settings, writes: list[str] | None = None) -> Any:
    """With ``kafka.schema_registry`` set: check and register the subjects of the topics this
    command writes, and let it read Confluent's wire format (:mod:`streams.io.registry`)."""
    from .io.registry import connect
    from .topics import Topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    return connect(settings.kafka.schema_registry, topics=topics, writes=writes or [], install=True)


def event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for a long-running command (uvloop where it is installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
