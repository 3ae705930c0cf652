"""What no record from an input topic may do: move a clock, or grow a stored call past one record.

Table-driven over the core's stages (in memory, with a fake clock): ticks only from the ticks
topic and never far ahead of the clock; events and user feedback dated past
``limits.max_future`` are dead letters; an event that would make a call larger than
``limits.max_bytes`` is not added, and the call closes as oversized with what it had, in a
trajectory that fits in one Kafka record.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from streams.core.assembly import Limits
from streams.core.effects import Reject, Source, dead_letter
from streams.errors import ConfigError
from streams.models import ChatMessage, SelectionDecision, Trajectory
from streams.settings import RECORD_HEADROOM, load_settings
from tests.unit.factories import T0, at, end, feedback, start, step

from .harness import CODEC, EDGE, Core, tick_record

FAR = T0 + timedelta(days=365 * 70)


@pytest.mark.parametrize(
    ("topic", "record", "why"),
    [
        ("agent-events", tick_record(FAR), "does not belong on agent-events"),
        ("user-feedback", tick_record(FAR), "does not belong on user-feedback"),
        ("ticks", tick_record(T0 + timedelta(minutes=6)), "ahead of the clock"),
        ("ticks", start("c9"), "does not belong on ticks"),
        ("agent-events", start("c9", event_time=T0 + timedelta(minutes=6)), "ahead of the clock"),
        ("user-feedback", feedback("c9", event_time=FAR), "ahead of the clock"),
    ],
)
def test_no_input_record_moves_a_clock(topic: str, record, why: str) -> None:
    core = Core(limits=Limits(abandon_after=timedelta(seconds=60), max_future=timedelta(minutes=5)))
    core.event(start("open"), T0)
    src = core.source(topic, record)
    stage = core.join if topic == "user-feedback" else core.assembler
    out = stage.on_record(src, T0)
    assert [r.reason for r in out.rejects if why in r.reason], out.rejects
    assert not out.emits, "a rejected record decided nothing"
    # the open call is still open a minute later: nothing moved the clock to its deadline
    assert not [d for d in core.topic("decisions") if d.call_id == "open"]


def test_a_tick_within_the_skew_is_the_clock() -> None:
    core = Core(limits=Limits(abandon_after=timedelta(seconds=60), max_future=timedelta(minutes=5)))
    core.event(start("open"), T0)
    out = core.assembler.on_record(core.source("ticks", tick_record(at(120))), at(100))
    assert not out.rejects
    [decision] = out.records("decisions")
    assert isinstance(decision, SelectionDecision) and decision.closed_reason.startswith(
        "abandoned"
    )


def _big_step(seq: int, size: int):
    return step("big", seq, output_messages=[ChatMessage(role="assistant", content="x" * size)])


def test_an_event_past_max_bytes_closes_the_call_with_what_it_had() -> None:
    limits = Limits(max_bytes=50_000, abandon_after=timedelta(seconds=60))
    core = Core(limits=limits)
    core.event(start("big"), T0)
    core.event(_big_step(0, 30_000), at(1))
    out = core.event(_big_step(1, 30_000), at(2))  # 60 KB: over the limit
    [reject] = out.rejects
    assert "larger than assembly.max_bytes (50000)" in reject.reason
    assert reject.source is not None and reject.source.offset == 3
    [trajectory] = [t for t in out.records("trajectories") if isinstance(t, Trajectory)]
    assert trajectory.closed_reason == "oversized: more than 50000 bytes"
    assert [s.seq for s in trajectory.steps] == [0]
    assert len(CODEC.encode(trajectory)) <= limits.max_bytes + RECORD_HEADROOM
    assert core.pending.get(b"big") is None
    # what comes after is late, not a new call
    late = core.event(end("big", step_count=2), at(3))
    assert [r.stage for r in late.rejects] == ["late"]


def test_an_event_alone_past_max_bytes_is_a_dead_letter_and_nothing_is_stored() -> None:
    core = Core(limits=Limits(max_bytes=10_000, abandon_after=timedelta(seconds=60)))
    out = core.event(_big_step(0, 20_000), T0)
    [reject] = out.rejects
    assert "nothing of the call was kept" in reject.reason
    assert not out.emits and core.pending.get(b"big") is None


def test_a_dead_letter_payload_is_cut_to_fit_a_record() -> None:
    src = Source("t.agent-events", 2, 7, b"k", b"x" * 5000)
    letter = dead_letter(Reject("assemble", "bad", "X", src), T0, "w", "t", max_payload=1000)
    assert letter.payload == b"x" * 1000
    assert "payload cut to 1000 of its 5000 bytes" in letter.reason
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "t.agent-events",
        2,
        7,
    )


def test_max_bytes_must_fit_in_a_record() -> None:
    with pytest.raises(ConfigError, match=r"assembly\.max_bytes .*kafka\.max_record_bytes"):
        load_settings(assembly={"max_bytes": 1_000_000})
    load_settings(assembly={"max_bytes": 1_000_000}, kafka={"max_record_bytes": 2_000_000})
    assert load_settings().assembly.max_bytes + RECORD_HEADROOM <= 1_000_000


@pytest.mark.parametrize("topic", ["agent-events", "user-feedback"])
@pytest.mark.parametrize("key", [b"c9", None])
def test_a_tombstone_on_an_input_topic_is_a_dead_letter_with_its_reason(
    topic: str, key: bytes | None
) -> None:
    # a Kafka client hands a record without a value over as None (and a key may be None too)
    core = Core()
    record = feedback("c9") if topic == "user-feedback" else start("c9")
    read = core.source(topic, record)
    src = Source.read(read.topic, read.partition, read.offset, key, None)
    stage = core.join if topic == "user-feedback" else core.assembler
    out = stage.on_record(EDGE.read(src), T0)
    [reject] = out.rejects
    assert "tombstone" in reject.reason and not out.emits
    letter = dead_letter(reject, T0, "w", "t", max_payload=1000)
    assert letter.payload == b"" and letter.key == key and "tombstone" in letter.reason


def test_a_dead_letter_of_a_value_none_source_does_not_fail() -> None:
    # however a record without a value reaches it, the dead letter is made
    src = Source("t.agent-events", 0, 3, None, None)  # type: ignore[arg-type]
    letter = dead_letter(Reject("assemble", "bad", "X", src), T0, "w", "t", max_payload=10)
    assert letter.payload == b"" and letter.key is None and letter.source_offset == 3
