"""Commit holds on a real broker with the stand-in: a reward drop holds commits (recorded on
``<p>.commits``, no /commit reaches Trinity), the hold survives a worker restart, and an
operator's ``trajstream commits resume`` lets the held feedbacks reach the trainer."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys

import pytest

from streams.capture.sdk import TrajstreamProducer
from streams.core.ledger import is_held
from streams.devtools.standin import StandIn
from streams.devtools.traffic import simulate_call
from streams.io.trinity import TrinityClient
from streams.models import CommitRecord, DriftAlert

from .conftest import read_topic, wait_for

pytestmark = pytest.mark.integration

DROPPING = "support-bot"
OTHER = "code-helper"


async def _calls(bootstrap: str, prefix: str, standin: StandIn, agent: str, n: int, fail: bool):
    """``n`` calls of ``agent``, then wait until Trinity acknowledged their feedback (so that
    each phase's acknowledgements reach the ledger before the next phase's)."""
    rng = random.Random()
    async with (
        TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer,
        TrinityClient(standin.url) as trinity,
    ):
        sims = [
            await simulate_call(producer, trinity, rng, agent=agent, fail=fail, llm_steps=1)
            for _ in range(n)
        ]
    ids = {m for s in sims for m in s.msg_ids}
    state = standin.state
    await wait_for(
        lambda: {m for f in state.feedback for m in f.applied} >= ids, 40, "feedback acked"
    )
    return sims


async def _commits(bootstrap: str, prefix: str, until) -> list[CommitRecord]:  # type: ignore[no-untyped-def]
    records = await read_topic(bootstrap, f"{prefix}.commits", until=until, timeout=40)
    return [r for r in records if isinstance(r, CommitRecord)]


async def test_a_drop_holds_commits_across_a_restart_until_resumed(
    kafka_bootstrap, prefix, standin, workers
):
    settings = dict(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
        TRAJSTREAM_COMMIT__TICK_S=0.25,
        TRAJSTREAM_COMMIT__HOLD_ON_DRIFT="true",
        TRAJSTREAM_WINDOWS__SIZE_S=1,
        TRAJSTREAM_WINDOWS__GRACE_S=0.5,
    )
    worker = workers(**settings)
    state = standin.state

    # two good windows of one agent, then a window of failures (reward 0): a drift alert
    for _ in range(2):
        await _calls(kafka_bootstrap, prefix, standin, DROPPING, 2, fail=False)
        await asyncio.sleep(1.2)
    await _calls(kafka_bootstrap, prefix, standin, DROPPING, 2, fail=True)
    alerts = await read_topic(
        kafka_bootstrap, f"{prefix}.alerts", until=lambda rs: len(rs) >= 1, timeout=40
    )
    assert [(a.agent_name, a.mean) for a in alerts if isinstance(a, DriftAlert)] == [
        (DROPPING, 0.0)
    ]

    # another agent's feedback is acknowledged, but its commit is held
    await asyncio.sleep(1.0)  # any commit already deciding finishes before we count
    sent_before = len(state.commits)
    held_ids = {
        m
        for s in await _calls(kafka_bootstrap, prefix, standin, OTHER, 2, False)
        for m in s.msg_ids
    }
    records = await _commits(kafka_bootstrap, prefix, lambda rs: any(map(is_held, rs)))
    held = [r for r in records if is_held(r)]
    assert held and not held[0].sent and DROPPING in held[0].trinity_response

    # a restart: the hold is ledger state, so the new worker holds too
    await asyncio.to_thread(worker.stop)
    worker = workers(**settings)
    more = await _calls(kafka_bootstrap, prefix, standin, OTHER, 2, fail=False)
    held_ids |= {m for s in more for m in s.msg_ids}
    n_held = len(held)
    records = await _commits(
        kafka_bootstrap,
        prefix,
        lambda rs: (
            sum(map(is_held, rs)) > n_held and sum(r.feedback_count for r in rs if is_held(r)) >= 4
        ),
    )
    assert len(state.commits) == sent_before, "no /commit reached Trinity while held"
    assert not set(state.trained) & held_ids

    # an operator resumes: the next commit is sent and drains what was held
    resume = subprocess.run(  # noqa: ASYNC221 - a CLI in another process
        [
            sys.executable,
            "-m",
            "streams.cli",
            "commits",
            "resume",
            "--agent",
            DROPPING,
            "--by",
            "test",
            "--reason",
            "checked",
        ],
        env={
            **os.environ,
            "TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
            "TRAJSTREAM_KAFKA__TOPIC_PREFIX": prefix,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resume.returncode == 0, resume.stderr
    await _calls(kafka_bootstrap, prefix, standin, OTHER, 1, fail=False)
    await wait_for(lambda: set(state.trained) >= held_ids, 30, "held feedbacks trained")
    records = await _commits(kafka_bootstrap, prefix, lambda rs: bool(rs) and rs[-1].sent)
    assert records[-1].sent and not is_held(records[-1])
    assert [r.commit_seq for r in records] == list(range(len(records)))
