"""Faust's producer (faust-streaming 0.15.3, ``transport/drivers/aiokafka.py``): idempotent
with ``acks=all`` in every mode, and holding the metadata of the topics it writes only.

May import: faust, aiokafka, the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["TrackingProducer", "install_idempotence", "install_topic_tracking"]

_ORIGINAL = faust_aiokafka.Producer._settings_extra


def _settings_extra(self: Any) -> Mapping[str, Any]:
    return {**_ORIGINAL(self), "acks": "all", "enable_idempotence": True}


def install_idempotence() -> None:
    """Every producer of Faust's aiokafka driver in this process: ``acks=all`` and idempotence
    (installing twice changes nothing).

    Upstream: faust-streaming 0.15.3 turns aiokafka's ``enable_idempotence`` on only for
    ``processing_guarantee="exactly_once"`` (``Producer._settings_extra``), whose open bugs
    rule it out here (faust-streaming/faust#440, #517, #323, #177). Its at-least-once producer
    retries a batch whose acknowledgement was lost, and the broker then writes it twice.
    aiokafka's idempotent producer needs nothing else from Faust (one batch in flight per
    partition, which is how aiokafka sends anyway). Every other producer of the product gets
    the same from :data:`streams.io.kafka.PRODUCER_DEFAULTS`.

    Fails without it: ``tests/unit/runtime/faust_patches/test_producer.py::
    test_fausts_producer_is_idempotent_with_acks_all``.
    """
    faust_aiokafka.Producer._settings_extra = _settings_extra  # type: ignore[method-assign]


class TrackingProducer(AIOKafkaProducer):  # type: ignore[misc]
    """An aiokafka producer that tracks each topic it writes to, so that its cluster metadata
    is theirs, not the whole cluster's.

    aiokafka's client refreshes metadata (every ``metadata_max_age_ms``, after a lost
    connection, when asked) for the topics it tracks, and for every topic of the cluster while
    it tracks none; a producer tracks a topic when it sends to one whose metadata it lacks.
    Faust's producer asks for a refresh after each topic it creates (its changelogs, at start),
    before it has sent anything: that brings every topic of the cluster, so no topic was ever
    missing, none was tracked, and every refresh fetched the whole cluster again. Seen in a
    worker: the metadata of 4,463 partitions, on a broker of 1,524 topics (a shared production
    cluster has tens of thousands). Here each topic Faust creates (:func:`install_topic_tracking`)
    and the first send to each topic track it (aiokafka's public ``client.add_topic``, which
    refreshes in the background; the send does not wait), so an idle worker too holds only its
    own topics' metadata."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tracked: set[str] = set()

    def track(self, topic: str) -> None:
        """Keep ``topic``'s metadata (refreshed with the others) from now on."""
        if topic not in self._tracked:
            self._tracked.add(topic)
            self.client.add_topic(topic)

    async def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        self.track(topic)
        return await super().send(topic, *args, **kwargs)


_CREATE_TOPIC = faust_aiokafka.Producer.create_topic


async def _create_topic(self: Any, topic: str, *args: Any, **kwargs: Any) -> None:
    await _CREATE_TOPIC(self, topic, *args, **kwargs)
    # Faust creates its changelogs (and the topics it declares) at start, then asks for a
    # refresh: tracked, they are what that refresh brings, not the whole cluster
    client = self._ensure_producer()
    if isinstance(client, TrackingProducer):
        client.track(topic)


def install_topic_tracking() -> None:
    """Every producer of Faust's aiokafka driver in this process: a :class:`TrackingProducer`
    (with the settings Faust gives it: idempotent, see above), which tracks each topic Faust
    creates (installing twice changes nothing).

    Upstream: Faust's producer held, and fetched again at every refresh, the metadata of every
    topic of the cluster (:class:`TrackingProducer` says why; no upstream issue).

    Fails without it: ``tests/unit/runtime/faust_patches/test_producer.py::
    test_fausts_producer_is_a_tracking_producer`` and ``tests/integration/test_producing.py::
    test_the_workers_producer_keeps_the_metadata_of_the_topics_it_writes``.
    """
    faust_aiokafka.Producer._producer_type = property(  # type: ignore[method-assign,assignment]
        lambda self: TrackingProducer
    )
    faust_aiokafka.Producer.create_topic = _create_topic  # type: ignore[method-assign]
