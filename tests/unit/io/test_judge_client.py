"""The judge's edge without a server (httpx.MockTransport): what is sent, the retries with
backoff on an unavailable judge, giving up after the maximum age, and garbage or rejected
answers as verdicts without a score, never a retry storm and never an exception."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from streams.core.judge import JudgeSpec
from streams.core.retry import RetryPolicy
from streams.io.judge import JudgeClient, judge
from streams.models import JudgeVerdict
from tests.unit.factories import at, trajectory

SPEC = JudgeSpec(model="judge-1", rubric="Score it.")
REQUEST = SPEC.request(trajectory(), at(0))
POLICY = RetryPolicy(max_age=60, base=1, cap=8, service="the judge")


def ok(score: Any = 0.9) -> httpx.Response:
    content = json.dumps({"score": score, "reason": "fine"})
    return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})


def run(answers: list[Any], policy: RetryPolicy = POLICY) -> tuple[JudgeVerdict, list, list]:
    """Ask once with a scripted server (a response or an exception per request) and a fake
    clock that each sleep moves on."""
    seen: list[httpx.Request] = []
    script = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = script.pop(0) if script else ok()
        if isinstance(answer, Exception):
            raise answer
        return answer

    now = {"t": at(0)}
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now["t"] += timedelta(seconds=seconds)

    def clock() -> datetime:
        return now["t"]

    async def main() -> JudgeVerdict:
        client = JudgeClient(
            "http://judge.test/v1", api_key="sk-secret", transport=httpx.MockTransport(handler)
        )
        try:
            return await judge(client, REQUEST, policy, clock=clock, sleep=sleep)
        finally:
            await client.aclose()

    return asyncio.run(main()), seen, slept


def test_what_is_sent() -> None:
    verdict, [sent], _ = run([ok(0.9)])
    assert sent.url == "http://judge.test/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-secret"
    assert sent.headers["x-trajstream-call-id"] == "call-1"
    body = json.loads(sent.content)
    assert body == {
        "model": "judge-1",
        "messages": [
            {"role": "system", "content": "Score it."},
            {"role": "user", "content": REQUEST.prompt},
        ],
        "temperature": 0,
    }
    assert (verdict.score, verdict.reason, verdict.attempts) == (0.9, "fine", 1)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.Response(503, text="busy"),
        httpx.Response(500),
        httpx.Response(429),
        httpx.Response(408),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    ],
)
def test_an_unavailable_judge_is_retried_with_backoff(failure: Any) -> None:
    verdict, seen, slept = run([failure, failure, ok(0.4)])
    assert (verdict.score, verdict.attempts, len(seen)) == (0.4, 3, 3)
    assert len(slept) == 2 and slept[1] > slept[0]


def test_after_the_maximum_age_the_call_becomes_a_verdict_without_a_score() -> None:
    verdict, seen, slept = run([httpx.Response(503, text="down")] * 100)
    assert verdict.score is None and verdict.error is not None
    assert verdict.error.startswith("the judge unavailable for 60s (")
    assert sum(slept) <= 60 and len(seen) == len(slept) + 1
    assert verdict.raw_answer == "down"


def test_a_request_older_than_the_maximum_age_is_not_sent() -> None:
    stale = REQUEST.model_copy(update={"requested_at": at(0) - timedelta(seconds=61)})

    async def main() -> JudgeVerdict:
        def handler(request: httpx.Request) -> httpx.Response:
            raise AssertionError("asked")

        client = JudgeClient("http://judge.test/v1", transport=httpx.MockTransport(handler))
        return await judge(client, stale, POLICY, clock=lambda: at(0))

    verdict = asyncio.run(main())
    assert verdict.error is not None and "reward.judge.max_age_s" in verdict.error


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (httpx.Response(200, text="<html>oops</html>"), "garbage answer: not a chat completion"),
        (ok(1.7), "garbage answer: the score 1.7 is outside [0, 1]"),
        (ok("high"), "garbage answer: the score 'high' is not a number"),
        (
            httpx.Response(400, text="bad model"),
            "the judge rejected the request: judge answered 400",
        ),
        (httpx.Response(401), "the judge rejected the request: judge answered 401"),
    ],
)
def test_a_garbage_or_rejected_answer_is_not_retried(answer: Any, error: str) -> None:
    verdict, seen, slept = run([answer])
    assert verdict.score is None and verdict.error is not None
    assert verdict.error.startswith(error)
    assert (len(seen), slept) == (1, [])
