"""What the worker's watches sample (streams/runtime/live/progress.py): the sample for the
progress watch (``sample_progress``), over a fake Faust consumer: which partitions it asks the
broker about, what it does when it cannot, and the warning a stalled partition logs; and how far
the tables' recovery has read."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, NamedTuple

import pytest

from streams.observe.metrics import Metrics
from streams.runtime.live.progress import sample_progress

EVENTS = "p.agent-events"


class TP(NamedTuple):
    topic: str
    partition: int


class FakeConsumer:
    """Faust's consumer as the sample reads it: assignment(), highwaters() (the broker's end
    offsets) and _committed_offset (a defaultdict of None, as Faust keeps it)."""

    def __init__(self, ends: dict[TP, int], committed: dict[TP, int]) -> None:
        self.ends = ends
        self._committed_offset: defaultdict[TP, int | None] = defaultdict(lambda: None)
        self._committed_offset.update(committed)
        self.asked: list[tuple[TP, ...]] = []
        self.fail: Exception | None = None

    def assignment(self) -> set[TP]:
        return {*self.ends, TP("p.ticks", 0), TP("p.rewarded", 0)}

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        self.asked.append(tps)
        if self.fail is not None:
            raise self.fail
        return {tp: self.ends[tp] for tp in tps}


def recovered_metrics(now: list[float]) -> Metrics:
    m = Metrics(inputs=[EVENTS], clock=lambda: now[0])
    m.watch_progress(stall_s=120)
    m.partitions_assigned([TP(EVENTS, 0), TP(EVENTS, 1)])
    m.tables_recovered()
    return m


async def test_only_the_watched_topic_is_asked_and_a_stalled_partition_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    m = recovered_metrics(now)
    consumer = FakeConsumer({TP(EVENTS, 0): 30, TP(EVENTS, 1): 12}, {TP(EVENTS, 1): 12})
    await sample_progress(consumer, m, EVENTS)
    assert [sorted(asked) for asked in consumer.asked] == [[TP(EVENTS, 0), TP(EVENTS, 1)]]
    assert m.progress.stuck() == {(EVENTS, 0): 0.0}  # never committed, 30 waiting; 1 caught up
    now[0] += 121
    with caplog.at_level(logging.WARNING, logger="trajstream"):
        await sample_progress(consumer, m, EVENTS)
    warned = [r.getMessage() for r in caplog.records if "make no progress" in r.getMessage()]
    assert len(warned) == 1
    assert "p.agent-events[0]: 30 records waiting at offset 0, not moved for 121 s" in warned[0]
    consumer._committed_offset[TP(EVENTS, 0)] = 5  # it moved
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trajstream"):
        await sample_progress(consumer, m, EVENTS)
    assert not caplog.records and m.consumption_stalled() == ""


@pytest.mark.parametrize("why", ["recovering", "broker"])
async def test_nothing_is_judged_while_recovering_or_when_the_broker_cannot_say(why: str) -> None:
    now = [0.0]
    m = recovered_metrics(now)
    consumer = FakeConsumer({TP(EVENTS, 0): 30}, {TP(EVENTS, 0): 3})
    await sample_progress(consumer, m, EVENTS)
    now[0] += 500
    assert m.consumption_stalled() != ""
    if why == "recovering":
        m.partitions_revoked()
        m.partitions_assigned([TP(EVENTS, 0)])  # the tables recover: not judged
    else:
        consumer.fail = TimeoutError("no answer")
    await sample_progress(consumer, m, EVENTS)
    assert m.progress.stuck() == {} and m.consumption_stalled() == ""
    if why == "recovering":
        assert len(consumer.asked) == 1  # not even asked


async def test_a_worker_with_nothing_of_the_topic_asks_nothing() -> None:
    m = recovered_metrics([0.0])
    consumer: Any = FakeConsumer({}, {})
    await sample_progress(consumer, m, EVENTS)
    assert consumer.asked == [] and m.progress.stuck() == {}


def test_the_recovery_position_is_read_from_fausts_recovery():
    import faust

    from streams.runtime.live.progress import recovery_position

    app = faust.App("t-position", broker="kafka://127.0.0.1:1")
    recovery = app.tables.recovery
    assert recovery_position(app) == 0
    recovery.active_offsets[TP("c", 0)] = 41
    recovery.active_offsets[TP("c", 1)] = -1  # nothing read yet
    recovery.standby_offsets[TP("c", 2)] = 9
    assert recovery_position(app) == 50
