"""The live worker's span-resolution wiring, without a broker: the ``spans`` agent reads
``<p>.spans`` and the ticks, keeps its state in the ``traces`` table (a changelog topic of
its own), emits on agent-events, takes its bounds from the ``otlp`` settings, and its deadline
index is rebuilt at every assignment like the other stages'."""

from __future__ import annotations

from datetime import timedelta

from streams.runtime.live import Pipeline
from streams.runtime.spans_agent import span_limits_of
from streams.settings import load_settings
from streams.topics import Topics


def test_the_worker_runs_the_span_resolution_stage_on_the_spans_topic() -> None:
    settings = load_settings(observe={"port": 0}, kafka={"topic_prefix": "p"})
    p = Pipeline(settings, bootstrap="127.0.0.1:9")
    assert settings.otlp.resolve == "trace"  # the default, now that a worker resolves traces
    channel = p.app.agents["spans"].channel
    assert channel.topics == ("p.spans", "p.ticks")  # type: ignore[attr-defined]
    assert any(name.endswith("-traces-changelog") for name in p.changelog_topics())
    # created before the start too: without it in the first assignment nobody ticks
    assert p.changelog_topics()[f"{p.app.conf.id}-__assignor-__leader"] == (1, {})
    assert p.app._leader_assignor._leader_topic_name == f"{p.app.conf.id}-__assignor-__leader"
    assert p.t_agent_events is p.t_events  # where the stage's Out sends "agent_events"
    assert p.span_resolver.store.table is p.app.tables["traces"]  # type: ignore[attr-defined]
    topics = Topics("p", 4)
    assert topics.all()[topics.spans] == 4
    assert topics.agent_events in topics.worker_writes()


def test_the_stage_takes_its_bounds_from_the_otlp_settings() -> None:
    settings = load_settings(
        otlp={"settle_s": 2, "orphan_after_s": 30, "retention_s": 60},
        assembly={"max_bytes": 123_456},
    )
    limits = span_limits_of(settings)
    assert limits.settle == timedelta(seconds=2)
    assert limits.orphan_after == timedelta(seconds=30)
    assert limits.retention == timedelta(seconds=60)
    assert limits.max_bytes == 123_456
    assert limits.max_future == timedelta(seconds=settings.assembly.max_future_s)
