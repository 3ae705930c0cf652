"""The feedback port (streams/runtime/live/feedback.py) over memory: the feedback stage's
records fed back under the retry policy, their acknowledgements to the ledger, rejections as
dead letters, and at most ``trinity.max_connections`` requests at once. (The assemble stage's
feedback at once: test_assembling.py; the commit gate: test_checkpoint.py; the Trinity client
with its failures counted: test_trinity.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from streams.errors import TrinityRejected, TrinityUnavailable
from streams.models import FeedbackAck
from streams.observe.metrics import Metrics
from streams.runtime.live.channels import HANDLED_HEADERS
from streams.settings import load_settings
from tests.unit.factories import rewarded

from .memory import CODEC, Event, Worker, stages

REWARDED = "trajstream.rewarded"


class Trinity:
    """/feedback failing with ``errors`` first, then acknowledging; at most how many at once."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.acked: list[list[str]] = []
        self.running = self.most = 0
        self.closed = False

    async def feedback(self, msg_ids: list[str], *args: Any) -> dict[str, Any]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.001)
            if self.errors:
                raise self.errors.pop(0)
            self.acked.append(list(msg_ids))
            return {"status": "success"}
        finally:
            self.running -= 1

    async def aclose(self) -> None:
        self.closed = True


def worker(trinity: Trinity, **trinity_settings: Any) -> Worker:
    settings = load_settings(trinity={"retry_max_age_s": 5, **trinity_settings})
    return stages(settings, trinity=trinity)


def event(call_id: str, offset: int, **kwargs: Any) -> Event:
    record = rewarded(call_id)
    return Event(REWARDED, offset, call_id.encode(), CODEC.encode(record), **kwargs)


def test_a_rewarded_trajectory_is_fed_back_and_acknowledged_to_the_ledger() -> None:
    trinity = Trinity(TrinityUnavailable("503", status=503))  # once, then it answers
    w = worker(trinity)
    asyncio.run(w.stages.feedback.handle(event("c1", 7)))
    assert len(trinity.acked) == 1
    [sent] = w.sent
    assert (sent.topic, sent.partition, sent.handled) == ("ledger", 0, False)
    ack = sent.record
    assert isinstance(ack, FeedbackAck) and ack.attempts == 2
    assert (w.stats["feedback.acked"], w.stats["feedback.retries"]) == (1, 1)


def test_a_record_the_assemble_stage_fed_back_is_passed_over() -> None:
    trinity = Trinity()
    w = worker(trinity)
    asyncio.run(w.stages.feedback.handle(event("c1", 7, headers=HANDLED_HEADERS)))
    assert trinity.acked == [] and w.sent == []
    assert w.stats["feedback.handled_before"] == 1


def test_a_feedback_trinity_rejects_is_a_dead_letter() -> None:
    w = worker(Trinity(TrinityRejected("400 from Trinity: bad", status=400)))
    asyncio.run(w.stages.feedback.handle(event("c1", 7)))
    [letter] = w.records("dead_letters")
    assert letter.stage == "feedback" and letter.error_type == "RecordError"
    assert letter.reason == "Trinity rejected the feedback: 400 from Trinity: bad"
    assert (letter.source_topic, letter.source_offset) == (REWARDED, 7)
    assert w.records("ledger") == []


def test_at_most_max_connections_requests_at_once() -> None:
    trinity = Trinity()
    w = worker(trinity, max_connections=2)

    async def batch() -> None:
        await asyncio.gather(*(w.stages.feedback.handle(event(f"c{i}", i)) for i in range(6)))

    asyncio.run(batch())
    assert len(trinity.acked) == 6 and trinity.most == 2
