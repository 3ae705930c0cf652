"""The ledger: commits to Trinity and reward windows, decided from acknowledged feedback.

Every feedback that Trinity acknowledged is appended to the single-partition ledger topic, with
processing-time ticks between them. One consumer owns that partition at a time, so these
decisions are made in one place for the whole deployment, in one order, from durable input:

Commits
  Processing time is cut into aligned intervals of ``interval`` seconds. When a tick shows that
  the interval in which the current batch started has ended, and the batch holds at least
  ``min_batch`` acknowledgements (trajectories; the ``/feedback`` requests they took, one per
  distinct step reward, are counted alongside), one ``/commit`` is due. Intervals without
  acknowledged feedback commit nothing (``commit_empty`` changes that). A batch smaller than
  ``min_batch`` carries over. With ``max_batch``, a batch that reaches it commits at once
  (replay's ``--commit-every``). A final tick (graceful stop) commits whatever was acknowledged,
  unless a commit was made in its interval (the next owner commits the batch when the interval
  ends; ``handover`` off, for replay, commits it at once). An acknowledgement delivered twice
  (same trajectory id among the last ``RECENT_IDS``) counts once. The batch is kept as running
  statistics, so the state stays small however large the interval.

Reward windows
  Event-time tumbling windows per agent name, model and upstream (who answered the call,
  :mod:`streams.core.arms`; key ``agent|model``, with ``|upstream`` appended for calls a
  gateway routed), and, for the policy's calls (``trinity``), per policy version (the
  comparison is then read per version): count, mean, min, max, standard deviation (Welford),
  success rate. Lateness, drift and holds are decided per key, every version of a window pooled
  (:func:`pool_versions`), so the state kept between windows does not grow with the versions
  the policy goes through. A window is final when the watermark (largest event time seen)
  passes its end plus ``grace``, or, when the ledger has been idle for ``grace`` seconds of
  processing time, when the wall clock passes its end plus ``grace``. Each window is emitted
  once; a trajectory for an emitted window is late and counted in the next summary of its
  agent/model.

Commit holds
  Drift alerts are raised on the windows of trained calls only (not production's, nor the
  fallbacks' and mixed calls' of the policy).
  With ``hold_on_drift``, a drift alert for an agent and model holds commits: a commit that
  falls due is recorded with ``sent: false`` and the reason, and not sent (stop feeding the
  trainer when its rewards drop). Trinity's ``/commit`` drains every ready experience, whatever
  its agent, so any hold holds every commit. The hold ends when a later window of that agent
  and model has a mean at or above the threshold the alert crossed (``drift_fraction`` x the
  trailing mean then), or when an operator's :class:`~streams.models.CommitResume` arrives on
  the ledger. The feedbacks of held intervals stay ready at Trinity; the first commit after the
  hold ends drains them (Trinity has no way to discard them).

Unlike Faust's windowed tables, nothing here depends on a wall-clock cleanup timer or on
in-memory registration that a restart forgets: the state is one record in a changelog-backed
table, and the clock arrives as data.

May import: the standard library, :mod:`streams.models`, :mod:`streams.core.arms`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ..models import (
    CommitHold,
    CommitRecord,
    CommitResume,
    DriftAlert,
    FeedbackAck,
    LedgerState,
    PendingCommit,
    WindowAccumulator,
    WindowSummary,
)
from .arms import POLICY, UNTRAINED, trains
from .compare import CompareConfig
from .rollout import RolloutConfig

RECENT_IDS = 1000


def window_key(agent: str, model: str, upstream: str | None) -> str:
    """``agent|model``, or ``agent|model|upstream`` for a gateway-routed call's window."""
    return f"{agent}|{model}" if upstream is None else f"{agent}|{model}|{upstream}"


__all__ = [
    "RECENT_IDS",
    "CommitPlan",
    "LedgerConfig",
    "apply_ack",
    "apply_resume",
    "commit_done",
    "drift_alerts",
    "due_commit",
    "due_windows",
    "held_commit",
    "is_held",
    "pool_versions",
    "update_holds",
    "window_key",
]


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    interval: timedelta = timedelta(seconds=300)
    min_batch: int = 1
    commit_empty: bool = False
    window: timedelta = timedelta(seconds=60)
    grace: timedelta = timedelta(seconds=10)
    drift_fraction: float = 0.8
    drift_history: int = 5
    hold_on_drift: bool = False
    compare: CompareConfig = field(default_factory=CompareConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    max_batch: int | None = None
    """A batch of this many acknowledgements commits at once, whatever the interval (replay's
    ``--commit-every``); None: only the interval's end does."""
    handover: bool = True
    """A final tick hands the ledger over: it commits only if no commit was made in its
    interval (the next owner commits when the interval ends). False for a runner with no
    successor (replay): its end commits whatever is left."""


CommitPlan = PendingCommit
"""A commit that is due: what it carries. Stored in the state while it is in flight."""


def drift_alerts(
    state: LedgerState, summaries: list[WindowSummary], now: datetime, cfg: LedgerConfig
) -> list[DriftAlert]:
    """Compare each emitted window's mean with the trailing mean of its agent|model.

    An alert when the mean falls below ``drift_fraction`` of the mean of up to ``drift_history``
    earlier windows (at least two of them), for rewards that are not all zero.
    """
    alerts = []
    for summary in pool_versions(summaries):
        if summary.upstream in UNTRAINED:  # production's rewards do not hold training
            continue
        pair = window_key(summary.agent_name, summary.model, summary.upstream)
        history = state.trailing.get(pair, [])
        if len(history) >= 2:
            trailing = sum(history) / len(history)
            if trailing > 0 and summary.mean < cfg.drift_fraction * trailing:
                alerts.append(
                    DriftAlert(
                        agent_name=summary.agent_name,
                        model=summary.model,
                        window_start=summary.window_start,
                        window_end=summary.window_end,
                        mean=summary.mean,
                        trailing_mean=trailing,
                        trailing_windows=len(history),
                        fraction=cfg.drift_fraction,
                        raised_at=now,
                    )
                )
        state.trailing[pair] = [*history, summary.mean][-cfg.drift_history :]
    return alerts


def update_holds(
    state: LedgerState,
    summaries: list[WindowSummary],
    alerts: list[DriftAlert],
    now: datetime,
    cfg: LedgerConfig,
) -> tuple[list[CommitHold], list[CommitHold]]:
    """Start a hold for each alert (with ``hold_on_drift``), end a hold whose agent and model
    has a later window at or above its threshold, end every hold once ``hold_on_drift`` is
    off. A rollback's hold (``reason == "rollback"``) ends only on an operator's resume.
    Returns (started, ended)."""
    started: list[CommitHold] = []
    ended: list[CommitHold] = []
    drops = [h for h in state.holds if h.reason is None]
    if not cfg.hold_on_drift and drops:
        # the setting was turned off since: its holds end with it
        state.holds = [h for h in state.holds if h.reason is not None]
        return started, drops
    raised = {(a.agent_name, a.model, a.window_start): a for a in alerts}
    # oldest first: a drop then a recovery in one batch ends held
    for summary in pool_versions(summaries):
        if summary.upstream in UNTRAINED:
            continue
        key = (summary.agent_name, summary.model, summary.window_start)
        hold = next(
            (
                h
                for h in state.holds
                if h.agent_name == summary.agent_name
                and h.model == summary.model
                and h.reason is None
            ),
            None,
        )
        alert = raised.get(key)
        if alert is not None:
            if not cfg.hold_on_drift:
                continue
            if hold is not None:  # a further drop: keep the original threshold
                continue
            hold = CommitHold(
                agent_name=alert.agent_name,
                model=alert.model,
                threshold=alert.fraction * alert.trailing_mean,
                window_start=alert.window_start,
                mean=alert.mean,
                since=now,
            )
            state.holds.append(hold)
            started.append(hold)
        elif (
            hold is not None
            and summary.window_start > hold.window_start
            and summary.mean >= hold.threshold
        ):
            state.holds.remove(hold)
            ended.append(hold)
    return started, ended


def apply_resume(state: LedgerState, resume: CommitResume) -> list[CommitHold]:
    """An operator's resume: end the holds it names (None matches any). Returns them."""
    ended = [
        h
        for h in state.holds
        if resume.agent_name in (None, h.agent_name) and resume.model in (None, h.model)
    ]
    state.holds = [h for h in state.holds if h not in ended]
    return ended


def held_commit(state: LedgerState, plan: CommitPlan) -> CommitRecord | None:
    """While a hold is active: record ``plan`` as held (``sent: false``, the reason in
    ``trinity_response``) and start the next batch. None when nothing holds commits."""
    if not state.holds:
        return None
    reason = "; ".join(
        f"policy of {h.agent_name} rolled back at window {h.window_start.isoformat()} "
        f"(difference {h.mean:.4g}): resume with trajstream routing resume"
        if h.reason == "rollback"
        else f"reward drop of {h.agent_name}/{h.model}: window {h.window_start.isoformat()} "
        f"mean {h.mean:.4g} < threshold {h.threshold:.4g}"
        for h in state.holds
    )
    held = [
        {"agent_name": h.agent_name, "model": h.model, "threshold": h.threshold}
        for h in state.holds
    ]
    answer = json.dumps({"held": reason, "holds": held}, sort_keys=True)
    return commit_done(state, plan, answer, sent=False, experiences=0)


def is_held(record: CommitRecord) -> bool:
    """Whether ``record`` is a commit held by :func:`held_commit` (not sent)."""
    return record.held


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _interval_index(t: datetime, interval: timedelta) -> int:
    return int(t.timestamp() // interval.total_seconds())


def _window_start(t: datetime, size: timedelta) -> datetime:
    step = int(size.total_seconds() * 1000)
    return _from_ms(_ms(t) // step * step)


def apply_ack(state: LedgerState, ack: FeedbackAck, now: datetime, cfg: LedgerConfig) -> bool:
    """Add one acknowledged feedback to the batch and its window. False for a duplicate."""
    rewarded = ack.rewarded
    tid = rewarded.trajectory_id
    if tid in state.recent_ids:
        return False
    state.recent_ids.append(tid)
    del state.recent_ids[:-RECENT_IDS]
    r = rewarded.reward
    if trains(rewarded):  # production's calls are in their windows, never in a commit
        if state.batch_count == 0:
            state.batch_start = now
            state.batch_min = state.batch_max = r
        state.batch_count += 1
        state.batch_requests += ack.feedbacks
        state.batch_sum += r
        state.batch_min = min(state.batch_min, r)
        state.batch_max = max(state.batch_max, r)
    state.last_event = now
    if state.watermark is None or rewarded.event_time > state.watermark:
        state.watermark = rewarded.event_time

    agent, model, upstream = rewarded.agent_name or "-", rewarded.model or "-", rewarded.upstream
    # the policy's windows are kept per version; lateness stays per key (bounded state)
    version = rewarded.policy_version if upstream == POLICY else None
    pair = window_key(agent, model, upstream)
    start = _window_start(rewarded.event_time, cfg.window)
    if _ms(start) < state.closed_until.get(pair, -(2**62)):
        state.late[pair] = state.late.get(pair, 0) + 1
        return True
    acc = next(
        (
            w
            for w in state.windows
            if w.agent_name == agent
            and w.model == model
            and w.upstream == upstream
            and w.policy_version == version
            and w.window_start == start
        ),
        None,
    )
    if acc is None:
        acc = WindowAccumulator(
            agent_name=agent,
            model=model,
            window_start=start,
            upstream=upstream,
            policy_version=version,
        )
        state.windows.append(acc)
    acc.count += 1
    delta = rewarded.reward - acc.mean
    acc.mean += delta / acc.count
    acc.m2 += delta * (rewarded.reward - acc.mean)
    acc.min = min(acc.min, rewarded.reward)
    acc.max = max(acc.max, rewarded.reward)
    acc.successes += int(rewarded.succeeded)
    return True


def due_windows(state: LedgerState, now: datetime, cfg: LedgerConfig) -> list[WindowSummary]:
    """Close and remove every window that is final now; returns their summaries, oldest first."""
    horizon = None
    if state.watermark is not None:
        horizon = state.watermark - cfg.grace
    idle = state.last_event is None or now - state.last_event >= cfg.grace
    if idle:  # traffic stopped: the clock stands in for the watermark
        horizon = now - cfg.grace if horizon is None else max(horizon, now - cfg.grace)
    if horizon is None:
        return []
    final: list[WindowAccumulator] = []
    keep: list[WindowAccumulator] = []
    for acc in sorted(state.windows, key=window_order):
        end = acc.window_start + cfg.window
        (final if end <= horizon else keep).append(acc)
    state.windows = keep
    summaries = []
    for acc in final:
        pair = window_key(acc.agent_name, acc.model, acc.upstream)
        end = acc.window_start + cfg.window
        state.closed_until[pair] = max(state.closed_until.get(pair, 0), _ms(end))
        summaries.append(
            WindowSummary(
                window_start=acc.window_start,
                window_end=end,
                agent_name=acc.agent_name,
                model=acc.model,
                count=acc.count,
                mean=acc.mean,
                min=acc.min,
                max=acc.max,
                stddev=math.sqrt(acc.m2 / acc.count) if acc.count else 0.0,
                success_rate=acc.successes / acc.count if acc.count else 0.0,
                late=state.late.pop(pair, 0),
                emitted_at=now,
                upstream=acc.upstream,
                policy_version=acc.policy_version,
            )
        )
    return summaries


def window_order(w: WindowAccumulator | WindowSummary) -> tuple[datetime, str, str, str, int]:
    """The order windows close in (and a replay of them must keep): time, agent, model,
    upstream, version."""
    version = -1 if w.policy_version is None else w.policy_version
    return (w.window_start, w.agent_name, w.model, w.upstream or "", version)


def pool_versions(summaries: list[WindowSummary]) -> list[WindowSummary]:
    """The summaries with the policy versions of one agent, model, upstream and window pooled
    into one (exactly: counts, means and squared deviations combined), in the order of each
    key's first summary. A key with one summary is that summary."""
    grouped: dict[tuple[str, str, str | None, datetime], list[WindowSummary]] = {}
    for s in summaries:
        grouped.setdefault((s.agent_name, s.model, s.upstream, s.window_start), []).append(s)
    out = []
    for parts in grouped.values():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        n = sum(s.count for s in parts)
        mean = sum(s.mean * s.count for s in parts) / n if n else 0.0
        m2 = sum(s.stddev * s.stddev * s.count + s.count * (s.mean - mean) ** 2 for s in parts)
        successes = sum(s.success_rate * s.count for s in parts)
        versions = {s.policy_version for s in parts}
        out.append(
            parts[0].model_copy(
                update={
                    "count": n,
                    "mean": mean,
                    "min": min(s.min for s in parts),
                    "max": max(s.max for s in parts),
                    "stddev": math.sqrt(m2 / n) if n else 0.0,
                    "success_rate": successes / n if n else 0.0,
                    "late": sum(s.late for s in parts),
                    "policy_version": versions.pop() if len(versions) == 1 else None,
                }
            )
        )
    return out


def due_commit(
    state: LedgerState, now: datetime, cfg: LedgerConfig, final: bool = False
) -> CommitPlan | None:
    """The commit due at ``now``, if any. Nothing changes until :func:`commit_done`.

    None while another commit is in flight (``state.pending_commit``).
    """
    if state.pending_commit is not None:
        return None
    count = state.batch_count
    if final:
        # a stop commits what was acknowledged, but not twice in one interval: another
        # worker takes the ledger over and commits the batch when the interval ends
        if count == 0:
            return None
        last = state.last_commit
        same = last is not None and _interval_index(now, cfg.interval) == _interval_index(
            last, cfg.interval
        )
        if same and cfg.handover:
            return None
    elif cfg.max_batch is not None and count >= cfg.max_batch:
        pass  # a full batch commits now
    else:
        anchor = state.batch_start if count else (state.last_commit or None)
        if count == 0 and not cfg.commit_empty:
            return None
        if anchor is not None and _interval_index(now, cfg.interval) <= _interval_index(
            anchor, cfg.interval
        ):
            return None
        if count < cfg.min_batch and not (count == 0 and cfg.commit_empty):
            return None
    start = state.batch_start or state.last_commit or now
    return CommitPlan(
        seq=state.next_seq,
        interval_start=start,
        interval_end=now,
        count=count,
        reward_sum=state.batch_sum,
        reward_min=state.batch_min,
        reward_max=state.batch_max,
        final=final,
        requests=state.batch_requests,
    )


def commit_done(
    state: LedgerState,
    plan: CommitPlan,
    response: str,
    *,
    sent: bool = True,
    experiences: int | None = None,
) -> CommitRecord:
    """Record that Trinity acknowledged ``plan``'s commit; starts the next batch.

    Acknowledgements applied while the commit was in flight (Trinity unreachable, say) stay in
    the batch for the next commit; the batch's min and max then still include the plan's.
    """
    n = plan.count
    state.next_seq = plan.seq + 1
    state.pending_commit = None
    state.batch_count -= plan.count
    state.batch_sum -= plan.reward_sum
    state.batch_requests = max(0, state.batch_requests - plan.requests)
    if state.batch_count <= 0:
        state.batch_count, state.batch_sum, state.batch_start = 0, 0.0, None
        state.batch_requests = 0
    else:
        state.batch_start = plan.interval_end
    state.last_commit = plan.interval_end
    if sent and plan.ready_before is not None:
        state.ready_at_last_commit = plan.ready_before
    return CommitRecord(
        commit_seq=plan.seq,
        interval_start=plan.interval_start,
        interval_end=plan.interval_end,
        feedback_count=n,
        reward_mean=plan.reward_sum / n if n else None,
        reward_min=plan.reward_min if n else None,
        reward_max=plan.reward_max if n else None,
        trinity_response=response,
        final=plan.final,
        sent=sent,
        experiences=experiences,
        feedback_requests=plan.requests,
    )
