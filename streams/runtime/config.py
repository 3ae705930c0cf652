"""What both runners take from the settings in the same way: the assembly limits and the
ledger's configuration (so live and replay cannot read them differently).

May import: the core, :mod:`streams.settings`. No faust, no Kafka.
"""

from __future__ import annotations

from datetime import timedelta

from ..core.assembly import Limits
from ..core.ledger import LedgerConfig
from ..settings import Settings

__all__ = ["ledger_config_of", "limits_of"]


def limits_of(settings: Settings) -> Limits:
    """The assembly limits the settings name (both runners use them)."""
    return Limits(
        max_steps=settings.assembly.max_steps,
        max_bytes=settings.assembly.max_bytes,
        abandon_after=timedelta(seconds=settings.assembly.abandon_after_s),
        max_future=timedelta(seconds=settings.assembly.max_future_s),
    )


def ledger_config_of(settings: Settings) -> LedgerConfig:
    return LedgerConfig(
        interval=timedelta(seconds=settings.commit.interval_s),
        min_batch=settings.commit.min_batch,
        commit_empty=settings.commit.commit_empty,
        window=timedelta(seconds=settings.windows.size_s),
        grace=timedelta(seconds=settings.windows.grace_s),
        drift_fraction=settings.windows.drift_fraction,
        drift_history=settings.windows.drift_history,
        hold_on_drift=settings.commit.hold_on_drift,
    )
