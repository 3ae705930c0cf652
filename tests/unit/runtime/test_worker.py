"""The worker process's limits: repeated Kafka client messages held back, metadata retries
that back off, a stop that ends."""

from __future__ import annotations

import logging

import pytest

from streams.runtime import worker
from streams.runtime.worker import Repeats, install_log_limits, install_metadata_backoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "aiokafka.client") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


@pytest.mark.parametrize(
    ("messages", "passed"),
    [
        # the same message with other arguments is the same message
        ([("Unable connect to node with id %s", (1,))] * 10, 3),
        # distinct messages each get their burst
        ([("a %s", (1,))] * 5 + [("b %s", (1,))] * 5, 6),
        ([("once", ())], 1),
    ],
)
def test_each_message_passes_a_few_times_a_period(messages, passed) -> None:
    f = Repeats(burst=3, period=60, clock=Clock())
    assert sum(f.filter(_record(m, *a)) for m, a in messages) == passed


def test_one_summary_a_period_says_how_many_were_held_back(caplog) -> None:
    clock = Clock()
    f = Repeats(burst=2, period=60, clock=clock)
    for _ in range(1000):
        f.filter(_record("Unable connect to node with id %s", 1))
    assert f.held == 998
    clock.now = 61
    with caplog.at_level(logging.WARNING, logger="trajstream"):
        assert f.filter(_record("Unable connect to node with id %s", 1))  # a new period
    [summary] = [r.getMessage() for r in caplog.records if r.name == "trajstream"]
    assert "998 repeated messages held back in the last 60s" in summary
    assert "Unable connect to node with id 1" in summary
    assert f.held == 0


def test_every_aiokafka_logger_is_limited() -> None:
    f = install_log_limits()
    for name in ("aiokafka", "aiokafka.conn", "aiokafka.consumer.fetcher"):
        assert f in logging.getLogger(name).filters
    assert install_log_limits() is f  # a second install adds nothing twice
    assert logging.getLogger("aiokafka.conn").filters.count(f) == 1


def test_the_metadata_backoff_patches_the_known_synchronizer_only(monkeypatch) -> None:
    from aiokafka.client import AIOKafkaClient

    original = AIOKafkaClient._md_synchronizer
    try:
        monkeypatch.setattr(worker, "_KNOWN_SYNCHRONIZER", "0" * 64)
        assert not install_metadata_backoff()
        assert AIOKafkaClient._md_synchronizer is original
        monkeypatch.undo()
        assert install_metadata_backoff(), "the installed aiokafka is the one the patch knows"
        assert AIOKafkaClient._md_synchronizer is worker._md_synchronizer
    finally:
        AIOKafkaClient._md_synchronizer = original  # type: ignore[method-assign]


def test_the_worker_has_no_spinner_that_would_put_the_root_logger_at_debug() -> None:
    import faust

    from streams.runtime.worker import BoundedWorker

    app = faust.App("t-spinner", broker="kafka://127.0.0.1:9")
    w = BoundedWorker(app, loglevel="warn", quiet=True, stop_timeout_s=3)
    assert w.spinner is None
    assert w.stop_timeout_s == 3
    root = logging.getLogger()
    level = root.level
    w._setup_spinner_handler(root, logging.WARNING)
    assert root.level == level, "no handler put the root logger at DEBUG"
