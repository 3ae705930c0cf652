"""The topics of a deployment, their names and partition counts, and creating them.

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
<prefix>.ledger               1           FeedbackAck, Tick
<prefix>.windows              1           WindowSummary
<prefix>.commits              1           CommitRecord
<prefix>.dead-letters         N           DeadLetter
<prefix>.decisions            N           SelectionDecision (one per closed call)
<prefix>.late-events          N           DeadLetter (stage "late": arrived after its call closed)
<prefix>.alerts               1           DriftAlert
============================  ==========  =========================================
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from .errors import BrokerError
from .io.security import kafka_client_kwargs
from .settings import KafkaSecuritySettings

__all__ = ["Topics", "create_topics", "wait_until_ready"]


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
        }


async def create_topics(
    bootstrap: str,
    wanted: dict[str, int],
    replication: int = 1,
    *,
    security: KafkaSecuritySettings | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    ``configs`` gives some topics their topic configs (e.g. ``cleanup.policy``). An existing
    topic with another partition count is an error: co-partitioning would break.
    """
    configs = configs or {}
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=15000,
        **kafka_client_kwargs(security or KafkaSecuritySettings()),
    )
    try:
        await admin.start()
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        existing = set(await admin.list_topics())
        if existing & set(wanted):
            described = await admin.describe_topics([t for t in wanted if t in existing])
            for desc in described:
                name, have = desc["topic"], len(desc["partitions"])
                if have != wanted[name]:
                    raise BrokerError(
                        f"topic {name} has {have} partitions, the settings say {wanted[name]} "
                        "(kafka.partitions): co-partitioned topics must agree"
                    )
        missing = [
            NewTopic(t, n, replication, topic_configs=dict(configs.get(t, {})))
            for t, n in wanted.items()
            if t not in existing
        ]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created them at the same moment
        return [t.name for t in missing]
    finally:
        await admin.close()


async def wait_until_ready(
    bootstrap: str,
    topics: Iterable[str],
    *,
    group_id: str | None = None,
    security: KafkaSecuritySettings | None = None,
    timeout: float = 30.0,
) -> None:
    """Wait until every partition of ``topics`` has a leader and the coordinator of
    ``group_id`` answers.

    Right after topics are created, or on a fresh cluster (whose ``__consumer_offsets`` topic
    the first group lookup creates), a worker's clients would meet "topic not found" and
    "coordinator not available" answers and log them as errors while they retry. Asking here
    first, quietly, keeps a healthy start free of ERROR lines.
    """
    names = list(topics)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=15000,
        **kafka_client_kwargs(security or KafkaSecuritySettings()),
    )
    deadline = time.monotonic() + timeout
    try:
        await admin.start()
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        while True:
            described = await admin.describe_topics(names) if names else []
            waiting = [
                d["topic"]
                for d in described
                if d["error_code"] != 0 or any(p["leader"] < 0 for p in d["partitions"])
            ]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise BrokerError(f"topics without a leader after {timeout:g}s: {waiting}")
            await asyncio.sleep(0.2)
        while group_id is not None:
            try:
                await admin.find_coordinator(group_id)
                break
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise BrokerError(
                        f"no coordinator for consumer group {group_id} (app_id): {exc}"
                    ) from exc
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
