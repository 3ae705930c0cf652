"""The judge port (streams/runtime/live/judge.py) over memory: a request made again is answered
once by the process that answered it; a request that is not a JudgeRequest is a judge dead
letter."""

from __future__ import annotations

import asyncio
import json

import httpx

from streams.core.judge import JudgeSpec
from streams.io.judge import JudgeClient
from streams.settings import load_settings
from tests.unit.core.harness import REPO_ROOT
from tests.unit.factories import at, trajectory

from .memory import CODEC, Event, stages

RUBRIC = str(REPO_ROOT / "examples" / "judge-rubric.txt")
JUDGE = {"url": "http://judge.test/v1", "model": "j", "rubric_file": RUBRIC}


def test_the_judge_stage_answers_a_request_made_again_once() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers["x-trajstream-call-id"])
        content = json.dumps({"score": 0.5})
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    settings = load_settings(
        kafka={"topic_prefix": "p"},
        reward={"function": "streams.rewards:judge", "judge": JUDGE},
    )
    w = stages(
        settings,
        judge_client=lambda: JudgeClient("http://j/v1", transport=httpx.MockTransport(answer)),
    )
    judge = w.stages.judge
    assert judge is not None
    w.clock.now = at(1)
    request = CODEC.encode(JudgeSpec("j", "Score.").request(trajectory(), at(0)))
    for offset in (1, 2):
        asyncio.run(judge.handle(Event("p.judge-requests", offset, b"call-1", request)))
    asyncio.run(judge.handle(Event("p.judge-requests", 3, b"x", b"not avro")))
    assert asked == ["call-1"]
    assert [s.topic for s in w.sent] == ["verdicts", "dead_letters"]
    [verdict] = w.records("verdicts")
    assert verdict.score == 0.5 and verdict.judged_at == at(1)  # the stages' clock
    [dead] = w.records("dead_letters")
    assert dead.stage == "judge"
    asyncio.run(judge.aclose())
