"""Unit tests of streams.io.trinity: the client against httpx.MockTransport, and the backoff."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from itertools import islice
from typing import Any

import httpx
import pytest

from streams.errors import (
    ConfigError,
    TrinityError,
    TrinityRejected,
    TrinityUnavailable,
)
from streams.io.trinity import TrinityClient, backoff_delays, feedback_body

BASE = "http://trinity.test:8010"
Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that records requests and answers from a function."""

    def __init__(self, answer: Handler | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self._answer = answer or (lambda _: httpx.Response(200, json={"status": "success"}))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self._answer(request)

    def client(self) -> TrinityClient:
        return TrinityClient(BASE, transport=httpx.MockTransport(self))

    @property
    def last_json(self) -> Any:
        return json.loads(self.requests[-1].content)


def raising(exc: Exception) -> Handler:
    def answer(request: httpx.Request) -> httpx.Response:
        raise exc

    return answer


# -- request shapes -----------------------------------------------------------------------------


async def test_feedback_posts_the_contract_body() -> None:
    rec = Recorder()
    async with rec.client() as trinity:
        answer = await trinity.feedback(["chatcmpl-a", "chatcmpl-b"], 0.5, "task-1", 3)
    assert answer == {"status": "success"}
    [request] = rec.requests
    assert (request.method, str(request.url)) == ("POST", f"{BASE}/feedback")
    assert request.headers["content-type"] == "application/json"
    assert rec.last_json == {
        "msg_ids": ["chatcmpl-a", "chatcmpl-b"],
        "reward": 0.5,
        "task_id": "task-1",
        "run_id": 3,
    }


@pytest.mark.parametrize(
    ("task_id", "run_id", "expected_keys"),
    [
        (None, None, {"msg_ids", "reward"}),
        ("t", None, {"msg_ids", "reward", "task_id"}),
        (None, 0, {"msg_ids", "reward", "run_id"}),
        ("t", 0, {"msg_ids", "reward", "task_id", "run_id"}),
    ],
)
async def test_feedback_omits_none_fields(
    task_id: str | None, run_id: int | None, expected_keys: set[str]
) -> None:
    rec = Recorder()
    async with rec.client() as trinity:
        await trinity.feedback(("m1",), 1, task_id=task_id, run_id=run_id)
    assert set(rec.last_json) == expected_keys
    assert rec.last_json["msg_ids"] == ["m1"]  # a tuple goes out as a JSON list
    assert rec.last_json["reward"] == 1.0 and isinstance(rec.last_json["reward"], float)


async def test_commit_metrics_chat_use_the_contract_routes() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, json={"explore_step_num": 4})
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(200, json={"id": "chatcmpl-x", "choices": []})
        return httpx.Response(200, json={"status": "success"})

    rec = Recorder(answer)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with rec.client() as trinity:
        assert await trinity.commit() == {"status": "success"}
        assert await trinity.metrics() == {"explore_step_num": 4}
        assert (await trinity.chat(body))["id"] == "chatcmpl-x"
    routes = [(r.method, r.url.path) for r in rec.requests]
    assert routes == [("POST", "/commit"), ("GET", "/metrics"), ("POST", "/v1/chat/completions")]
    assert json.loads(rec.requests[2].content) == body


@pytest.mark.parametrize(
    ("answer", "healthy"),
    [
        (lambda _: httpx.Response(200), True),
        (lambda _: httpx.Response(503, text="down"), False),
        (lambda _: httpx.Response(404), False),
        (raising(httpx.ConnectError("refused")), False),
        (raising(httpx.ReadTimeout("slow")), False),
    ],
)
async def test_health(answer: Handler, healthy: bool) -> None:
    rec = Recorder(answer)
    async with rec.client() as trinity:
        assert await trinity.health() is healthy
    assert [(r.method, r.url.path) for r in rec.requests] == [("GET", "/health")]


# -- error mapping ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (400, '{"error":"msg_ids and reward are required"}', TrinityRejected),
        (404, "Not Found", TrinityRejected),
        (422, '{"detail":[]}', TrinityRejected),
        (408, "request timeout", TrinityUnavailable),
        (429, "slow down", TrinityUnavailable),
        (500, "Internal Server Error", TrinityUnavailable),
        (502, '{"error":{"type":"upstream_connection_error"}}', TrinityUnavailable),
        (503, "", TrinityUnavailable),
        (504, '{"error":{"type":"upstream_timeout"}}', TrinityUnavailable),
    ],
)
async def test_http_errors_map_to_the_exception_tree(
    status: int, body: str, error: type[TrinityError]
) -> None:
    rec = Recorder(lambda _: httpx.Response(status, text=body))
    async with rec.client() as trinity:
        with pytest.raises(error) as info:
            await trinity.feedback(["m"], 1.0)
    assert type(info.value) is error
    assert info.value.status == status
    assert info.value.body == body
    assert str(status) in str(info.value)
    assert info.value.retriable is (error is TrinityUnavailable)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectTimeout("connect"),
        httpx.ReadTimeout("read"),
        httpx.PoolTimeout("pool"),
        httpx.ConnectError("refused"),
        httpx.ReadError("reset"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_transport_failures_are_unavailable_from_the_httpx_error(exc: Exception) -> None:
    rec = Recorder(raising(exc))
    async with rec.client() as trinity:
        with pytest.raises(TrinityUnavailable) as info:
            await trinity.commit()
    assert info.value.__cause__ is exc
    assert info.value.status is None
    assert info.value.retriable


@pytest.mark.parametrize(
    "answer",
    [
        lambda _: httpx.Response(200, text="OK"),
        lambda _: httpx.Response(200, json=["not", "an", "object"]),
        lambda _: httpx.Response(200),
    ],
)
async def test_a_2xx_that_is_not_a_json_object_is_a_plain_trinity_error(answer: Handler) -> None:
    rec = Recorder(answer)
    async with rec.client() as trinity:
        with pytest.raises(TrinityError) as info:
            await trinity.commit()
    assert type(info.value) is TrinityError
    assert info.value.status == 200


async def test_chat_without_an_id_is_an_error() -> None:
    rec = Recorder(lambda _: httpx.Response(200, json={"choices": []}))
    async with rec.client() as trinity:
        with pytest.raises(TrinityError, match="'id'"):
            await trinity.chat({"messages": []})


async def test_chat_rejects_streaming_locally() -> None:
    rec = Recorder()
    async with rec.client() as trinity:
        with pytest.raises(TrinityRejected, match="stream"):
            await trinity.chat({"messages": [], "stream": True})
    assert rec.requests == []


# -- local validation ---------------------------------------------------------------------------

BAD_FEEDBACK: list[tuple[str, dict[str, Any], str]] = [
    ("msg_ids is a string", {"msg_ids": "chatcmpl-a"}, "msg_ids must be a list"),
    ("msg_ids is None", {"msg_ids": None}, "msg_ids must be a list"),
    ("msg_ids is empty", {"msg_ids": []}, "must not be empty"),
    ("msg_id is empty", {"msg_ids": ["a", ""]}, "non-empty string"),
    ("msg_id is an int", {"msg_ids": ["a", 7]}, "non-empty string"),
    ("reward is a bool", {"reward": True}, "reward must be a number"),
    ("reward is a string", {"reward": "1"}, "reward must be a number"),
    ("reward is None", {"reward": None}, "reward must be a number"),
    ("reward is NaN", {"reward": math.nan}, "finite"),
    ("reward is infinite", {"reward": -math.inf}, "finite"),
    ("task_id has 65 chars", {"task_id": "t" * 65}, "at most 64"),
    ("task_id is an int", {"task_id": 5}, "task_id must be a string"),
    ("run_id is a float", {"run_id": 1.0}, "run_id must be an int"),
    ("run_id is a bool", {"run_id": False}, "run_id must be an int"),
    ("run_id is a str", {"run_id": "0"}, "run_id must be an int"),
    ("run_id overflows", {"run_id": 2**31}, "32-bit"),
]


@pytest.mark.parametrize(
    ("override", "message"),
    [(o, m) for _, o, m in BAD_FEEDBACK],
    ids=[name for name, _, _ in BAD_FEEDBACK],
)
async def test_invalid_feedback_is_rejected_before_sending(
    override: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"msg_ids": ["chatcmpl-a"], "reward": 1.0, **override}
    rec = Recorder()
    async with rec.client() as trinity:
        with pytest.raises(TrinityRejected, match=message) as info:
            await trinity.feedback(**args)
    assert info.value.status is None
    assert rec.requests == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((["a"], 0), {"msg_ids": ["a"], "reward": 0.0}),
        (
            (["a", "a"], -1.5, "", 0),
            {"msg_ids": ["a", "a"], "reward": -1.5, "task_id": "", "run_id": 0},
        ),
        (
            (["a"], 1, "t" * 64, 2**31 - 1),
            {"msg_ids": ["a"], "reward": 1.0, "task_id": "t" * 64, "run_id": 2**31 - 1},
        ),
    ],
)
def test_feedback_body_accepts_the_edges(args: tuple[Any, ...], expected: dict[str, Any]) -> None:
    assert feedback_body(*args) == expected


@pytest.mark.parametrize(
    ("url", "kwargs"),
    [
        ("localhost:8010", {}),
        ("ftp://trinity:8010", {}),
        ("http://", {}),
        (BASE, {"timeout": 0}),
        (BASE, {"max_connections": 0}),
    ],
)
def test_bad_settings_are_config_errors(url: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        TrinityClient(url, **kwargs)


async def test_base_url_trailing_slash_is_dropped() -> None:
    rec = Recorder()
    async with TrinityClient(BASE + "/", transport=httpx.MockTransport(rec)) as trinity:
        assert trinity.base_url == BASE
        await trinity.commit()
    assert str(rec.requests[0].url) == f"{BASE}/commit"


# -- backoff ------------------------------------------------------------------------------------


def test_backoff_without_jitter_is_exact_and_capped() -> None:
    delays = list(islice(backoff_delays(base=0.2, factor=2.0, cap=1.0, jitter=0), 6))
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_backoff_is_deterministic_with_a_seeded_rng() -> None:
    first = list(islice(backoff_delays(rng=random.Random(42)), 20))
    second = list(islice(backoff_delays(rng=random.Random(42)), 20))
    other = list(islice(backoff_delays(rng=random.Random(43)), 20))
    assert first == second
    assert first != other


@pytest.mark.parametrize("seed", range(5))
def test_backoff_jitter_stays_in_bounds_and_under_the_cap(seed: int) -> None:
    base, factor, cap, jitter = 0.2, 2.0, 10.0, 0.1
    delays = list(islice(backoff_delays(base, factor, cap, jitter, random.Random(seed)), 2000))
    for n, delay in enumerate(delays):
        nominal = min(cap, base * factor ** min(n, 64))
        assert nominal * (1 - jitter) <= delay <= min(cap, nominal * (1 + jitter))
    assert max(delays) <= cap  # and no OverflowError after 2000 attempts


@pytest.mark.parametrize(
    "kwargs",
    [{"base": 0}, {"base": -1}, {"factor": 0.5}, {"cap": 0.1}, {"jitter": 1.0}, {"jitter": -0.1}],
)
def test_backoff_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        next(backoff_delays(**kwargs))  # type: ignore[arg-type]


# -- https and extra headers --------------------------------------------------------------------


async def test_extra_headers_go_with_every_request() -> None:
    rec = Recorder()
    trinity = TrinityClient(
        BASE, transport=httpx.MockTransport(rec), headers={"Authorization": "Bearer t0k"}
    )
    async with trinity:
        await trinity.commit()
        await trinity.metrics()
    assert [r.headers["authorization"] for r in rec.requests] == ["Bearer t0k"] * 2
    assert all(r.headers["user-agent"] == "trajstream" for r in rec.requests)
    assert "t0k" not in repr(trinity)


def test_from_settings_reads_the_secret_headers() -> None:
    from streams.settings import TrinitySettings

    settings = TrinitySettings(headers={"X-Api-Key": "k3y"}, timeout_s=3)
    client = TrinityClient.from_settings(settings)
    assert client._http.headers["x-api-key"] == "k3y"
    assert client._http.timeout.read == 3


def test_an_unreadable_ca_file_is_a_config_error(tmp_path: Any) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"trinity.ca_file \[TRAJSTREAM_TRINITY__CA_FILE\]"):
        TrinityClient("https://127.0.0.1:1", ca_file=junk)
