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

from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from .errors import BrokerError, ConfigError

__all__ = ["Topics", "create_topics"]


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


async def create_topics(bootstrap: str, wanted: dict[str, int], replication: int = 1) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    An existing topic with another partition count is an error: co-partitioning would break.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
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
        missing = [NewTopic(t, n, replication) for t, n in wanted.items() if t not in existing]
        if missing:
            brokers = len((await admin.describe_cluster())["brokers"])
            if replication > brokers:
                raise ConfigError(
                    f"kafka.replication_factor is {replication}, but the cluster at {bootstrap} "
                    f"has {brokers} broker{'s' if brokers != 1 else ''}: lower the setting"
                )
            try:
                response = await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created them at the same moment
            else:
                # the admin client returns per-topic errors instead of raising them
                failed = [
                    (name, code, message)
                    for name, code, *rest in response.topic_errors
                    for message in [rest[0] if rest else ""]
                    if code not in (0, TopicAlreadyExistsError.errno)
                ]
                if failed:
                    raise BrokerError(
                        "Kafka refused to create "
                        + "; ".join(f"{n}: error {c} {m or ''}".strip() for n, c, m in failed)
                    )
        return [t.name for t in missing]
    finally:
        await admin.close()
