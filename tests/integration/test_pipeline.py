"""End to end on a real broker: SDK -> workers -> Trinity stand-in over real HTTP.

Events produced with the SDK must come out as exactly one /feedback per selected call, with
exactly that call's msg_ids and the expected reward, followed by a commit that carries them.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys

import pytest

from streams.capture.sdk import TrajstreamProducer
from streams.codec import SchemaRegistry
from streams.core.select import SamplingRate, sample_point
from streams.devtools.standin import StandIn
from streams.devtools.traffic import AGENTS, simulate_call
from streams.io.trinity import TrinityClient
from streams.models import CallStatus, CommitRecord, DeadLetter, Trajectory, utcnow

from .conftest import read_topic, wait_for

pytestmark = pytest.mark.integration

RATE = 0.3


async def _traffic(bootstrap: str, prefix: str, standin: StandIn, calls: int, seed: int):
    rng = random.Random(seed)
    agents = list(AGENTS)
    out = []
    async with (
        TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer,
        TrinityClient(standin.url) as trinity,
    ):
        for i in range(calls):
            out.append(
                await simulate_call(
                    producer,
                    trinity,
                    rng,
                    agent=agents[i % len(agents)],
                    mark=i % 7 == 0,
                    fail=i % 5 == 4,
                )
            )
    return out


def _expected(sims):
    sampler = SamplingRate(RATE)
    return {s.call_id: s for s in sims if s.marked or sample_point(s.call_id) < sampler.rate}


async def test_selected_calls_become_feedback_then_a_commit(
    kafka_bootstrap, prefix, standin, workers
):
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY=f"any(marked,sampling:{RATE})",
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
        TRAJSTREAM_REWARD__FUNCTION="streams.rewards:success",
    )
    sims = await _traffic(kafka_bootstrap, prefix, standin, calls=40, seed=7)
    expected = _expected(sims)
    assert 5 < len(expected) < 40  # the sample is neither empty nor everything

    all_expected_ids = {m for s in expected.values() for m in s.msg_ids}
    state = standin.state
    await wait_for(
        lambda: set(state.trained) >= all_expected_ids,
        timeout=120,
        what=f"{len(all_expected_ids)} msg_ids fed back and committed",
    )

    # exactly one /feedback per selected call, with its msg_ids (in step order) and reward
    bodies = [f.body for f in state.feedback if f.status == 200]
    by_first_id = {b["msg_ids"][0]: b for b in bodies}
    assert len(bodies) == len(expected), "one feedback per selected call, none for the others"
    for sim in expected.values():
        body = by_first_id[sim.msg_ids[0]]
        assert body["msg_ids"] == sim.msg_ids
        assert body["reward"] == (1.0 if sim.status is CallStatus.OK else 0.0)
        assert body["task_id"] == (sim.task_id if sim.marked else f"task-{sim.call_id}")
        assert body["run_id"] == 0

    # every msg_id rewarded once, and a commit after the feedback that carried it
    rewarded = [m for f in state.feedback for m in f.applied]
    assert sorted(rewarded) == sorted(all_expected_ids)
    last_feedback = max(f.at for f in state.feedback)
    assert any(c.at >= last_feedback and c.status == 200 for c in state.commits)
    assert all(c.drained > 0 for c in state.commits), "no empty commits"

    # the commits topic records what was committed
    records = await read_topic(
        kafka_bootstrap,
        f"{prefix}.commits",
        until=lambda rs: sum(r.feedback_count for r in rs) >= len(expected),
    )
    assert all(isinstance(r, CommitRecord) for r in records)
    assert sum(r.feedback_count for r in records) == len(expected)
    assert [r.commit_seq for r in records] == list(range(len(records)))

    trajectories = await read_topic(
        kafka_bootstrap, f"{prefix}.trajectories", until=lambda rs: len(rs) >= len(expected)
    )
    assert {t.call_id for t in trajectories if isinstance(t, Trajectory)} == set(expected)

    # one recorded decision per call, selected or not, with its reason
    decisions = await read_topic(
        kafka_bootstrap, f"{prefix}.decisions", until=lambda rs: len(rs) >= len(sims)
    )
    assert sorted(d.call_id for d in decisions) == sorted(s.call_id for s in sims)
    chosen = {d.call_id for d in decisions if d.selection.selected}
    assert chosen == set(expected)
    reasons = {d.selection.reason for d in decisions}
    assert {"marked", "sampled"} <= reasons
    assert all(r in {"marked", "sampled", "unmarked,not-sampled"} for r in reasons), reasons

    audit = subprocess.run(  # noqa: ASYNC221 - the worker runs in another process
        [sys.executable, "-m", "streams.cli", "audit"],
        env={
            **os.environ,
            "TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
            "TRAJSTREAM_KAFKA__TOPIC_PREFIX": prefix,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert audit.returncode == 0, audit.stderr
    assert f"{len(sims)} calls decided" in audit.stdout


async def test_bad_records_go_to_dead_letters_and_the_worker_keeps_going(
    kafka_bootstrap, prefix, standin, workers
):
    from aiokafka import AIOKafkaProducer

    worker = workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=1,
    )
    codec = SchemaRegistry.default()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        # not Avro at all; Avro of a type that does not belong; an event keyed wrongly
        await producer.send_and_wait(f"{prefix}.agent-events", b"{not avro", key=b"k1")
        await producer.send_and_wait(
            f"{prefix}.agent-events",
            codec.encode(
                DeadLetter(
                    reason="x",
                    error_type="x",
                    stage="x",
                    source_topic="x",
                    source_partition=0,
                    source_offset=0,
                    payload=b"",
                    failed_at=utcnow(),
                )
            ),
            key=b"k2",
        )
    finally:
        await producer.stop()
    sims = await _traffic(kafka_bootstrap, prefix, standin, calls=3, seed=1)
    ids = {m for s in sims for m in s.msg_ids}
    await wait_for(lambda: set(standin.state.trained) >= ids, 90, "the valid calls to be committed")
    assert worker.alive

    letters = await read_topic(
        kafka_bootstrap, f"{prefix}.dead-letters", until=lambda rs: len(rs) >= 2
    )
    assert len(letters) == 2
    reasons = sorted(letter.reason for letter in letters)  # type: ignore[attr-defined]
    assert any("single-object" in r for r in reasons)
    assert any("does not belong" in r for r in reasons)
    for letter in letters:
        assert isinstance(letter, DeadLetter)
        assert letter.source_topic == f"{prefix}.agent-events"
        assert letter.source_offset >= 0
        assert letter.stage == "assemble"


async def test_a_graceful_stop_commits_what_was_acknowledged(
    kafka_bootstrap, prefix, standin, workers
):
    worker = workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=3600,  # no interval ends during the test
    )
    sims = await _traffic(kafka_bootstrap, prefix, standin, calls=6, seed=3)
    ids = {m for s in sims for m in s.msg_ids}
    state = standin.state
    await wait_for(
        lambda: {m for f in state.feedback for m in f.applied} >= ids,
        90,
        "every feedback acknowledged",
    )
    assert state.commits == []
    await asyncio.to_thread(worker.stop)  # SIGTERM; the in-process stand-in keeps serving
    assert not worker.alive
    assert [c.status for c in state.commits] == [200]
    assert set(state.trained) == ids
    [record] = await read_topic(kafka_bootstrap, f"{prefix}.commits", until=lambda rs: len(rs) >= 1)
    assert isinstance(record, CommitRecord)
    assert record.final and record.feedback_count == len(sims)
