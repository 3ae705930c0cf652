"""The snapshot ``trajstream status`` shows (:class:`Status`, with its workers, lag and hints)
and :func:`hints`, the pure judgement of what needs attention.

May import: the standard library and the package's models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..models import CommitRecord, Comparison, DeadLetter, DriftAlert, RoutingShare

__all__ = [
    "Hint",
    "Member",
    "PolicyFallbacks",
    "Status",
    "TopicLag",
    "fallbacks_of",
    "hints",
]


@dataclass
class Member:
    member_id: str
    client_id: str
    host: str
    partitions: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class TopicLag:
    topic: str
    lag: int
    lag_before: int
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> lag
    committed_moved: bool = False
    stalled: list[int] = field(default_factory=list)  # records waited, none committed


@dataclass
class PolicyFallbacks:
    """One agent's calls routed to the policy over the windows read, and how many of them
    production answered instead: in whole (``fallbacks``) or in part (``mixed``)."""

    agent: str
    routed: int
    answered: int
    fallbacks: int
    mixed: int

    @property
    def rate(self) -> float | None:
        return (self.fallbacks + self.mixed) / self.routed if self.routed else None


def fallbacks_of(comparisons: list[Comparison]) -> list[PolicyFallbacks]:
    """Per agent, the calls routed to the policy in the window comparisons given (each window
    once: the last emitted), and those that fell back (pure)."""
    latest: dict[tuple[str, datetime], Comparison] = {}
    for c in comparisons:
        if c.span == "window":
            key = (c.agent_name, c.window_start)
            if key not in latest or c.emitted_at >= latest[key].emitted_at:
                latest[key] = c
    out: dict[str, PolicyFallbacks] = {}
    for (agent, _), c in sorted(latest.items()):
        f = out.setdefault(agent, PolicyFallbacks(agent, 0, 0, 0, 0))
        f.routed += c.policy_count + c.policy_fallbacks + c.policy_mixed
        f.answered += c.policy_count
        f.fallbacks += c.policy_fallbacks
        f.mixed += c.policy_mixed
    return [f for f in out.values() if f.routed]


@dataclass
class Hint:
    level: str  # "error", "warning" or "info"
    what: str
    do: str


@dataclass
class Status:
    at: datetime
    prefix: str
    group: str
    group_state: str
    members: list[Member]
    lag: list[TopicLag]
    sample_gap_s: float
    open_calls: int | None
    commits: list[CommitRecord]
    last_commit_at: datetime | None
    commit_interval_s: float
    rewarded_since_commit: int
    oldest_uncommitted_at: datetime | None
    dead_letters: dict[str, int]  # per stage, of the newest 1000 per partition
    recent_dead_letters: list[DeadLetter]
    late_events: int
    alerts: list[DriftAlert]
    partitions: int
    dead_letters_total: int = 0  # exact, from the offsets
    hints: list[Hint] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    """The newest comparison of the policy with production per agent and span (last hour)."""
    routing: list[RoutingShare] = field(default_factory=list)
    """The newest routing share per agent (gateway.rollout)."""
    fallbacks: list[PolicyFallbacks] = field(default_factory=list)
    """Per agent: calls routed to the policy in the last hour's windows, and its fallbacks."""
    max_fallback_rate: float = 0.1
    """gateway.rollout.max_fallback_rate: a higher rate is a hint."""

    @property
    def total_lag(self) -> int:
        return sum(t.lag for t in self.lag)

    def to_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            if isinstance(value, dict):
                return {str(k): plain(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [plain(v) for v in value]
            if hasattr(value, "model_dump"):
                return plain(value.model_dump(mode="python"))
            return value

        data = {k: v for k, v in self.__dict__.items()}
        data["members"] = [asdict(m) for m in self.members]
        data["lag"] = [asdict(t) for t in self.lag]
        data["hints"] = [asdict(h) for h in self.hints]
        data["fallbacks"] = [{**asdict(f), "rate": f.rate} for f in self.fallbacks]
        data["total_lag"] = self.total_lag
        data["recent_dead_letters"] = [  # without payloads: a summary, not the records
            {k: v for k, v in d.model_dump(mode="python").items() if k != "payload"}
            for d in self.recent_dead_letters
        ]
        return plain(data)  # type: ignore[no-any-return]


def hints(s: Status) -> list[Hint]:
    """The states of a snapshot that need attention, each with what to do (pure)."""
    out: list[Hint] = []
    if not s.members:
        out.append(
            Hint(
                "error",
                f"no workers in consumer group {s.group}",
                "start one: `trajstream worker` (same app_id and kafka.topic_prefix)",
            )
        )
    elif s.group_state != "Stable":
        out.append(
            Hint(
                "warning",
                f"the group is {s.group_state}: partitions are being reassigned",
                "wait a few seconds; if it stays so, a worker keeps joining and leaving (logs)",
            )
        )
    if len(s.members) > s.partitions:
        out.append(
            Hint(
                "info",
                f"{len(s.members) - s.partitions} of {len(s.members)} workers have no keyed "
                f"partition (kafka.partitions={s.partitions})",
                "more workers than partitions add no throughput",
            )
        )
    total, before = s.total_lag, sum(t.lag_before for t in s.lag)
    # ticks arrive in bursts of one per partition: growth below twice the partitions is noise
    noise = 2 * sum(len(t.partitions) for t in s.lag)
    if s.sample_gap_s > 0 and total - before > noise:
        out.append(
            Hint(
                "warning",
                f"lag grew from {before} to {total} records in {s.sample_gap_s:g}s",
                "the workers fall behind: add workers (up to kafka.partitions), or look for "
                "Trinity errors (trajstream_trinity_errors_total) and slow feedback",
            )
        )
    stalled = [f"{t.topic}[{','.join(map(str, t.stalled))}]" for t in s.lag if t.stalled]
    if s.members and s.sample_gap_s > 0 and stalled:
        out.append(
            Hint(
                "warning",
                f"no offset committed in {s.sample_gap_s:g}s while records wait on "
                + ", ".join(stalled),
                "run again with a longer --gap; if it persists the stage is stuck (Trinity "
                "down? see trajstream_trinity_errors_total), or its worker is: logs, /readyz",
            )
        )
    limit = 2 * s.commit_interval_s
    if s.rewarded_since_commit and s.oldest_uncommitted_at is not None:
        waited = (s.at - s.oldest_uncommitted_at).total_seconds()
        if waited > limit:
            since = (
                f"since the last commit at {s.last_commit_at:%H:%M:%S}"
                if s.last_commit_at
                else "and no commit yet"
            )
            out.append(
                Hint(
                    "error",
                    f"{s.rewarded_since_commit} rewarded trajectories {since}, the oldest "
                    f"{waited:.0f}s ago (> 2 x commit.interval_s = {limit:g}s)",
                    "is Trinity reachable? check trajstream_trinity_errors_total and the "
                    "worker holding the ledger partition",
                )
            )
    if s.dead_letters:
        stages = ", ".join(f"{k} {v}" for k, v in sorted(s.dead_letters.items()))
        out.append(
            Hint(
                "warning",
                f"{max(s.dead_letters_total, sum(s.dead_letters.values()))} dead letters in "
                f"the last hour ({stages})",
                f"read their reasons on {s.prefix}.dead-letters (the status page lists them); "
                "fix the producer or the setting, then replay the source range",
            )
        )
    last = max(s.commits, key=lambda c: c.commit_seq, default=None)
    if last is not None and last.held:
        out.append(
            Hint(
                "warning",
                f"commits are held (commit.hold_on_drift): {last.held_reason}",
                "nothing reaches the trainer until a later window of that agent and model "
                "recovers; once the drop is understood: `trajstream commits resume`",
            )
        )
    for share in s.routing:
        if share.action in ("rollback", "drift"):
            out.append(
                Hint(
                    "warning",
                    f"the policy of {share.agent_name} was rolled back to share {share.share:g} "
                    f"({share.reason}); commits are held",
                    "check the policy's checkpoint; then `trajstream routing resume --agent "
                    f"{share.agent_name}`",
                )
            )
    for f in s.fallbacks:
        if f.rate is not None and f.rate > s.max_fallback_rate:
            out.append(
                Hint(
                    "warning",
                    f"{f.fallbacks + f.mixed} of {f.routed} calls of {f.agent} routed to the "
                    f"policy in the last hour fell back to production ({f.rate:.0%}: "
                    f"{f.fallbacks} whole, {f.mixed} mixed); they are not trained",
                    "is the policy down, slow or reloading? the gateway's /healthz policy state "
                    "and trajstream_gateway_policy_fallbacks_total say why; the rollout does not "
                    "promote above gateway.rollout.max_fallback_rate",
                )
            )
    for alert in s.alerts:
        out.append(
            Hint(
                "warning",
                f"reward drift: {alert.agent_name}/{alert.model} window mean {alert.mean:.3f} "
                f"< {alert.fraction:g} x trailing {alert.trailing_mean:.3f}",
                "compare the window's calls on the status page; a new model or prompt?",
            )
        )
    return out
