"""The services' sections: OTLP ingest and the worker's observability."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
)

from .sections import PositiveFloat, PositiveInt, Section


class OtlpSettings(Section):
    host: str = Field(
        default="127.0.0.1", min_length=1, description="`trajstream otlp` listens here"
    )
    port: int = Field(default=4318, ge=0, le=65535, description="4318 is OTLP/HTTP's usual port")
    max_body_bytes: PositiveInt = Field(
        default=16 * 1024 * 1024, description="larger export requests are refused (413)"
    )
    publish_timeout_s: PositiveFloat = Field(
        default=5.0, description="answer 503 (the exporter retries) when Kafka is slower"
    )
    missing_parent: Literal["agent", "own"] = Field(
        default="agent",
        description="a step span whose parent is not in its export: part of that parent's "
        "agent call (agent), or a call of its own (own: for agents with no invoke_agent spans)",
    )
    resolve: Literal["export", "trace"] = Field(
        default="trace",
        description="where a step span's call is found: by the workers' span-resolution stage "
        "over the whole trace (trace: the ingest publishes every span's parent link to "
        "<p>.spans, keyed by trace id), or among the ancestors in its own export (export: the "
        "ingest publishes agent events; `trajstream otlp` only, the gateway's /v1/traces "
        "always maps per export)",
    )
    settle_s: PositiveFloat = Field(
        default=5.0,
        description="trace: how long the span-resolution stage holds an agent call's END so "
        "that children exported after their agent span still join it",
    )
    orphan_after_s: PositiveFloat = Field(
        default=600.0,
        description="trace: how long a step waits for its ancestors (at least the longest agent "
        "run: an agent span is exported when it ends); then an LLM step is a call of its own, "
        "a tool step a late event",
    )
    retention_s: PositiveFloat = Field(
        default=900.0,
        description="trace: how long the links of a trace with agent calls are kept after its "
        "last span, so that a late child finds its call (and is recorded as late, not as a "
        "call of its own)",
    )


class ObserveSettings(Section):
    host: str = Field(
        default="0.0.0.0",  # a scraper reaches the worker from outside its host or pod
        min_length=1,
        description="address of the worker's /metrics, /healthz and /readyz server",
    )
    port: int = Field(
        default=9640,
        ge=0,
        le=65535,
        description="port of that server; 0 turns it off (one port per worker on a host)",
    )
    lag_interval_s: PositiveFloat = Field(
        default=10.0, description="how often the worker samples its consumer lag"
    )
    recovery_stall_s: PositiveFloat = Field(
        default=300.0,
        description="a worker whose tables' recovery (after an assignment) has read nothing for "
        "this long answers 503 on /healthz, so that a liveness probe restarts it",
    )
    consumption_stall_s: PositiveFloat = Field(
        default=120.0,
        description="a worker with records waiting on a partition of <p>.agent-events whose "
        "committed offset has not moved for this long (a consumer stuck after a rebalance) logs "
        "it and answers 503 on /healthz, so that a liveness probe restarts it",
    )
    exit_after_stall_s: float = Field(
        default=60.0,
        ge=0,
        description="a worker whose /healthz has answered 503 (one of the two stalls above) for "
        "this long stops itself with exit status 75, so that whatever runs it (a restart "
        "policy, systemd, Kubernetes) starts it again, with or without a liveness probe, and "
        "the group hands its partitions out again meanwhile; 0: never",
    )
    status_page: bool = Field(
        default=False,
        description="also serve the status page (/, /calls/..., /status.json) on that port",
    )
