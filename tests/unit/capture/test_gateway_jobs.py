"""The gateway's hot-path records as jobs (plain data built later, in the recorder): a job
builds the records the serving loop used to build itself, and one that cannot be built keeps
its place in the publisher's queue (positions count it: acked mode waits on them)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from streams.capture.chat import llm_step, to_chat_message
from streams.capture.jobs import build_job, job_size, one_step_end, start_job, step_job
from streams.capture.publisher import Publisher, SpillFiles
from streams.models import AgentCall, CallPhase, TrainingMark, utcnow
from streams.topics import Topics

REQUEST = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "where is my order?"},
    ],
}
ANSWER = {
    "id": "chatcmpl-1",
    "model": "m-1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "shipped"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3},
}  # fmt: skip


def test_a_start_job_builds_the_start_with_the_request_messages_and_the_route() -> None:
    now = utcnow()
    mark = TrainingMark(labels=["gold"], marked_at=now)
    decided = AgentCall(
        event_id="c/start", call_id="c", phase=CallPhase.START, event_time=now,
        agent_name="support", mark=mark,
    )  # fmt: skip
    decided.attributes.update({"trajstream.route": "trinity"})
    job = pickle.loads(pickle.dumps(start_job(decided, json.dumps(REQUEST).encode())))
    assert job_size(job) == 1
    (start,) = build_job(job)
    expected = decided.model_copy(
        update={"input_messages": [to_chat_message(m) for m in REQUEST["messages"]]}
    )
    assert start == expected


@pytest.mark.parametrize("one_step", [False, True])
def test_a_step_job_builds_the_step_and_a_one_step_calls_end(one_step: bool) -> None:
    now = utcnow()
    raw, answer = json.dumps(REQUEST).encode(), json.dumps(ANSWER).encode()
    for given in (answer, ANSWER):  # the answer's bytes (JSON route) or dict (a stream's)
        job = step_job("c", raw, given, upstream="trinity", latency_ms=3.5, now=now,
                       one_step=one_step)  # fmt: skip
        job = pickle.loads(pickle.dumps(job))
        step = llm_step("c", REQUEST, ANSWER, upstream="trinity", latency_ms=3.5, now=now)
        assert job_size(job) == (2 if one_step else 1)
        assert build_job(job) == ([step, one_step_end(step)] if one_step else [step])


@pytest.mark.parametrize(
    "marks",
    [
        {"policy_version": 4},
        {"fallback": "connect"},
        {"error_type": "stream_broken", "policy_version": 2},
    ],
)
@pytest.mark.parametrize("one_step", [False, True])
def test_a_step_job_carries_the_policy_version_fallback_and_error_type(
    marks: dict[str, object], one_step: bool
) -> None:
    now = utcnow()
    upstream = "production" if "fallback" in marks else "trinity"
    job = step_job("c", json.dumps(REQUEST).encode(), ANSWER, upstream=upstream, latency_ms=1.0,
                   now=now, one_step=one_step, marks=marks)  # fmt: skip
    step, *end = build_job(pickle.loads(pickle.dumps(job)))
    assert len(end) == job_size(job) - 1 == int(one_step)
    assert {k: getattr(step, k) for k in ("policy_version", "fallback", "error_type")} == {
        "policy_version": None, "fallback": None, "error_type": None, **marks,
    }  # fmt: skip
    assert step.upstream == upstream
    assert step.msg_id == (None if upstream == "production" else "chatcmpl-1")


def test_a_job_that_cannot_be_built_raises() -> None:
    job = step_job("c", json.dumps(REQUEST).encode(), b"[1, 2]", upstream="trinity",
                   latency_ms=1.0, now=utcnow(), one_step=False)  # fmt: skip
    with pytest.raises(ValueError):
        build_job(job)


def test_a_record_that_cannot_be_made_keeps_its_place_also_in_the_spill(tmp_path: Path) -> None:
    publisher = Publisher(
        lambda: None,  # type: ignore[arg-type,return-value]  # never started
        Topics("t", 1),
        spill_dir=tmp_path,
        max_buffered=1,
    )
    now = utcnow()
    raw = json.dumps(REQUEST).encode()
    assert publisher.publish_job("c", step_job("c", raw, ANSWER, upstream="trinity",
                                               latency_ms=1.0, now=now, one_step=False)) == 1
    broken = step_job("c", raw, b"not json", upstream="trinity", latency_ms=1.0, now=now,
                      one_step=True)  # fmt: skip
    assert publisher.publish_job("c", broken) == 3  # both records of the job keep their place
    assert (publisher.buffered, publisher.spill.records) == (1, 2)
    assert publisher.stats.unencodable == 2  # each place counted (the job is built once)
    publisher.spill.close()
    again = SpillFiles(tmp_path)  # the next start counts them too (they are sent as nothing)
    assert again.records == 2
    assert [frame for frame, _ in again.peek(10)] == [("", b"", b""), ("", b"", b"")]
