"""The producer patches (streams/runtime/faust_patches/producer.py): Faust's producer is
idempotent with ``acks=all`` in every mode. (The metadata it keeps is tested against a real
broker: tests/integration/test_producing.py.)"""

from __future__ import annotations

from faust.transport.drivers import aiokafka as faust_aiokafka


def test_fausts_producer_is_idempotent_with_acks_all() -> None:
    class App:
        in_transaction = False

    class Producer:
        app = App()

    extra = faust_aiokafka.Producer._settings_extra(Producer())  # type: ignore[arg-type]
    assert extra == {"acks": "all", "enable_idempotence": True}


def test_fausts_producer_is_a_tracking_producer() -> None:
    from streams.runtime.faust_patches.producer import TrackingProducer

    assert faust_aiokafka.Producer._producer_type.fget(None) is TrackingProducer  # type: ignore[attr-defined]
