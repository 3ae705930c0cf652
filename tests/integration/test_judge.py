"""The LLM-judge reward end to end, on a real broker, with the stand-in as Trinity and as the
judge (one worker start): live rewards from the judge's verdicts in a Composite, exactly one
answered judge request per call (the 503s before it retried), a garbage answer as a clear
dead letter while the worker keeps going, and ``trajstream replay`` reproducing the live rewards
from the stored verdicts without asking the judge again."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from streams.capture.sdk import TrajstreamProducer
from streams.codec import SchemaRegistry
from streams.devtools.standin import JudgeFault
from streams.devtools.traffic import simulate_call
from streams.io.trinity import TrinityClient
from streams.models import DeadLetter, JudgeVerdict, RewardedTrajectory, Trajectory, utcnow

from .conftest import REPO_ROOT, base_env, read_topic

pytestmark = pytest.mark.integration

KEY = "sk-test-judge-key"


async def trajstream(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
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


async def test_a_judge_reward_live_then_replayed(
    kafka_bootstrap, prefix, standin, workers, tmp_path: Path
):
    judge_env = {
        "TRAJSTREAM_TRINITY__URL": standin.url,
        "TRAJSTREAM_SELECTION__STRATEGY": "sampling:1",
        "TRAJSTREAM_REWARD__FUNCTION": "composite",
        "TRAJSTREAM_REWARD__WEIGHTS": json.dumps(
            {"streams.rewards:success": 0.5, "streams.rewards:judge": 0.5}
        ),
        "TRAJSTREAM_REWARD__JUDGE__URL": f"{standin.url}/judge/v1",
        "TRAJSTREAM_REWARD__JUDGE__MODEL": "standin-judge",
        "TRAJSTREAM_REWARD__JUDGE__RUBRIC_FILE": str(REPO_ROOT / "examples" / "judge-rubric.txt"),
        "TRAJSTREAM_REWARD__JUDGE__API_KEY": KEY,
        "TRAJSTREAM_REWARD__JUDGE__RETRY_BASE_S": "0.2",
    }
    worker = workers(**judge_env, TRAJSTREAM_COMMIT__INTERVAL_S=2)
    since = utcnow().isoformat()
    standin.state.judge_fault = JudgeFault(mode="error", status=503, count=2)
    rng = random.Random(7)

    async def calls(n: int, fail_every: int = 0) -> list:
        async with (
            TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as producer,
            TrinityClient(standin.url) as trinity,
        ):
            return [
                await simulate_call(
                    producer,
                    trinity,
                    rng,
                    agent="support-bot",
                    fail=bool(fail_every) and i % fail_every == fail_every - 1,
                )
                for i in range(n)
            ]

    def of(sims: list, records: list) -> list:
        ids = {s.call_id for s in sims}
        return [r for r in records if getattr(r, "call_id", None) in ids]

    # 1. live: every call scored from its verdict, one answered judge request per call
    sims = await calls(5, fail_every=3)
    rewarded = of(
        sims,
        await read_topic(
            kafka_bootstrap,
            f"{prefix}.rewarded",
            until=lambda rs: len(of(sims, rs)) >= 5,
            timeout=90,
        ),
    )
    assert {r.call_id for r in rewarded} == {s.call_id for s in sims}
    judged = standin.state.judge
    assert Counter(j.call_id for j in judged if j.score is not None) == {s.call_id: 1 for s in sims}
    assert sum(j.status == 503 for j in judged) == 2  # retried with backoff, then answered
    verdicts = {
        v.call_id: v
        for v in of(
            sims,
            await read_topic(
                kafka_bootstrap, f"{prefix}.verdicts", until=lambda rs: len(of(sims, rs)) >= 5
            ),
        )
        if isinstance(v, JudgeVerdict)
    }
    scores = {j.call_id: j.score for j in judged if j.score is not None}
    for r in rewarded:
        assert isinstance(r, RewardedTrajectory)
        v = verdicts[r.call_id]
        assert v.score == scores[r.call_id] and v.judge_model == "standin-judge"
        assert len(v.prompt_hash) == 64 and json.loads(v.raw_answer)["score"] == v.score
        assert r.components == {"success": 1.0 if r.succeeded else 0.0, "judge": v.score}
        assert r.reward == pytest.approx(0.5 * r.components["success"] + 0.5 * v.score)
    assert any(not r.succeeded for r in rewarded) and len(set(scores.values())) > 1

    # 2. a garbage answer: a judge dead letter naming what was wrong; the worker goes on
    standin.state.judge_fault = JudgeFault(mode="garbage", count=1)
    [bad] = await calls(1)
    letters = await read_topic(
        kafka_bootstrap,
        f"{prefix}.dead-letters",
        until=lambda rs: any(getattr(r, "stage", "") == "judge" for r in rs),
        timeout=60,
    )
    [letter] = [d for d in letters if isinstance(d, DeadLetter)]
    assert letter.stage == "judge" and letter.key == bad.call_id.encode()
    assert letter.reason.startswith("judge verdict without a score: garbage answer: not JSON")
    payload = SchemaRegistry.default().decode(letter.payload)
    assert isinstance(payload, Trajectory) and payload.call_id == bad.call_id  # replayable
    [good] = await calls(1)
    await read_topic(
        kafka_bootstrap,
        f"{prefix}.rewarded",
        until=lambda rs: any(r.call_id == good.call_id for r in rs),
        timeout=60,
    )
    assert worker.alive
    asked = len(standin.state.judge)
    assert asked == 5 + 2 + 2  # 5 answered, 2 answered 503, the garbage one, the good one
    live = {
        r.call_id: r
        for r in await read_topic(kafka_bootstrap, f"{prefix}.rewarded")
        if isinstance(r, RewardedTrajectory)
    }

    # 3. replay: the same rewards from the stored verdicts, and nothing asked again
    env = {**base_env(kafka_bootstrap, prefix, tmp_path), **judge_env, "COLUMNS": "250"}
    out = tmp_path / "export"
    code, stdout, stderr = await trajstream(
        env, "replay", "--since", since, "--to", "files", "--out", str(out)
    )
    assert code == 0, stderr
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    replayed = {
        row["trajectory"]["call_id"]: RewardedTrajectory.model_validate(row["reward"])
        for row in rows
    }
    assert replayed == live and len(replayed) == 6  # the garbage call is a dead letter again
    assert len(standin.state.judge) == asked
    assert "judge verdicts" in stdout and "7 read from the verdicts topic, 0 asked" in stdout
    assert KEY not in worker.log.read_text() and KEY not in stdout + stderr

    # 4. a tombstone deletes a call's verdict: the next replay asks the judge for that call only
    # (reward.judge.replay_missing = ask), records the new verdict, and rewards it alike
    first = sims[0].call_id
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(f"{prefix}.verdicts", None, key=first.encode())
    finally:
        await producer.stop()
    code, stdout, stderr = await trajstream(
        env, "replay", "--since", since, "--to", "files", "--out", str(tmp_path / "again")
    )
    assert code == 0, stderr
    assert "6 read from the verdicts topic, 1 asked" in stdout, stdout
    assert [j.call_id for j in standin.state.judge[asked:]] == [first]
    rows = (tmp_path / "again" / "trajectories.jsonl").read_text().splitlines()
    again = {
        (row := json.loads(line))["trajectory"]["call_id"]: RewardedTrajectory.model_validate(
            row["reward"]
        )
        for line in rows
    }
    assert again == live
    recorded = await read_topic(
        kafka_bootstrap,
        f"{prefix}.verdicts",
        until=lambda rs: sum(getattr(r, "call_id", "") == first for r in rs) >= 2,
    )
    assert [v.score for v in recorded if getattr(v, "call_id", "") == first] == [scores[first]] * 2
    assert worker.alive and "Traceback" not in worker.log.read_text()
