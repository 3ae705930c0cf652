"""Trinity as an upstream that may fail (streams.capture.gateway.policy.PolicyUpstream), over a
fake HTTP session: what each answer or failure becomes (an answer, or production's turn and
why), the breaker told each outcome, the version stamped, and the deadline on the first byte,
which must leave the task's cancellation state as it found it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from streams.capture.gateway.policy import Deadline, PolicyFallback, PolicyUpstream
from streams.settings import load_settings


class Content:
    def __init__(self, first: bytes) -> None:
        self.first = first

    async def readany(self) -> bytes:
        return self.first


class Response:
    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = CIMultiDictProxy(CIMultiDict(headers or {}))
        self.content = Content(body)
        self.closed = False

    async def read(self) -> bytes:
        return self.body

    def close(self) -> None:
        self.closed = True


class Session:
    """``post`` runs ``answer`` (which may sleep, raise or return a Response)."""

    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer
        self.sent = 0

    async def post(self, url: str, data: bytes, headers: dict[str, str]) -> Any:
        self.sent += 1
        got = self.answer()
        if asyncio.iscoroutine(got):
            got = await got
        return got


def policy(answer: Callable[[], Any], **gateway: Any) -> tuple[PolicyUpstream, Session]:
    session = Session(answer)
    settings = load_settings(gateway={"policy_timeout_s": 0.2, **gateway})
    return PolicyUpstream(settings, lambda: session), session  # type: ignore[arg-type,return-value]


async def ask(
    p: PolicyUpstream, *, stream: bool = False, sticky: str | None = None, verify: bool = False
) -> Any:
    url = "http://trinity/v1/chat/completions"
    try:
        return await p.open(sticky, url, {}, b"{}", stream=stream, verify=verify)
    except PolicyFallback as exc:
        return exc.reason


async def refused() -> Any:
    raise aiohttp.ClientOSError(111, "Connection refused")


async def reset() -> Any:
    raise aiohttp.ServerDisconnectedError()


async def hangs() -> Any:
    await asyncio.sleep(60)


@pytest.mark.parametrize(
    ("answer", "stream", "reason"),
    [
        (lambda: Response(200, b'{"id": "x"}'), False, None),
        (lambda: Response(200, b"data: {}\n\n"), True, None),
        (lambda: Response(200, b""), True, "connect"),  # a stream that ended before a byte
        (lambda: Response(400, b"bad"), False, None),  # the request's own fault: as it came
        (lambda: Response(404, b"no"), True, None),
        (lambda: Response(503, b"reloading"), False, "status_5xx"),
        (lambda: Response(502, b"proxy"), True, "status_5xx"),
        (lambda: Response(429, b"slow down"), False, "status_429"),
        (lambda: Response(408, b"late"), False, "status_408"),
        (refused, False, "connect"),
        (reset, True, "connect"),
        (hangs, False, "timeout"),
        (hangs, True, "timeout"),
    ],
)
async def test_each_answer_or_failure_of_trinity(answer: Any, stream: bool, reason: str) -> None:
    p, _ = policy(answer, **{"breaker": {"failures": 1}})
    got = await ask(p, stream=stream)
    if reason is None:
        assert got.status in (200, 400, 404) and p.last_error is None
        # a stream that began is no outcome yet: it may still break
        assert (got.ticket is not None) == (stream and got.status == 200)
        p.answered(got)
        assert got.ticket is None and p.breaker.state == "closed"
    else:
        assert got == reason
        assert p.breaker.state == "open" and p.last_error.startswith(reason)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # a timeout left nothing behind


async def test_sticky_and_an_open_breaker_send_nothing() -> None:
    p, session = policy(lambda: Response(503, b"", {"Retry-After": "30"}))
    assert await ask(p, sticky="connect") == "sticky" and session.sent == 0
    assert await ask(p) == "status_5xx" and p.breaker.state == "open"  # Retry-After: at once
    assert p.breaker.open_until - p.breaker.since == pytest.approx(30, abs=0.01)
    assert await ask(p) == "breaker_open" and session.sent == 1
    assert p.health()["state"] == "open" and 0 < p.health()["probe_in_s"] <= 30


async def test_the_version_is_the_answers_or_the_one_read_from_metrics() -> None:
    p, _ = policy(lambda: Response(200, b"{}"))
    assert (await ask(p)).version is None  # nothing read yet
    p.versions.observe(4)
    assert (await ask(p)).version == 4
    p, _ = policy(lambda: Response(200, b"{}", {"X-Model-Version": "9"}))
    p.versions.observe(4)
    assert (await ask(p)).version == 9
    p.breaker.failure(p.breaker.admit(), "x", 5.0)  # open: Trinity may come back with others
    assert p.versions.current is None


async def test_a_bad_answer_and_a_broken_stream_are_failures_of_the_request() -> None:
    p, _ = policy(lambda: Response(200, b"<html>"), **{"breaker": {"failures": 2}})
    answer = await ask(p, verify=True)  # the caller reads it before it counts
    assert answer.ticket is not None
    assert p.bad_answer(answer, "not JSON").reason == "bad_answer"
    streamed = await ask(p, stream=True)
    assert p.broke(streamed, TimeoutError()) == "timeout"
    assert p.breaker.state == "open" and p.stream_errors == 1  # two failed requests in a row
    assert p.last_error.startswith("connect: timeout")
    p.release(streamed)  # told already: nothing more


async def test_a_cancelled_request_frees_its_probe_slot_and_stays_cancelled() -> None:
    p, _ = policy(hangs, **{"breaker": {"failures": 1, "probes": 1, "cooldown_s": 0.01}})
    assert await ask(p) == "timeout"
    await asyncio.sleep(0.02)
    asked = asyncio.create_task(ask(p))  # the one probe
    await asyncio.sleep(0.01)
    assert p.breaker.state == "half_open" and p.breaker.admit() is None
    asked.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await asked
    assert p.breaker.admit() is not None  # its slot is free again


async def test_a_deadline_that_passes_as_the_wait_ends_leaves_no_cancellation_behind() -> None:
    task = asyncio.current_task()
    assert task is not None
    deadline = Deadline(60)
    deadline._fire()  # the timer fires as the wait ends: the task is cancelled all the same
    assert deadline.fired and deadline.close()
    await deadline.settle()  # ... and that is taken back here
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # no stray cancellation at the caller's next await


async def test_a_deadline_leaves_someone_elses_cancellation_alone() -> None:
    async def waits() -> str:
        deadline = Deadline(0.05)
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            if deadline.expired():
                return "timeout"
            raise
        finally:
            deadline.close()
        return "done"

    assert await asyncio.create_task(waits()) == "timeout"
    other = asyncio.create_task(waits())
    await asyncio.sleep(0.01)
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
