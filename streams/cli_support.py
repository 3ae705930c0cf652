"""What every command of the CLI needs before its work: the cluster to use (checked once), the
topics a command writes, and the schema registry's subjects. Below :mod:`streams.cli` and the
command modules (:mod:`streams.commands`, :mod:`streams.policy_cli`), so that they import it and
not each other.

May import: anything in the package but :mod:`streams.cli`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .errors import ConfigError
from .settings import Settings

__all__ = ["ensure_topics", "event_loop", "resolve_bootstrap", "subjects"]


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
