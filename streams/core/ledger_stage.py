"""Stage 4, ledger: a batch of ``<p>.ledger`` records -> reward windows, drift alerts, a commit.

:class:`LedgerStage` is the stage over one store holding one :class:`~streams.models.LedgerState`
(key ``state``). :meth:`LedgerStage.apply` applies a batch of records (acknowledgements and
ticks; each offset once, so records redelivered after a crash are not counted twice);
:meth:`LedgerStage.decide` returns the windows and alerts that are due and the commit plan, if
one is due. The commit itself follows :mod:`streams.core.commits`. The rules of windows and
commit timing are in :mod:`streams.core.ledger`.

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..codec import SchemaRegistry
from ..errors import RecordError
from ..models import FeedbackAck, LedgerState, Tick
from .effects import Out, Reject, Source
from .ledger import CommitPlan, LedgerConfig, apply_ack, drift_alerts, due_commit, due_windows
from .store import Store

__all__ = ["LEDGER_KEY", "Applied", "LedgerStage"]

LEDGER_KEY = b"state"


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

    def load(self) -> LedgerState:
        raw = self.store.get(LEDGER_KEY)
        return self.codec.decode_as(raw, LedgerState) if raw else LedgerState()

    def save(self, state: LedgerState) -> None:
        self.store.set(LEDGER_KEY, self.codec.encode(state))

    def exists(self) -> bool:
        return self.store.get(LEDGER_KEY) is not None

    def apply(self, state: LedgerState, batch: list[Source], now: datetime) -> Applied:
        applied = Applied(Out())
        out = applied.out
        for src in batch:
            if src.offset <= state.applied_offset:
                # applied before a restart: the state restored from the changelog has it
                out.stats["ledger.reapplied"] += 1
                continue
            state.applied_offset = src.offset
            try:
                record = self.codec.decode(src.value)
                if isinstance(record, FeedbackAck):
                    if not apply_ack(state, record, now, self.cfg):
                        out.stats["ledger.duplicate_acks"] += 1
                elif isinstance(record, Tick):
                    applied.final = applied.final or record.final
                else:
                    raise RecordError(f"{record.avro_name} does not belong on {src.topic}")
            except RecordError as exc:
                reason = str(exc) or type(exc).__name__
                out.reject(Reject(self.stage, reason, type(exc).__name__, src))
        return applied

    def decide(
        self, state: LedgerState, now: datetime, *, final: bool
    ) -> tuple[Out, CommitPlan | None]:
        """Windows and alerts due at ``now`` (to emit), and the commit due, if any."""
        out = Out()
        summaries = due_windows(state, now, self.cfg)
        for summary in summaries:
            key = f"{summary.agent_name}|{summary.model}|{summary.window_start.isoformat()}"
            out.emit("windows", key.encode(), summary)
        for alert in drift_alerts(state, summaries, now, self.cfg):
            out.emit("alerts", f"{alert.agent_name}|{alert.model}".encode(), alert)
        return out, due_commit(state, now, self.cfg, final=final)
