"""A gateway from the settings (:func:`build_gateway`: bad settings fail here, naming the
setting), and the process that serves until SIGINT or SIGTERM (:func:`run_gateway`).

May import: :mod:`.app`, :mod:`streams.io`, and what :mod:`.app` imports.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer

from ...core.select import Strategy, build_strategy
from ...io import kafka
from ...process import keep_out_of_collections
from ...settings import Settings
from ...topics import Topics
from ..publisher import Publisher
from ..recorder import RecorderProcess, create_topics, kafka_publisher
from ..auth import check_listen
from ..routing import RolloutStrategy, ShareBook, check_routable
from ..routing_follow import ShareFollower
from .app import Gateway
from .upstream import production_url_of

log = logging.getLogger(__name__)


def check_gateway(settings: Settings) -> Strategy:
    """The gateway's start-up checks, which touch nothing outside the process (``trajstream
    gateway`` runs them before anything listens): the production model's URL, an open relay
    (:func:`~streams.capture.auth.check_listen`), the selection strategy the gateway routes by.
    Raises :class:`~streams.errors.ConfigError` naming the setting; returns the strategy."""
    from datetime import timedelta

    production_url_of(settings.gateway)  # before anything else: the one setting it needs
    g = settings.gateway
    check_listen(g.host, bool(g.api_keys), g.allow_anonymous)
    spec = settings.selection.strategy
    strategy = build_strategy(
        spec,
        rate=settings.selection.rate,
        mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
    )
    check_routable(strategy, spec)
    return strategy


def build_gateway(
    settings: Settings, *, producer_factory: Callable[[], AIOKafkaProducer] | None = None
) -> Gateway:
    """A gateway from the settings; bad settings fail here, naming the setting."""
    producer_factory_given = producer_factory
    strategy: Strategy = check_gateway(settings)
    bootstrap = settings.bootstrap_servers
    book = ShareBook() if settings.gateway.rollout.enabled else None
    if book is not None:  # the share the ledger owner decides; the strategy for new agents
        strategy = RolloutStrategy(strategy, book)
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    publisher: Publisher | RecorderProcess
    if producer_factory is None:
        if not bootstrap:
            from ...errors import ConfigError

            raise ConfigError(
                "kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS] is not set"
            )
        if settings.gateway.recorder == "process":  # building, encoding, Kafka: a child's work
            publisher = RecorderProcess(settings)
        else:
            publisher = kafka_publisher(settings)
    else:
        publisher = Publisher(
            producer_factory,
            topics,
            spill_dir=Path(settings.gateway.spill_dir),
            max_buffered=settings.gateway.buffer_records,
            prepare=create_topics(settings, topics) if bootstrap else None,
        )
    gateway = Gateway(settings, strategy, publisher)
    if book is not None and bootstrap:

        async def routing_topic() -> None:  # the follower may start before the workers
            await kafka.create_topics(
                bootstrap,
                {topics.routing: 1},
                settings.kafka.replication_factor,
                security=settings.kafka.security,
                configs=topics.configs(),
                min_insync_replicas=settings.kafka.min_insync,
            )

        gateway.follower = ShareFollower(
            bootstrap, topics.routing, book, security=settings.kafka.security, prepare=routing_topic
        )

    async def preflight() -> None:
        """A cluster that cannot be reached (refused, timed out) is no reason not to serve: the
        records spill until it is back. What retrying cannot fix stops the start: credentials,
        TLS (ConfigError from the check, naming the setting), topics that cannot be made."""
        from ...errors import BrokerError, ConfigError
        from ...io.security import check_kafka

        if not bootstrap:
            return
        try:
            await check_kafka(bootstrap, settings.kafka.security, timeout_s=5.0)
        except BrokerError as exc:
            log.warning("starting without Kafka: %s; serving on and spilling to %s", exc,
                        settings.gateway.spill_dir)  # fmt: skip
            return
        try:
            await publisher.prepare_now()
        except (BrokerError, ConfigError):
            raise
        except Exception as exc:
            raise ConfigError(
                f"the topics of kafka.topic_prefix [TRAJSTREAM_KAFKA__TOPIC_PREFIX] "
                f"{settings.kafka.topic_prefix!r} cannot be used: {type(exc).__name__}: {exc} "
                "(may this principal create and write them? kafka.security.username)"
            ) from exc

    if producer_factory_given is None:
        gateway.preflight = preflight
    otlp = settings.otlp
    gateway.otlp_options = {
        "max_body": otlp.max_body_bytes,
        "publish_timeout": otlp.publish_timeout_s,
        "missing_parent": otlp.missing_parent,
    }
    return gateway


async def run_gateway(settings: Settings, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then publish what is queued and stop."""
    gateway = build_gateway(settings)
    url = await gateway.start(settings.gateway.host, settings.gateway.port)
    keep_out_of_collections()
    if ready is not None:
        ready(url)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        await gateway.stop(settings.gateway.flush_timeout_s)
