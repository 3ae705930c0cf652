"""Per-step rewards end to end on a real broker and the stand-in: with ``reward.step_discount``
each trajectory becomes one /feedback per distinct step reward, with exactly its msg_ids, and
the commit records count both the trajectories and the requests."""

from __future__ import annotations

import random

import pytest

from streams.capture.sdk import TrajstreamProducer
from streams.devtools.traffic import simulate_call
from streams.io.trinity import TrinityClient
from streams.models import CommitRecord

from .conftest import read_topic, wait_for

pytestmark = pytest.mark.integration


async def test_a_discounted_reward_sends_one_feedback_per_step_reward(
    kafka_bootstrap, prefix, standin, workers
):
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_REWARD__FUNCTION="streams.rewards:success",
        TRAJSTREAM_REWARD__STEP_DISCOUNT=0.5,
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
    )
    rng = random.Random(12)
    async with (
        TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as producer,
        TrinityClient(standin.url) as trinity,
    ):
        ok = [
            await simulate_call(producer, trinity, rng, agent="support-bot", llm_steps=3)
            for _ in range(3)
        ]
        failed = await simulate_call(
            producer, trinity, rng, agent="support-bot", llm_steps=3, fail=True
        )
    ids = {m for s in [*ok, failed] for m in s.msg_ids}
    state = standin.state
    await wait_for(lambda: set(state.trained) >= ids, 60, "every msg_id fed back and committed")

    bodies = sorted(
        (tuple(f.body["msg_ids"]), f.body["reward"], f.body["task_id"])
        for f in state.feedback
        if f.status == 200
    )
    expected = sorted(
        [
            (tuple(ids_), reward, f"task-{s.call_id}")
            for s in ok
            for ids_, reward in zip([[m] for m in s.msg_ids], [0.25, 0.5, 1.0], strict=True)
        ]
        # a zero reward discounts to zero at every step: one request
        + [(tuple(failed.msg_ids), 0.0, f"task-{failed.call_id}")]
    )
    assert bodies == expected

    records = await read_topic(
        kafka_bootstrap,
        f"{prefix}.commits",
        until=lambda rs: sum(r.feedback_count for r in rs) >= 4,
    )
    commits = [r for r in records if isinstance(r, CommitRecord)]
    assert sum(r.feedback_count for r in commits) == 4  # trajectories, each once
    assert sum(r.feedback_requests or 0 for r in commits) == 10  # 3 x 3 + 1
