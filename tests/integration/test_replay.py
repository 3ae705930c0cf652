"""``trajstream replay`` on a real broker, against the real stand-in, after a real worker.

Live traffic goes through a worker process; then the replay command, run as a user runs it,
must reproduce exactly the trajectories and rewards the worker produced for the same range,
never touch the worker's consumer group, backfill Trinity once (a re-run sends nothing and says
what it skipped), write exports that validate, and refuse bad input with one line and nothing
written.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from streams.capture.sdk import TrajstreamProducer
from streams.codec import SchemaRegistry
from streams.core.backfill import ack_key, ledger_key, replay_id
from streams.core.ledger import CommitPlan
from streams.core.select import sample_point
from streams.devtools.standin import StandIn
from streams.devtools.traffic import AGENTS, simulate_call
from streams.export.dataset import DpoRow, SftRow
from streams.io.trinity import TrinityClient
from streams.models import (
    ChatMessage,
    CommitRecord,
    FeedbackAck,
    LedgerState,
    RewardedTrajectory,
    TrainingMark,
    Trajectory,
    utcnow,
)
from streams.topics import Topics, create_topics
from tests.unit.export.test_dataset import openai_chat_errors, openai_preference_errors

from .conftest import REPO_ROOT, read_topic

pytestmark = pytest.mark.integration

RATE = 0.4
STRATEGY = f"any(marked,sampling:{RATE})"
REWARD = "streams.rewards:user_rating"  # wants feedback: exercises the grace period too
GRACE = "2"


async def replay(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """Run ``trajstream replay ARGS`` as a process, without blocking the stand-in's loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        "replay",
        *args,
        env=env,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def env(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    return {
        **base,
        "TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "TRAJSTREAM_KAFKA__TOPIC_PREFIX": prefix,
        "TRAJSTREAM_APP_ID": prefix,
        "TRAJSTREAM_DATA_DIR": str(tmp_path / "data"),
        "TRAJSTREAM_REWARD__FEEDBACK_GRACE_S": GRACE,
        "COLUMNS": "250",  # rich: keep the summary's lines whole
    }


async def traffic(
    bootstrap: str, prefix: str, standin: StandIn, calls: int, seed: int = 11
) -> list[Any]:
    rng = random.Random(seed)
    agents = list(AGENTS)
    async with (
        TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer,
        TrinityClient(standin.url) as trinity,
    ):
        return [
            await simulate_call(
                producer,
                trinity,
                rng,
                agent=agents[i % len(agents)],
                mark=i % 6 == 0,
                fail=i % 5 == 4,
                # the marked calls (always selected) are rated 5: "some feedback was attached"
                # below must not depend on which random call ids the sampling picks (rated 3 is
                # 0.5, as no feedback is; 5 of the 15 others are rated 3)
                rating=5.0 if i % 6 == 0 else float(rng.randint(1, 5)) if i % 2 else None,
            )
            for i in range(calls)
        ]


async def group_state(bootstrap: str, group: str) -> tuple[set[str], dict[Any, int]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # the broker is shared: leave out the groups of the other tests running beside this
        # one (their prefixes are t + 10 hex digits); any other new group counts
        groups = {
            g[0]
            for g in await admin.list_consumer_groups()
            if g[0].startswith(group) or not re.match(r"t[0-9a-f]{10}", g[0])
        }
        offsets = await admin.list_consumer_group_offsets(group)
        return groups, {
            tp: o.offset
            for tp, o in offsets.items()
            if tp.topic.endswith((".agent-events", ".user-feedback"))
        }
    finally:
        await admin.close()


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_replay_reproduces_the_live_run_then_backfills_trinity_once(
    kafka_bootstrap, prefix, standin, workers, env, tmp_path
):
    await create_topics(kafka_bootstrap, Topics(prefix, 4).all())
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY=STRATEGY,
        TRAJSTREAM_REWARD__FUNCTION=REWARD,
        TRAJSTREAM_REWARD__FEEDBACK_GRACE_S=GRACE,
        TRAJSTREAM_ASSEMBLY__TICK_S=1,
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
    )
    # the worker is up and keeping up before the range starts: its decisions that depend on
    # processing time (the feedback grace period) then agree with the record timestamps
    await traffic(kafka_bootstrap, prefix, standin, calls=1, seed=1)
    await read_topic(kafka_bootstrap, f"{prefix}.decisions", until=bool, timeout=90)
    since = utcnow().isoformat()
    sims = await traffic(kafka_bootstrap, prefix, standin, calls=30)
    selected = {s.call_id for s in sims if s.marked or sample_point(s.call_id) < RATE}
    assert 4 < len(selected) < 30

    # what the live worker produced in the range
    def in_range(records: list[Any]) -> list[Any]:
        return [r for r in records if r.call_id in {s.call_id for s in sims}]

    live_rewarded = in_range(
        await read_topic(
            kafka_bootstrap,
            f"{prefix}.rewarded",
            timeout=90,
            until=lambda rs: len(in_range(rs)) >= len(selected),
        )
    )
    live_trajectories = in_range(
        await read_topic(
            kafka_bootstrap,
            f"{prefix}.trajectories",
            until=lambda rs: len(in_range(rs)) >= len(selected),
        )
    )
    assert {r.call_id for r in live_rewarded} == selected
    assert any(r.reward not in (0.5,) for r in live_rewarded)  # some feedback was attached
    await asyncio.sleep(2)  # the worker's offset commits settle (broker_commit_interval 1 s)
    groups_before, offsets_before = await group_state(kafka_bootstrap, prefix)

    # 1. the same range, strategy and reward: exactly the live trajectories and rewards
    out = tmp_path / "export"
    code, stdout, stderr = await replay(
        env,
        "--since",
        since,
        "--strategy",
        STRATEGY,
        "--reward",
        REWARD,
        "--to",
        "files",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    rows = jsonl(out / "trajectories.jsonl")
    replayed = {r["trajectory"]["call_id"]: r for r in rows}
    assert set(replayed) == selected
    for t in live_trajectories:
        assert isinstance(t, Trajectory)
        mine = Trajectory.model_validate(replayed[t.call_id]["trajectory"])
        assert mine.model_copy(update={"feedback": []}) == t
        assert mine.msg_ids == t.msg_ids
    for r in live_rewarded:
        assert RewardedTrajectory.model_validate(replayed[r.call_id]["reward"]) == r

    # the exports validate against their formats, and the manifest traces every row
    manifest = json.loads((out / "manifest.json").read_text())
    for row in jsonl(out / "sft.jsonl"):
        SftRow.model_validate(row)
        assert openai_chat_errors(row) == []
    for row in jsonl(out / "dpo.jsonl"):
        DpoRow.model_validate(row)
        assert openai_preference_errors(row) == []
    assert manifest["strategy"] == f"any(marked(ttl=60s),sampling({RATE:g}))"
    assert manifest["reward"] == {"function": REWARD, "version": "1"}
    assert manifest["source"]["since"] == since
    assert set(manifest["source"]["topics"]) == {
        f"{prefix}.agent-events",
        f"{prefix}.user-feedback",
    }
    assert manifest["counts"]["rewarded"] == len(selected)
    assert manifest["export_schema_version"] == 1
    for name, listing in manifest["files"].items():
        assert listing["rows"] == len(jsonl(out / name)) == len(listing["trace"])

    # nothing of the live deployment moved: no new consumer group, the same offsets
    groups_after, offsets_after = await group_state(kafka_bootstrap, prefix)
    assert groups_after == groups_before and offsets_after == offsets_before

    # 2. a dry run reports counts and the reward distribution and sends nothing
    fed = len(standin.state.feedback)
    code, stdout, stderr = await replay(
        env, "--since", since, "--strategy", "sampling:1", "--reward", "streams.rewards:success"
    )
    assert code == 0, stderr
    assert re.search(r"selected[\s│]+30 of 30", stdout), stdout
    assert "dry run" in stdout and "p50" in stdout
    assert len(standin.state.feedback) == fed

    # 3. A/B of two reward functions over the same range
    code, stdout, stderr = await replay(
        env,
        "--since",
        since,
        "--strategy",
        "sampling:1",
        "--reward",
        "streams.rewards:success",
        "--compare-reward",
        REWARD,
    )
    assert code == 0, stderr
    assert "A/B of reward functions" in stdout and "Pearson correlation" in stdout

    # 4. a backfill under another strategy rewards the calls the live one did not select ...
    env_trinity = {**env, "TRAJSTREAM_TRINITY__URL": standin.url}
    commits = len(standin.state.commits)
    backfill = [
        "--since",
        since,
        "--strategy",
        "sampling:1",
        "--reward",
        "streams.rewards:success",
        "--to",
        "trinity",
        "--commit-every",
        "7",
        # the workers' aligned intervals, this long: none ends during the test (the next
        # boundary is in 2033), so every commit but the last is by count
        "--commit-interval",
        "1e9",
    ]
    code, stdout, stderr = await replay(env_trinity, *backfill)
    assert code == 0, stderr
    sent = standin.state.feedback[fed:]
    assert len(sent) == 30 and all(f.status == 200 for f in sent)
    assert {tuple(f.body["msg_ids"]) for f in sent} == {tuple(s.msg_ids) for s in sims}
    # a commit after 7, 14, 21, 28 acknowledged, and the last 2 at the end; one whose feedback
    # the live worker had rewarded already (Trinity rewards a msg_id once) has nothing ready
    # at Trinity and is recorded, not sent: an empty commit would still advance the step
    ledger = await read_topic(
        kafka_bootstrap, f"{prefix}.replayed", until=lambda rs: _commit_records(rs) >= 5
    )
    acks = [r for r in ledger if isinstance(r, FeedbackAck)]
    assert len(acks) == 30
    records = [r for r in ledger if isinstance(r, CommitRecord)]
    assert [r.feedback_count for r in records] == [7, 7, 7, 7, 2]
    n_sent = sum(r.sent for r in records)
    assert n_sent >= 1 and all(r.experiences == 0 for r in records if not r.sent)
    assert all(r.experiences is not None for r in records[1:])
    new_commits = standin.state.commits[commits:]
    assert len(new_commits) == n_sent
    assert all(c.status == 200 for c in new_commits)
    assert set(standin.state.trained) >= {m for s in sims for m in s.msg_ids}
    assert re.search(rf"sent 30 feedback\(s\), 30 acknowledged, {n_sent} commit\(s\)", stdout), (
        stdout
    )
    commits += n_sent

    # ... and a re-run sends nothing twice, and says what it skipped
    code, stdout, stderr = await replay(env_trinity, *backfill)
    assert code == 0, stderr
    assert len(standin.state.feedback) == fed + 30
    assert len(standin.state.commits) == commits
    assert "skipped 30 trajectories already acknowledged" in stdout

    # a run interrupted between an acknowledgement and its commit: the next run commits it
    rid = replay_id(prefix, "sampling(1)", "streams.rewards:success", "1")
    codec = SchemaRegistry.default()
    async with TrinityClient(standin.url) as trinity:
        reply = await trinity.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        await trinity.feedback([reply["id"]], 1.0, "task-interrupted", 0)  # ready at Trinity
    interrupted = acks[0].model_copy(
        update={
            "rewarded": acks[0].rewarded.model_copy(
                update={"trajectory_id": "interrupted", "msg_ids": [reply["id"]]}
            )
        }
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            f"{prefix}.replayed", key=ack_key(rid, "interrupted"), value=codec.encode(interrupted)
        )
    finally:
        await producer.stop()
    code, stdout, stderr = await replay(env_trinity, *backfill)
    assert code == 0, stderr
    assert len(standin.state.feedback) == fed + 31
    assert len(standin.state.commits) == commits + 1
    assert reply["id"] in standin.state.trained
    assert "recovered" in stdout

    # ... but when Trinity has nothing ready for it (an earlier commit drained it), nothing is
    # sent: an empty commit would still advance the explore step
    drained = acks[1].model_copy(
        update={"rewarded": acks[1].rewarded.model_copy(update={"trajectory_id": "drained"})}
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            f"{prefix}.replayed", key=ack_key(rid, "drained"), value=codec.encode(drained)
        )
    finally:
        await producer.stop()
    code, stdout, stderr = await replay(env_trinity, *backfill)
    assert code == 0, stderr
    assert len(standin.state.commits) == commits + 1
    ledger = await read_topic(
        kafka_bootstrap, f"{prefix}.replayed", until=lambda rs: _commit_records(rs) >= 7
    )
    records = [r for r in ledger if isinstance(r, CommitRecord)]
    assert (records[-1].sent, records[-1].experiences) == (False, 0)
    assert records[-2].sent and records[-2].experiences == 1  # the interrupted run's one

    # a run killed between writing its commit ahead and recording it: resolved from the
    # explore step (advanced: recorded, not sent again)
    [state] = [r for r in ledger if isinstance(r, LedgerState)][-1:]
    plan = CommitPlan(
        seq=state.next_seq,
        interval_start=utcnow(),
        interval_end=utcnow(),
        count=1,
        reward_sum=1.0,
        reward_min=1.0,
        reward_max=1.0,
        step_before=standin.state.explore_step - 1,
        ready_before=state.ready_at_last_commit,
    )
    crashed = state.model_copy(update={"pending_commit": plan})
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            f"{prefix}.replayed", key=ledger_key(rid), value=codec.encode(crashed)
        )
    finally:
        await producer.stop()
    code, stdout, stderr = await replay(env_trinity, *backfill)
    assert code == 0, stderr
    assert len(standin.state.commits) == commits + 1  # not sent again
    ledger = await read_topic(
        kafka_bootstrap, f"{prefix}.replayed", until=lambda rs: _commit_records(rs) >= 8
    )
    last = [r for r in ledger if isinstance(r, CommitRecord)][-1]
    assert "recovered" in last.trinity_response and last.commit_seq == plan.seq


def _commit_records(records: list[Any]) -> int:
    return sum(isinstance(r, CommitRecord) for r in records)


async def test_redacted_export_and_bad_input(kafka_bootstrap, prefix, env, tmp_path):
    await create_topics(kafka_bootstrap, Topics(prefix, 4).all())
    async with TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as producer:
        for i in range(2):
            async with producer.call(
                agent_name="support",
                input_messages=[
                    ChatMessage(
                        role="user",
                        content="I'm bob@example.com, call me "
                        "at +44 20 7946 0958. Where is my order?",
                    )
                ],
                mark=TrainingMark(task_id=f"bob@example.com-{i}", marked_at=utcnow()),
            ) as call:
                await call.completion(
                    response_id=f"chatcmpl-{prefix}-{i}",
                    output_messages=[ChatMessage(role="assistant", content="It shipped.")],
                )
                call.output = "It shipped; my key is sk-abcdefghijklmnopqrstuvwx"

    # a redacted export: nothing personal leaves, and the manifest counts what was replaced
    out = tmp_path / "redacted"
    code, _, stderr = await replay(
        env,
        "--strategy",
        "marked",
        "--reward",
        "streams.rewards:success",
        "--to",
        "files",
        "--out",
        str(out),
        "--redact",
        "--redact-pattern",
        r"order\b",
    )
    assert code == 0, stderr
    text = "".join((out / n).read_text() for n in ("trajectories.jsonl", "sft.jsonl"))
    assert "bob@example.com" not in text and "7946" not in text and "sk-abc" not in text
    assert "[EMAIL]" in text and "[PHONE]" in text and "[SECRET]" in text
    assert "[REDACTED]" in text
    counts = json.loads((out / "manifest.json").read_text())["redaction"]["counts"]
    assert counts["email"] >= 4 and counts["phone"] >= 2 and counts["secret"] >= 2
    assert counts["custom"] >= 2
    assert len(jsonl(out / "sft.jsonl")) == 1  # two identical conversations: one row
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["sft.jsonl"]["duplicates_removed"] == 1

    # bad input: one clear line, a non-zero exit, nothing written
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    nowhere = tmp_path / "never"
    cases = [
        (
            {"TRAJSTREAM_KAFKA__TOPIC_PREFIX": "no-such-prefix"},
            ["--since", "1h"],
            2,
            "unknown topic no-such-prefix.agent-events",
        ),
        ({}, ["--since", "2020-01-01", "--until", "2020-01-02"], 1, "no agent events in"),
        (
            {},
            ["--reward", "no_such_module:fn", "--to", "files", "--out", str(nowhere)],
            2,
            "cannot import 'no_such_module'",
        ),
        ({}, ["--to", "files", "--out", str(blocked / "out")], 2, "cannot write the export to"),
        ({}, ["--offsets", "ledger:0:0-10"], 2, "not an input topic"),
        ({}, ["--since", "yesterday"], 2, "bad time 'yesterday'"),
        ({}, ["--to", "files"], 2, "--to files needs --out DIR"),
    ]
    for extra_env, args, expected_code, message in cases:
        code, _, stderr = await replay({**env, **extra_env}, *args)
        lines = stderr.strip().splitlines()
        assert code == expected_code, (args, stderr)
        assert len(lines) == 1 and lines[0].startswith("trajstream: "), (args, stderr)
        assert message in lines[0], (args, stderr)
    assert not nowhere.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "redacted"]
