"""The topics of a deployment: names and partition counts (created by :mod:`streams.io.kafka`).

All names share the ``kafka.topic_prefix`` setting, so several deployments (or tests) can share a
cluster. Keyed topics have ``kafka.partitions`` partitions and are co-partitioned by call_id, so
that a call's events, its trajectory, its user feedback and its reward meet on one worker. The
ledger is a single partition: it is where the deployment-wide decisions (commits, windows) are
made, in one order.

============================  ==========  =========================================
topic                         partitions  records
============================  ==========  =========================================
<prefix>.agent-events         N           AgentCall (START, END), Completion
<prefix>.user-feedback        N           UserFeedback
<prefix>.ticks                N           Tick (processing-time clock for open calls)
<prefix>.trajectories         N           Trajectory
<prefix>.rewarded             N           RewardedTrajectory
<prefix>.ledger               1           FeedbackAck, Tick, CommitResume, RoutingOverride
                                          (the last two: operators only)
<prefix>.windows              1           WindowSummary
<prefix>.commits              1           CommitRecord
<prefix>.dead-letters         N           DeadLetter
<prefix>.decisions            N           SelectionDecision (one per closed call)
<prefix>.late-events          N           DeadLetter (stage "late": arrived after its call closed)
<prefix>.alerts               1           DriftAlert
<prefix>.judge-requests       N           JudgeRequest (reward stage -> judge stage)
<prefix>.verdicts             N           JudgeVerdict (compacted, keyed by call_id)
<prefix>.replayed             1           FeedbackAck, CommitRecord, LedgerState per replay id
<prefix>.spans                N           TraceFragment keyed by trace id (otlp.resolve = trace)
<prefix>.comparisons          1           Comparison (policy vs production, per agent and window)
<prefix>.routing              1           RoutingShare (compacted, keyed by agent: the policy's
                                          share, gateway.rollout)
============================  ==========  =========================================

May import: the standard library (``create_topics`` defers to :mod:`streams.io.kafka`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["ABOUT", "Topics", "create_topics", "wait_until_ready"]

ABOUT: dict[str, tuple[str, str]] = {
    "agent-events": ("call_id", "the agents' calls: START and END of each call, and its steps"),
    "user-feedback": ("call_id", "users' ratings, thumbs, corrections and preferences"),
    "ticks": (
        "none (one per partition)",
        "processing time, published by the leader worker every assembly.tick_s",
    ),
    "trajectories": (
        "call_id",
        "closed calls selected for training, and production-answered calls of a routing "
        "gateway (scored for the comparison, not trained on)",
    ),
    "rewarded": ("call_id", "trajectories with their reward, on their way to Trinity"),
    "ledger": (
        "trajectory id (acks); none (ticks); agent|model (CommitResume); agent (RoutingOverride)",
        "what Trinity acknowledged, the ledger clock, and the operators' commit resumes and "
        "routing overrides (`trajstream commits resume`, `trajstream routing set|resume`)",
    ),
    "windows": ("agent|model|window_start[|upstream]", "closed reward windows"),
    "commits": ("commit_seq", "every commit, sent or not, with what it drained"),
    "dead-letters": (
        "the rejected record's key",
        "records no stage could use, with the reason, the stage and the source offset",
    ),
    "decisions": ("call_id", "one selection decision per closed call, selected or not"),
    "late-events": ("the event's key", "events that arrived after their call closed"),
    "alerts": ("agent|model", "a reward window whose mean fell below the trailing mean"),
    "judge-requests": ("call_id", "the reward stage asks the LLM judge about a call"),
    "verdicts": ("call_id", "the judge's verdict per call (reused by redeliveries and replays)"),
    "spans": (
        "trace id",
        "the OTLP spans of one export with their parent links (otlp.resolve = trace)",
    ),
    "comparisons": (
        "agent|span|window_start",
        "the policy against production per agent and window, and over the trailing span",
    ),
    "routing": ("agent", "the policy's share of each agent's traffic (gateway.rollout)"),
    "replayed": (
        "<replay id>|<trajectory id>, <replay id>#commit, <replay id>#ledger",
        "what `trajstream replay` got acknowledged, its commits and its commit ledger; "
        "compacted, one partition, created by the first replay to Trinity",
    ),
}
"""Each topic's key and what it is for, by role (its name after the prefix); the reference
page of the topics is generated from this, :meth:`Topics.value_types` and :meth:`Topics.configs`
(``python -m streams.devtools.refdocs``)."""


@dataclass(frozen=True)
class Topics:
    prefix: str
    partitions: int

    def _t(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    @property
    def agent_events(self) -> str:
        return self._t("agent-events")

    @property
    def user_feedback(self) -> str:
        return self._t("user-feedback")

    @property
    def ticks(self) -> str:
        return self._t("ticks")

    @property
    def trajectories(self) -> str:
        return self._t("trajectories")

    @property
    def rewarded(self) -> str:
        return self._t("rewarded")

    @property
    def ledger(self) -> str:
        return self._t("ledger")

    @property
    def windows(self) -> str:
        return self._t("windows")

    @property
    def commits(self) -> str:
        return self._t("commits")

    @property
    def dead_letters(self) -> str:
        return self._t("dead-letters")

    @property
    def decisions(self) -> str:
        return self._t("decisions")

    @property
    def late_events(self) -> str:
        return self._t("late-events")

    @property
    def alerts(self) -> str:
        return self._t("alerts")

    @property
    def judge_requests(self) -> str:
        return self._t("judge-requests")

    @property
    def verdicts(self) -> str:
        """The LLM judge's verdicts, keyed by call_id (compacted: see :meth:`configs`)."""
        return self._t("verdicts")

    @property
    def spans(self) -> str:
        """OTLP trace fragments keyed by trace id, read by the workers' span-resolution stage
        (written by the OTLP ingest with ``otlp.resolve = trace``, the default)."""
        return self._t("spans")

    @property
    def comparisons(self) -> str:
        """The policy against production per agent and window (and trailing span)."""
        return self._t("comparisons")

    @property
    def routing(self) -> str:
        """The policy's share per agent (compacted, keyed by agent: see :meth:`configs`)."""
        return self._t("routing")

    @property
    def replayed(self) -> str:
        """What replays got acknowledged (1 partition, compacted; created by the first replay
        to Trinity, not by the worker: not in :meth:`all`)."""
        return self._t("replayed")

    def all(self) -> dict[str, int]:
        """Every topic with its partition count."""
        n = self.partitions
        return {
            self.agent_events: n,
            self.user_feedback: n,
            self.ticks: n,
            self.trajectories: n,
            self.rewarded: n,
            self.ledger: 1,
            self.windows: 1,
            self.commits: 1,
            self.dead_letters: n,
            self.decisions: n,
            self.late_events: n,
            self.alerts: 1,
            self.judge_requests: n,
            self.verdicts: n,
            self.spans: n,
            self.comparisons: 1,
            self.routing: 1,
        }

    def value_types(self) -> dict[str, tuple[str, ...]]:
        """The record types (Avro full names) each topic carries, ``<p>.replayed`` included.

        With a schema registry, a topic's subject (``<topic>-value``) holds its record's schema,
        or a union of its records in this order: append a new type at the end (a union that
        gains a branch at its end still reads every record written before)."""
        r = "io.trajstream."
        return {
            self.agent_events: (r + "AgentCall", r + "Completion"),
            self.user_feedback: (r + "UserFeedback",),
            self.ticks: (r + "Tick",),
            self.trajectories: (r + "Trajectory",),
            self.rewarded: (r + "RewardedTrajectory",),
            self.ledger: (r + "FeedbackAck", r + "Tick", r + "CommitResume", r + "RoutingOverride"),
            self.windows: (r + "WindowSummary",),
            self.commits: (r + "CommitRecord",),
            self.dead_letters: (r + "DeadLetter",),
            self.decisions: (r + "SelectionDecision",),
            self.late_events: (r + "DeadLetter",),
            self.alerts: (r + "DriftAlert",),
            self.judge_requests: (r + "JudgeRequest",),
            self.verdicts: (r + "JudgeVerdict",),
            self.spans: (r + "TraceFragment",),
            self.replayed: (r + "FeedbackAck", r + "CommitRecord", r + "LedgerState"),
            self.comparisons: (r + "Comparison",),
            self.routing: (r + "RoutingShare",),
        }

    def worker_writes(self) -> list[str]:
        """The topics a worker writes (what it registers with a schema registry): agent-events
        too, where the span-resolution stage emits the calls it resolved."""
        return [
            self.agent_events,
            self.ticks,
            self.trajectories,
            self.rewarded,
            self.ledger,
            self.windows,
            self.commits,
            self.dead_letters,
            self.decisions,
            self.late_events,
            self.alerts,
            self.judge_requests,
            self.verdicts,
            self.comparisons,
            self.routing,
        ]

    def configs(self) -> dict[str, dict[str, str]]:
        """Topic configs of the topics that need them: the verdicts are compacted (one per
        call is kept: the last, which the reward stage makes the one it used), and so is the routing
        (the last share of each agent is kept)."""
        return {
            self.verdicts: {"cleanup.policy": "compact"},
            self.routing: {"cleanup.policy": "compact"},
        }


async def create_topics(
    bootstrap: str, wanted: dict[str, int], replication: int = 1, **options: Any
) -> list[str]:
    """Compatibility: :func:`streams.io.kafka.create_topics`, where every Kafka client is built."""
    from .io.kafka import create_topics as create

    return await create(bootstrap, wanted, replication, **options)


async def wait_until_ready(bootstrap: str, topics: Iterable[str], **options: Any) -> None:
    """Compatibility: :func:`streams.io.kafka.wait_until_ready`."""
    from .io.kafka import wait_until_ready as wait

    await wait(bootstrap, topics, **options)
