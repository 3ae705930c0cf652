"""The sink (streams/runtime/live/sink.py) over memory topics: each record to its topic by the
core's name, the ledger's one partition, the HANDLED header on what the next stage passes over,
rejects as dead letters or late events, and the metrics of what was decided."""

from __future__ import annotations

import asyncio
from collections import Counter

from streams.core.effects import Out, Reject, Source
from streams.models import Selection, SelectionDecision, Tick
from streams.observe.metrics import Metrics
from streams.runtime.live.sink import Sink
from tests.unit.factories import at

from .memory import Clock, Sent, sink


def decision(call_id: str) -> SelectionDecision:
    selection = Selection(selected=True, strategy="sampling:1", reason="sampled")
    return SelectionDecision(
        call_id=call_id, selection=selection, closed_reason="ended", decided_at=at(3)
    )


def memory_sink(sent: list[Sent], max_payload: int = 1 << 20) -> tuple[Sink, Metrics, Counter[str]]:
    s = sink(sent, max_payload=max_payload, clock=Clock(at(9)))
    return s, s.metrics, s.stats


def test_each_record_goes_to_its_topic_the_ledgers_to_its_one_partition() -> None:
    sent: list[Sent] = []
    s, metrics, stats = memory_sink(sent)
    out = Out()
    out.emit("trajectories", b"c1", Tick(at=at(1)))
    out.emit("ledger", b"c1", Tick(at=at(2)))
    out.emit("decisions", b"c1", decision("c1"))
    out.stats["assemble.closed"] += 1
    deliveries = asyncio.run(s.dispatch(out, lambda emit: emit.topic == "trajectories"))
    assert len(deliveries) == 3
    assert [(x.topic, x.key, x.partition, x.handled) for x in sent] == [
        ("trajectories", b"c1", None, True),
        ("ledger", b"c1", 0, False),
        ("decisions", b"c1", None, False),
    ]
    assert sent[1].record == Tick(at=at(2))
    assert stats["assemble.closed"] == 1
    labels = {"decision": "selected", "reason": "sampled"}
    assert metrics.registry.get_sample_value("trajstream_decisions_total", labels) == 1


def test_a_reject_is_a_dead_letter_and_a_late_one_a_late_event() -> None:
    sent: list[Sent] = []
    s, metrics, stats = memory_sink(sent, max_payload=4)
    out = Out()
    src = Source("t.agent-events", 2, 40, b"c1", b"0123456789")
    out.reject(Reject("assemble", "bad step", "ValidationError", src))
    out.reject(Reject("late", "call c1 closed", "LateEvent", src))
    asyncio.run(s.dispatch(out))
    dead, late = sent
    assert (dead.topic, late.topic) == ("dead_letters", "late_events")
    letter = dead.record
    assert (letter.stage, letter.source_offset, letter.worker) == ("assemble", 40, "w1")
    assert letter.payload == b"0123" and "cut to 4 of its 10 bytes" in letter.reason
    assert letter.failed_at == at(9)  # the sink's clock
    assert stats["dead_letters.assemble"] == 1
    assert metrics.registry.get_sample_value("trajstream_late_events_total") == 1


def test_a_reject_without_a_source_names_the_dead_letter_topic() -> None:
    sent: list[Sent] = []
    s, _, _ = memory_sink(sent)
    out = Out()
    out.reject(Reject("reward", "abandoned", "RewardError", key=b"c9", payload=b"x"))
    asyncio.run(s.dispatch(out))
    [letter] = [x.record for x in sent]
    assert (letter.source_topic, letter.source_offset, letter.key) == ("t.trajectories", -1, b"c9")


def test_shadowed_calls_lost_are_counted_in_a_metric() -> None:
    sent: list[Sent] = []
    s, metrics, stats = memory_sink(sent)
    out = Out()
    out.stats["trajectories.shadow_lost"] += 2
    asyncio.run(s.dispatch(out))
    assert sent == [] and stats["trajectories.shadow_lost"] == 2
    assert metrics.registry.get_sample_value("trajstream_shadow_calls_lost_total") == 2
