"""The live worker's wiring (streams/runtime/live/app.py), without a broker: which agents,
tables and topics a worker has (the judge's only for a reward that needs the judge; the spans
stage on its own topic), what each agent runs, and the changelog topics made before it
starts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streams.errors import ConfigError
from streams.runtime.live.app import OUTPUTS, Pipeline, span_limits_of
from streams.runtime.live.stores import TableStore
from streams.settings import load_settings
from streams.topics import Topics
from tests.unit.core.harness import REPO_ROOT

RUBRIC = str(REPO_ROOT / "examples" / "judge-rubric.txt")
JUDGE = {"url": "http://judge.test/v1", "model": "j", "rubric_file": RUBRIC}


def pipeline(**reward: object) -> Pipeline:
    settings = load_settings(observe={"port": 0}, kafka={"topic_prefix": "p"}, reward=reward)
    return Pipeline(settings, bootstrap="127.0.0.1:9")


def test_without_a_judge_reward_nothing_of_the_judge_runs() -> None:
    p = pipeline(judge=JUDGE)  # configured, but streams.rewards:success needs no verdict
    assert p.rules.judge is None and p.stages.judge is None and "verdicts" not in p.tables
    assert list(p.app.agents) == ["assemble", "spans", "reward", "feedback", "ledger"]
    assert "p.verdicts" not in p.app.agents["reward"].channel.topics  # type: ignore[attr-defined]


def test_a_judge_reward_adds_the_judge_stage_and_the_verdicts_table() -> None:
    p = pipeline(
        function="composite",
        weights={"streams.rewards:success": 1, "streams.rewards:judge": 1},
        judge=JUDGE,
    )
    assert p.rules.judge is not None and p.rules.judge.model == "j"
    assert p.stages.judge is not None and p.stages.reward.verdicts is not None
    assert any(name.endswith("-verdicts-changelog") for name in p.changelog_topics())
    assert "p.verdicts" in p.app.agents["reward"].channel.topics  # type: ignore[attr-defined]
    assert list(p.app.agents) == ["assemble", "spans", "reward", "judge", "feedback", "ledger"]
    assert p.app.agents["judge"].channel.topics == ("p.judge-requests",)  # type: ignore[attr-defined]


def test_a_judge_reward_without_its_settings_stops_the_start() -> None:
    with pytest.raises(ConfigError) as err:
        pipeline(function="streams.rewards:judge", judge={"model": "j"})
    assert "reward.judge.url" in str(err.value) and "reward.judge.rubric_file" in str(err.value)


def test_each_agent_reads_its_topics_and_each_stage_its_table() -> None:
    p = pipeline()
    topics = {name: agent.channel.topics for name, agent in p.app.agents.items()}  # type: ignore[attr-defined]
    assert topics == {
        "assemble": ("p.agent-events", "p.ticks"),
        "spans": ("p.spans", "p.ticks"),
        "reward": ("p.trajectories", "p.user-feedback", "p.ticks"),
        "feedback": ("p.rewarded",),
        "ledger": ("p.ledger",),
    }
    s = p.stages
    stores = {
        "pending": s.checkpoint.stores[0].inner,
        "closed": s.checkpoint.stores[1].inner,
        "awaiting": s.reward.awaiting,
        "ledger": s.ledger.stage.store,
        "traces": s.spans.store,
    }
    for name, store in stores.items():
        assert isinstance(store, TableStore) and store.table is p.app.tables[name], name
    assert s.assembler.pending is s.checkpoint.stores[0]  # its writes wait for the batch's end
    # every output topic by the core's name, the ledger's one partition
    assert set(s.sink.topics) == set(OUTPUTS)
    assert s.sink.topics["agent_events"].get_topic_name() == "p.agent-events"  # type: ignore[attr-defined]
    assert s.sink.topics["ledger"].partitions == 1  # type: ignore[attr-defined]
    # one Trinity client, one gate: the feedback's requests and the ledger's commits
    assert s.feedback.trinity is s.ledger.trinity and s.trinity.gate is s.checkpoint.gate


def test_the_changelogs_and_the_leader_topic_are_made_before_the_start() -> None:
    p = pipeline()
    made = p.changelog_topics()
    tables = ("pending", "closed", "awaiting", "ledger", "traces")
    assert {name for name in made if name.endswith("-changelog")} == {
        f"{p.app.conf.id}-{table}-changelog" for table in tables
    }
    # without it in the first assignment nobody is leader, and nobody ticks
    assert made[f"{p.app.conf.id}-__assignor-__leader"] == (1, {})
    assert p.app._leader_assignor._leader_topic_name == f"{p.app.conf.id}-__assignor-__leader"


def test_the_span_stage_takes_its_bounds_from_the_otlp_settings() -> None:
    settings = load_settings(
        otlp={"settle_s": 2, "orphan_after_s": 30, "retention_s": 60},
        assembly={"max_bytes": 123_456},
    )
    assert settings.otlp.resolve == "trace"  # the default: a worker resolves traces
    limits = span_limits_of(settings)
    assert limits.settle == timedelta(seconds=2)
    assert limits.orphan_after == timedelta(seconds=30)
    assert limits.retention == timedelta(seconds=60)
    assert limits.max_bytes == 123_456
    assert limits.max_future == timedelta(seconds=settings.assembly.max_future_s)
    topics = Topics("p", 4)
    assert topics.all()[topics.spans] == 4
    assert topics.agent_events in topics.worker_writes()


def test_the_rewarder_takes_train_mixed_from_the_settings() -> None:
    assert pipeline().rules.rewarder.train_mixed is False
    trained = pipeline(train_mixed=True).rules.rewarder
    assert trained.train_mixed is True and trained.version.endswith("+train_mixed")
