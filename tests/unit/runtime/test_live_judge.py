"""The live worker's judge wiring, without a broker: the judge stage, the verdicts table and
the reward stage's subscription exist only for a reward that needs the judge, and a judge
reward without its settings stops the start naming them."""

from __future__ import annotations

import pytest

from streams.errors import ConfigError
from streams.runtime.live import Pipeline
from streams.settings import load_settings
from tests.unit.core.harness import REPO_ROOT

RUBRIC = str(REPO_ROOT / "examples" / "judge-rubric.txt")
JUDGE = {"url": "http://judge.test/v1", "model": "j", "rubric_file": RUBRIC}


def pipeline(**reward: object) -> Pipeline:
    settings = load_settings(observe={"port": 0}, kafka={"topic_prefix": "p"}, reward=reward)
    return Pipeline(settings, bootstrap="127.0.0.1:9")


def test_without_a_judge_reward_nothing_of_the_judge_runs() -> None:
    p = pipeline(judge=JUDGE)  # configured, but streams.rewards:success needs no verdict
    assert p.judge_spec is None and p.verdicts is None
    assert list(p.app.agents) == ["assemble", "spans", "reward", "feedback", "ledger"]
    assert "p.verdicts" not in p.app.agents["reward"].channel.topics  # type: ignore[attr-defined]


def test_a_judge_reward_adds_the_judge_stage_and_the_verdicts_table() -> None:
    p = pipeline(
        function="composite",
        weights={"streams.rewards:success": 1, "streams.rewards:judge": 1},
        judge=JUDGE,
    )
    assert p.judge_spec is not None and p.judge_spec.model == "j"
    assert p.verdicts is not None and p.reward_join.verdicts is not None
    assert any(name.endswith("-verdicts-changelog") for name in p.changelog_topics())
    assert "p.verdicts" in p.app.agents["reward"].channel.topics  # type: ignore[attr-defined]
    assert list(p.app.agents) == ["assemble", "spans", "reward", "judge", "feedback", "ledger"]
    assert p.app.agents["judge"].channel.topics == ("p.judge-requests",)  # type: ignore[attr-defined]


def test_a_judge_reward_without_its_settings_stops_the_start() -> None:
    with pytest.raises(ConfigError) as err:
        pipeline(function="streams.rewards:judge", judge={"model": "j"})
    assert "reward.judge.url" in str(err.value) and "reward.judge.rubric_file" in str(err.value)


def test_the_judge_stage_answers_a_request_made_again_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request made again for a redelivered trajectory: the process that answered it does not
    ask the judge a second time; a request that is not a JudgeRequest is a judge dead letter."""
    import asyncio
    import json

    import httpx

    from streams.codec import SchemaRegistry
    from streams.core.judge import JudgeSpec
    from streams.io.judge import JudgeClient
    from tests.unit.factories import at, trajectory
    from tests.unit.runtime.test_both_runners import Event, Sink

    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers["x-trajstream-call-id"])
        content = json.dumps({"score": 0.5})
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    settings = load_settings(
        observe={"port": 0},
        kafka={"topic_prefix": "p"},
        reward={"function": "streams.rewards:judge", "judge": JUDGE},
    )
    p = Pipeline(
        settings,
        bootstrap="127.0.0.1:9",
        judge_client=lambda: JudgeClient("http://j/v1", transport=httpx.MockTransport(answer)),
    )
    sent: list = []
    p.t_verdicts, p.t_dead = Sink("verdicts", sent), Sink("dead", sent)  # type: ignore[assignment]
    codec = SchemaRegistry.default()
    import streams.runtime.live_ports as live_ports

    monkeypatch.setattr(live_ports, "wall_clock", lambda: at(1))
    request = codec.encode(JudgeSpec("j", "Score.").request(trajectory(), at(0)))
    for offset in (1, 2):
        asyncio.run(p._judge_guarded(Event("p.judge-requests", offset, b"call-1", request)))
    asyncio.run(p._judge_guarded(Event("p.judge-requests", 3, b"x", b"not avro")))
    assert asked == ["call-1"]
    assert [name for name, _, _ in sent] == ["verdicts", "dead"]
    dead = codec.decode(sent[1][2])
    assert dead.stage == "judge"  # type: ignore[attr-defined]
