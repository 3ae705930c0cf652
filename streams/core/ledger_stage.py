"""Stage 4, ledger: a batch of ``<p>.ledger`` records -> reward windows, drift alerts, a commit.

:class:`LedgerStage` is the stage over one store holding one :class:`~streams.models.LedgerState`
(key ``state``). :meth:`LedgerStage.apply` applies a batch of records (acknowledgements and
ticks; each offset once, so records redelivered after a crash are not counted twice);
:meth:`LedgerStage.decide` returns the windows and alerts that are due and the commit plan, if
one is due. The commit itself follows :mod:`streams.core.commits`. The rules of windows,
commit timing and commit holds are in :mod:`streams.core.ledger`.

Four record types belong on the ledger: :class:`~streams.models.FeedbackAck` (written by the
feedback stage), :class:`~streams.models.Tick` (the ledger clock),
:class:`~streams.models.CommitResume` (an operator's ``trajstream commits resume``) and
:class:`~streams.models.RoutingOverride` (``trajstream routing set|resume``). Anything else, and
these anywhere else, is a dead letter (:mod:`streams.envelope` checks it where the records are
decoded; a batch holds :class:`~streams.envelope.Envelope` objects).

With every decision, the windows it closed are compared (:mod:`streams.core.compare`, on
``comparisons``) and, with ``gateway.rollout`` on, the policy's share of each agent follows
(:mod:`streams.core.rollout`, changes on ``routing``).

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from ..codec import SchemaRegistry
from ..envelope import misplaced
from ..errors import RecordError
from ..models import CommitResume, FeedbackAck, LedgerState, RoutingOverride, Tick
from ..state_codec import StateCodec
from .arms import POLICY
from .compare import compare_windows
from .effects import Envelope, Out, Reject
from .ledger import (
    CommitPlan,
    LedgerConfig,
    apply_ack,
    apply_resume,
    drift_alerts,
    due_commit,
    due_windows,
    update_holds,
)
from .rollout import apply_override, decide_rollout
from .store import Store

__all__ = ["LEDGER_KEY", "Applied", "LedgerStage"]

LEDGER_KEY = b"state"

log = logging.getLogger("trajstream.ledger")


@dataclass(slots=True)
class Applied:
    """What a batch did to the state: rejects, and whether a final tick (a stop) was in it."""

    out: Out
    final: bool = False


class LedgerStage:
    """The ledger stage over a store; see the module docstring."""

    stage = "ledger"

    def __init__(self, cfg: LedgerConfig, *, store: Store, codec: SchemaRegistry) -> None:
        self.cfg = cfg
        self.store = store
        self.codec = codec
        self.stored = StateCodec(codec)

    def load(self) -> LedgerState:
        raw = self.store.get(LEDGER_KEY)
        return self.stored.load(raw, LedgerState) if raw else LedgerState()

    def save(self, state: LedgerState) -> None:
        self.store.set(LEDGER_KEY, self.stored.dump(state))

    def exists(self) -> bool:
        return self.store.get(LEDGER_KEY) is not None

    def apply(self, state: LedgerState, batch: list[Envelope], now: datetime) -> Applied:
        applied = Applied(Out())
        out = applied.out
        for env in batch:
            if env.offset <= state.applied_offset:
                # applied before a restart: the state restored from the changelog has it
                out.stats["ledger.reapplied"] += 1
                continue
            state.applied_offset = env.offset
            try:
                match env.open():
                    case FeedbackAck() as ack:
                        if not apply_ack(state, ack, now, self.cfg):
                            out.stats["ledger.duplicate_acks"] += 1
                    case Tick() as tick:
                        applied.final = applied.final or tick.final
                    case CommitResume() as resume:
                        ended = apply_resume(state, resume)
                        out.stats["ledger.holds_resumed"] += len(ended)
                        for hold in ended:
                            log.warning(
                                "commits resumed for %s/%s by %s: %s",
                                hold.agent_name,
                                hold.model,
                                resume.requested_by or "an operator",
                                resume.reason or "no reason given",
                            )
                    case RoutingOverride() as override:
                        change, ended = apply_override(state, override, now, self.cfg.rollout)
                        out.stats["ledger.holds_resumed"] += len(ended)
                        if change is not None:
                            log.warning(
                                "routing of %s %s by %s: share %.4g",
                                change.agent_name,
                                change.action,
                                override.requested_by or "an operator",
                                change.share,
                            )
                            out.emit("routing", change.agent_name.encode(), change)
                    case other:
                        raise misplaced(other, env.topic)
            except RecordError as exc:
                out.reject(Reject.of(self.stage, exc, env.source))
        return applied

    def decide(
        self, state: LedgerState, now: datetime, *, final: bool
    ) -> tuple[Out, CommitPlan | None]:
        """Windows and alerts due at ``now`` (to emit), and the commit due, if any."""
        out = Out()
        summaries = due_windows(state, now, self.cfg)
        for summary in summaries:
            key = f"{summary.agent_name}|{summary.model}|{summary.window_start.isoformat()}"
            if summary.upstream is not None:
                key += f"|{summary.upstream}"
            if summary.policy_version is not None:
                key += f"|v{summary.policy_version}"
            out.emit("windows", key.encode(), summary)
        alerts = drift_alerts(state, summaries, now, self.cfg)
        for alert in alerts:
            out.emit("alerts", f"{alert.agent_name}|{alert.model}".encode(), alert)
        comparisons = compare_windows(state, summaries, now, self.cfg.compare)
        for c in comparisons:
            key = f"{c.agent_name}|{c.span}|{c.window_start.isoformat()}"
            out.emit("comparisons", key.encode(), c)
        policy_models: dict[str, set[str]] = {}
        for s in summaries:
            if s.upstream == POLICY:
                policy_models.setdefault(s.agent_name, set()).add(s.model)
        for change in decide_rollout(
            state, comparisons, alerts, now, self.cfg.rollout, policy_models
        ):
            out.stats[f"routing.{change.action}"] += 1
            log.warning(
                "routing of %s: %s share %.4g -> %.4g (%s)",
                change.agent_name,
                change.action,
                change.previous_share,
                change.share,
                change.reason,
            )
            out.emit("routing", change.agent_name.encode(), change)
        started, ended = update_holds(state, summaries, alerts, now, self.cfg)
        for hold in started:
            out.stats["ledger.holds_started"] += 1
            log.warning(
                "commits held: %s/%s window mean %.4g < threshold %.4g",
                hold.agent_name,
                hold.model,
                hold.mean,
                hold.threshold,
            )
        for hold in ended:
            out.stats["ledger.holds_recovered"] += 1
            log.warning(
                "commits resume: %s/%s recovered above %.4g",
                hold.agent_name,
                hold.model,
                hold.threshold,
            )
        return out, due_commit(state, now, self.cfg, final=final)
