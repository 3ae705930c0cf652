"""Fault injection end to end: real broker, real worker processes, the Trinity stand-in misbehaving.

Every test judges the pipeline by what the stand-in received (and by the ``<prefix>.commits``
topic), never by the workers' own account:

- every expected msg_id is rewarded exactly once (it is in exactly one ``FeedbackRecord.applied``
  list), by a /feedback whose body carries the call's msg_ids and the expected reward;
- successful commits come at most once per aligned commit interval, each after the feedback it
  drains, and none drains nothing;
- every rewarded msg_id is eventually drained by a commit (``state.trained``);
- the ``CommitRecord``s on ``<prefix>.commits`` add up to the number of acknowledged calls, one
  record per successful commit, with consecutive sequence numbers.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from typing import Any

import pytest

from streams.capture.sdk import TrajstreamProducer
from streams.devtools.standin import Fault, StandIn
from streams.devtools.traffic import AGENTS, SimulatedCall, simulate_call
from streams.io.trinity import TrinityClient
from streams.models import CallStatus, CommitRecord, DeadLetter, FeedbackAck

from .conftest import read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.long]

AGENT_NAMES = list(AGENTS)


# -- helpers -----------------------------------------------------------------------------------


def _worker_env(standin: StandIn, interval: float, **extra: Any) -> dict[str, Any]:
    return {
        "TRAJSTREAM_TRINITY__URL": standin.url,
        "TRAJSTREAM_SELECTION__STRATEGY": "sampling:1",  # every call is selected
        "TRAJSTREAM_COMMIT__INTERVAL_S": interval,
        "TRAJSTREAM_REWARD__FUNCTION": "streams.rewards:success",
        **extra,
    }


async def _traffic(
    bootstrap: str,
    prefix: str,
    trinity: Any,
    calls: int,
    seed: int,
    *,
    pause: float = 0.0,
    llm_steps: int | None = None,
    start: int = 0,
) -> list[SimulatedCall]:
    """``calls`` simulated agent calls (every 4th fails: reward 0.0, the others 1.0)."""
    rng = random.Random(seed)
    out = []
    async with TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer:
        for i in range(start, start + calls):
            out.append(
                await simulate_call(
                    producer,
                    trinity,
                    rng,
                    agent=AGENT_NAMES[i % len(AGENT_NAMES)],
                    fail=i % 4 == 3,
                    llm_steps=llm_steps,
                )
            )
            if pause:
                await asyncio.sleep(pause)
    return out


async def _live_traffic(
    bootstrap: str, prefix: str, standin: StandIn, calls: int, seed: int, **kw: Any
) -> list[SimulatedCall]:
    async with TrinityClient(standin.url) as trinity:
        return await _traffic(bootstrap, prefix, trinity, calls, seed, **kw)


class _PreServed:
    """Stands in for a TrinityClient's ``chat`` with completions the stand-in served earlier,
    so that events can be published while the stand-in is down."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self._replies = list(replies)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._replies.pop(0)


def _reward(sim: SimulatedCall) -> float:
    return 1.0 if sim.status is CallStatus.OK else 0.0


def _ids(sims: list[SimulatedCall]) -> set[str]:
    return {m for s in sims for m in s.msg_ids}


async def _settle_and_check(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    expected: list[SimulatedCall],
    interval: float,
    *,
    not_applied: set[str] = frozenset(),  # type: ignore[assignment]
    one_answer_per_call: bool = True,
    timeout: float = 120,
) -> list[CommitRecord]:
    """Wait until every expected msg_id was committed, let the pipeline settle, then check."""
    state = standin.state
    want = _ids(expected)
    await wait_for(
        lambda: set(state.trained) >= want,
        timeout=timeout,
        what=f"{len(want)} msg_ids of {len(expected)} calls fed back and committed "
        f"(trained so far: {len(set(state.trained) & want)})",
    )
    # anything the pipeline would still do wrongly (a duplicate commit, an empty commit, a second
    # reward) has a couple of intervals to show up
    await asyncio.sleep(2 * interval + 1)

    # every expected msg_id rewarded exactly once, by a /feedback with its call's ids and reward
    applied_by: dict[str, list[int]] = {}
    for i, record in enumerate(state.feedback):
        for m in record.applied:
            applied_by.setdefault(m, []).append(i)
    twice = {m: ix for m, ix in applied_by.items() if len(ix) != 1}
    assert not twice, f"msg_ids rewarded more than once: {twice}"
    assert set(applied_by) == want, (
        f"missing: {sorted(want - set(applied_by))}, unexpected: {sorted(set(applied_by) - want)}"
    )
    assert not (set(applied_by) & not_applied)
    applied_at: dict[str, float] = {}
    for sim in expected:
        for m in sim.msg_ids:
            record = state.feedback[applied_by[m][0]]
            assert record.status == 200, record
            assert record.body["msg_ids"] == sim.msg_ids, record.body
            assert record.body["reward"] == _reward(sim), (sim, record.body)
            assert record.body["task_id"] == f"task-{sim.call_id}"
            applied_at[m] = record.at
    if one_answer_per_call:
        # no fault here makes a second answered /feedback for a call necessary
        answered = Counter(r.body["msg_ids"][0] for r in state.feedback if r.status == 200)
        assert {k: v for k, v in answered.items() if v != 1} == {}
        assert set(answered) == {s.msg_ids[0] for s in expected}

    # the commits topic: one sent record per successful commit, and all records (a batch that
    # an earlier commit already drained is recorded as not sent) add up to the acknowledged calls
    ok = [c for c in state.commits if c.status == 200]
    assert ok, "no successful commit"
    records = await read_topic(
        kafka_bootstrap,
        f"{prefix}.commits",
        until=lambda rs: sum(r.sent for r in rs) >= len(ok)
        and sum(r.feedback_count for r in rs) >= len(expected),
        timeout=30,
    )
    sent = [r for r in records if r.sent]
    # (received_at, drained by Trinity, feedback_count the ledger recorded, final)
    table = [
        (
            c.received_at.isoformat(),
            c.drained,
            r.feedback_count if r else None,
            r.final if r else None,
        )
        for c, r in zip(ok, [*sent, *[None] * len(ok)], strict=False)
    ]
    assert all(isinstance(r, CommitRecord) for r in records)
    assert sum(r.feedback_count for r in records) == len(expected), table
    assert len(sent) == len(ok), (
        f"{len(sent)} sent CommitRecords on the topic for {len(ok)} commits Trinity applied: "
        f"{table}"
    )
    assert all(r.experiences == 0 for r in records if not r.sent)
    assert [r.commit_seq for r in records] == list(range(len(records)))
    assert all(r.feedback_count > 0 for r in records), table

    # commits: each after the feedback it drains, never empty, once per aligned interval
    for c in ok:
        assert c.drained > 0, (
            f"an empty commit at {c.received_at.isoformat()} (received_at, drained, "
            f"feedback_count, final): {table}"
        )
        assert c.drained == len(c.msg_ids)
        for m in c.msg_ids:
            assert applied_at[m] < c.at, f"commit at {c.at} drained {m} rewarded at {applied_at[m]}"
    assert sorted(state.trained) == sorted(want), "every rewarded msg_id trained exactly once"
    per_interval = Counter(math.floor(c.received_at.timestamp() / interval) for c in ok)
    assert all(n == 1 for n in per_interval.values()), (
        f"two commits in one {interval:g} s interval (received_at, drained, feedback_count, "
        f"final): {table}"
    )
    return records


async def _read_all(bootstrap: str, topic: str, seconds: float = 5.0) -> list[Any]:
    """Everything on ``topic``: reads for ``seconds`` (no early stop on an empty first poll)."""
    return await read_topic(bootstrap, topic, until=lambda rs: False, timeout=seconds)


# -- 1. a burst of 5xx ---------------------------------------------------------------------------


async def test_5xx_burst_is_retried_and_every_feedback_arrives_once(
    kafka_bootstrap, prefix, standin, workers
):
    interval = 2
    workers(**_worker_env(standin, interval))
    await standin.set_fault(Fault(mode="error", status=503, count=15))
    sims = await _live_traffic(kafka_bootstrap, prefix, standin, calls=8, seed=11)

    # retries back off (0.2 s doubling to 10 s): fifteen 503s take about 100 s to get through
    await _settle_and_check(kafka_bootstrap, prefix, standin, sims, interval, timeout=200)
    failed = [r for r in standin.state.feedback if r.status == 503]
    assert len(failed) + sum(c.status == 503 for c in standin.state.commits) == 15
    assert failed, "the 503s were answered to /feedback"
    assert all(not r.applied for r in failed)
    assert await _read_all(kafka_bootstrap, f"{prefix}.dead-letters") == []


# -- 2. Trinity down for a minute ----------------------------------------------------------------


async def test_backlog_waits_while_trinity_is_down_then_drains(
    kafka_bootstrap, prefix, standin, workers
):
    interval = 3
    calls, steps = 10, 2
    workers(**_worker_env(standin, interval))
    # the LLM steps are served before the outage (the agents' own model would be up); the events
    # are published while Trinity is down
    async with TrinityClient(standin.url) as trinity:
        replies = [
            await trinity.chat({"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]})
            for i in range(calls * steps)
        ]
    await standin.set_fault(Fault(mode="down", seconds=60))
    back_at = standin.state.fault.until
    assert back_at is not None and standin.is_down
    sims = await _traffic(
        kafka_bootstrap, prefix, _PreServed(replies), calls, seed=22, llm_steps=steps
    )

    # the calls reach the feedback stage during the outage
    rewarded = await read_topic(
        kafka_bootstrap, f"{prefix}.rewarded", until=lambda rs: len(rs) >= calls, timeout=45
    )
    assert len(rewarded) == calls
    assert standin.is_down, "the outage ended before the pipeline reached the feedback stage"
    assert standin.state.feedback == [] and standin.state.commits == []

    await _settle_and_check(kafka_bootstrap, prefix, standin, sims, interval, timeout=120)
    assert all(r.at >= back_at for r in standin.state.feedback)
    assert await _read_all(kafka_bootstrap, f"{prefix}.dead-letters") == []


# -- 3. answers slower than the client's timeout ------------------------------------------------


async def test_slow_answers_retried_feedback_is_a_harmless_no_op(
    kafka_bootstrap, prefix, standin, workers
):
    interval = 2
    workers(**_worker_env(standin, interval, TRAJSTREAM_TRINITY__TIMEOUT_S=1))
    # three /feedback attempts time out on the client; the stand-in still applies each of them
    # after its 2 s delay, as a real server would
    await standin.set_fault(Fault(mode="slow", delay=2, count=3))
    sims = await _live_traffic(kafka_bootstrap, prefix, standin, calls=6, seed=33)

    await _settle_and_check(
        kafka_bootstrap, prefix, standin, sims, interval, one_answer_per_call=False
    )
    by_call = Counter(r.body["msg_ids"][0] for r in standin.state.feedback)
    retried = [first for first, n in by_call.items() if n > 1]
    assert retried, "no /feedback was retried after a timeout"
    for first in retried:
        records = [r for r in standin.state.feedback if r.body["msg_ids"][0] == first]
        assert all(r.status == 200 for r in records)
        assert sum(bool(r.applied) for r in records) == 1
        assert any(not r.applied for r in records), "the retry applied nothing (a no-op)"
    assert await _read_all(kafka_bootstrap, f"{prefix}.dead-letters") == []


# -- 4. a 4xx is final -----------------------------------------------------------------------------


async def test_a_4xx_goes_to_dead_letters_at_once_and_the_rest_flow(
    kafka_bootstrap, prefix, standin, workers
):
    interval = 2
    workers(**_worker_env(standin, interval))
    await standin.set_fault(Fault(mode="error", status=400, count=1))
    sims = await _live_traffic(kafka_bootstrap, prefix, standin, calls=8, seed=44)

    state = standin.state
    await wait_for(lambda: any(r.status == 400 for r in state.feedback), 60, "the 400")
    (rejected_record,) = [r for r in state.feedback if r.status == 400]
    (rejected,) = [s for s in sims if s.msg_ids == rejected_record.body["msg_ids"]]
    others = [s for s in sims if s is not rejected]

    letters = await read_topic(
        kafka_bootstrap, f"{prefix}.dead-letters", until=lambda rs: len(rs) >= 1, timeout=30
    )
    await _settle_and_check(
        kafka_bootstrap, prefix, standin, others, interval, not_applied=set(rejected.msg_ids)
    )
    # not retried: the rejected trajectory was sent once
    assert [r for r in state.feedback if r.body["msg_ids"] == rejected.msg_ids] == [rejected_record]
    assert not set(rejected.msg_ids) & set(state.trained)

    letters = await _read_all(kafka_bootstrap, f"{prefix}.dead-letters")
    assert len(letters) == 1, letters
    (letter,) = letters
    assert isinstance(letter, DeadLetter)
    assert letter.stage == "feedback"
    assert "400" in letter.reason
    assert "stand-in fault: status 400" in letter.reason, "Trinity's answer is in the reason"
    assert letter.source_topic == f"{prefix}.rewarded"
    assert letter.key == rejected.call_id.encode()


# -- 5. a worker SIGKILLed between feedback and commit --------------------------------------------


async def test_worker_killed_mid_interval_commits_each_interval_once(
    kafka_bootstrap, prefix, standin, workers
):
    interval = 6
    # a killed consumer holds its partitions until its session expires: 10 s, not Faust's 60 s
    worker = workers(**_worker_env(standin, interval), BROKER_SESSION_TIMEOUT=10)
    state = standin.state

    # warm up: one batch fed back and committed, so the worker is known to be running
    sims = await _live_traffic(kafka_bootstrap, prefix, standin, calls=4, seed=55)
    await wait_for(lambda: set(state.trained) >= _ids(sims), 90, "the first batch committed")

    killed = False
    for attempt in range(4):
        # start a batch early in an interval, so that it is acknowledged before the interval ends
        now = time.time()
        await asyncio.sleep(interval - now % interval + 0.3)
        interval_index = math.floor(time.time() / interval)
        commits_before = len(state.commits)
        batch = await _live_traffic(
            kafka_bootstrap, prefix, standin, calls=4, seed=56 + attempt, start=4 + 4 * attempt
        )
        sims += batch
        batch_ids = _ids(batch)
        await wait_for(
            lambda ids=batch_ids, ix=interval_index: (
                {m for r in state.feedback for m in r.applied} >= ids
                or math.floor(time.time() / interval) != ix
            ),
            interval,
            "the batch fed back",
        )
        # the acknowledgements reached the ledger
        acks = await read_topic(
            kafka_bootstrap,
            f"{prefix}.ledger",
            until=lambda rs, ids=batch_ids: (
                {m for r in rs if isinstance(r, FeedbackAck) for m in r.rewarded.msg_ids} >= ids
            ),
            timeout=max(0.5, interval - time.time() % interval - 1.5),
        )
        acked = {m for r in acks if isinstance(r, FeedbackAck) for m in r.rewarded.msg_ids}
        if (
            acked >= batch_ids
            and math.floor(time.time() / interval) == interval_index
            and interval - time.time() % interval > 0.5
            and len(state.commits) == commits_before
        ):
            await asyncio.to_thread(worker.kill)
            killed = True
            break
        # too slow to get in before this interval's end (a loaded machine): try the next one
        want = _ids(sims)
        await wait_for(lambda w=want: set(state.trained) >= w, 60, "the batch committed")
    assert killed, "never managed to kill the worker between feedback and its commit"
    pending = batch_ids - set(state.trained)
    assert pending == batch_ids, "acknowledged feedback, not committed yet, when killed"

    worker.start()
    sims += await _live_traffic(kafka_bootstrap, prefix, standin, calls=4, seed=99, start=40)
    records = await _settle_and_check(
        kafka_bootstrap,
        prefix,
        standin,
        sims,
        interval,
        one_answer_per_call=False,
        timeout=150,
    )
    assert set(state.trained) == _ids(sims)
    assert worker.alive
    assert len(records) >= 2


# -- 6. two workers, one stopped mid-traffic -----------------------------------------------------


def _commit_owner(procs: list[Any]) -> Any | None:
    for w in procs:
        text = w.log.read_text(errors="replace") if w.log.exists() else ""
        if "commit 0:" in text:
            return w
    return None


async def test_two_workers_one_stopped_mid_traffic(kafka_bootstrap, prefix, standin, workers):
    interval = 6
    env = _worker_env(standin, interval)
    pool = [workers(**env), workers(**env)]
    state = standin.state

    traffic = asyncio.create_task(
        _live_traffic(kafka_bootstrap, prefix, standin, calls=40, seed=66, pause=0.4)
    )
    try:
        await wait_for(
            lambda: any(c.status == 200 for c in state.commits) or traffic.done(),
            90,
            "a first commit",
        )
        assert not traffic.done(), "the traffic ended before the first commit"
        # stop the worker that owns the ledger (the one that logged the first commit) while it
        # holds acknowledged feedback that the next commit is to carry
        await wait_for(lambda: _commit_owner(pool) is not None, 10, "a worker to log commit 0")
        victim = _commit_owner(pool)
        first_commit = next(c for c in state.commits if c.status == 200)
        await wait_for(
            lambda: sum(bool(r.applied) and r.at > first_commit.at for r in state.feedback) >= 2,
            interval,
            "feedback after the first commit",
        )
        await asyncio.sleep(0.5)  # its acknowledgement reaches the ledger
        await asyncio.to_thread(victim.stop)
        assert not traffic.done(), "the worker was stopped after the traffic, not during it"
        sims = await traffic
    finally:
        if not traffic.done():
            traffic.cancel()
    survivor = next(w for w in pool if w is not victim)

    await _settle_and_check(
        kafka_bootstrap,
        prefix,
        standin,
        sims,
        interval,
        one_answer_per_call=False,
        timeout=150,
    )
    assert survivor.alive
    assert not victim.alive
    assert await _read_all(kafka_bootstrap, f"{prefix}.dead-letters") == []
