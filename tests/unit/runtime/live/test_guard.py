"""The stage guard (streams/runtime/live/guard.py) over memory: a record opened once at the
edge, a stage run on it with the clock's now, and what it could not handle a dead letter of the
stage, never a crash."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import faust
import pytest

from streams.core.effects import Out
from streams.envelope import Edge, Envelope
from streams.errors import RecordError
from streams.models import Tick
from streams.observe.metrics import Metrics
from streams.runtime.live.channels import source_of
from streams.runtime.live.guard import StageGuard
from tests.unit.factories import at, start

from .memory import CODEC, Clock, Event, Sent, sink

EVENTS = "t.agent-events"


class Echo:
    """A stage that emits what it read, dated by ``now``; raises on a START."""

    def __init__(self) -> None:
        self.seen: list[tuple[Envelope, datetime]] = []

    def on_record(self, env: Envelope, now: datetime) -> Out:
        self.seen.append((env, now))
        if env.open().avro_name == "io.trajstream.AgentCall":
            raise ValueError("no START here")
        out = Out()
        out.emit("decisions", env.key or b"", Tick(at=now))
        return out


def guard(sent: list[Sent]) -> tuple[StageGuard, Metrics]:
    s = sink(sent, clock=Clock(at(7)))
    return StageGuard(Edge(CODEC), s, metrics=s.metrics, stats=s.stats, clock=s.clock), s.metrics


def test_a_stage_decides_on_each_record_with_the_clocks_now() -> None:
    sent: list[Sent] = []
    g, metrics = guard(sent)
    stage = Echo()
    tick = CODEC.encode(Tick(at=at(1)))
    asyncio.run(g.handle("echo", Event("t.ticks", 4, None, tick), stage))
    [(env, now)] = stage.seen
    assert (env.offset, now) == (4, at(7))
    [decided] = sent
    assert decided.topic == "decisions" and decided.record == Tick(at=at(7))
    assert metrics.registry.get_sample_value("trajstream_events_in_total", {"topic": "t.ticks"})


@pytest.mark.parametrize(
    ("value", "reason"),
    [(b"not avro", "not an Avro single-object record"), (CODEC.encode(start("c1")), "no START")],
)
def test_what_a_stage_cannot_handle_is_its_dead_letter(value: bytes, reason: str) -> None:
    sent: list[Sent] = []
    g, _ = guard(sent)
    out = g.step("assemble", source_of(Event(EVENTS, 9, b"c1", value)), Echo())
    assert sent == []  # decided, not sent: a batch sends it later
    [reject] = out.rejects
    assert reject.stage == "assemble" and reason in reject.reason
    assert reject.source is not None and (reject.source.topic, reject.source.offset) == (EVENTS, 9)


def test_an_expected_error_is_a_dead_letter_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[Sent] = []
    g, _ = guard(sent)

    async def run(env: Envelope) -> Out:
        raise RecordError("Trinity rejected the feedback")

    src = source_of(Event(EVENTS, 3, b"c1", b""))
    with caplog.at_level(logging.ERROR, logger="trajstream"):
        asyncio.run(g.run("feedback", src, run, expected=(RecordError,)))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    [letter] = [s.record for s in sent]
    assert letter.stage == "feedback" and letter.reason == "Trinity rejected the feedback"


def test_a_mounted_stage_is_an_agent_of_its_topics() -> None:
    g, _ = guard([])
    app = faust.App("t-guard", broker="kafka://127.0.0.1:9")
    g.mount(app, "echo", (EVENTS, "t.ticks"), Echo(), passes_over=EVENTS)
    assert app.agents["echo"].channel.topics == (EVENTS, "t.ticks")  # type: ignore[attr-defined]
