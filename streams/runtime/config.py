"""What both runners take from the settings in the same way: the assembly limits, the
ledger's configuration and the LLM judge (so live and replay cannot read them differently).

May import: the core, :mod:`streams.settings`. No faust, no Kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from ..core.assembly import Limits
from ..core.compare import CompareConfig
from ..core.judge import JudgeSpec
from ..core.ledger import LedgerConfig
from ..core.rewards import Rewarder
from ..core.rollout import RolloutConfig
from ..errors import ConfigError
from ..settings import Settings

__all__ = ["judge_of", "ledger_config_of", "limits_of", "rollout_config_of"]


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
        compare=CompareConfig(
            level=settings.compare.level,
            min_count=settings.compare.min_count,
            trailing_windows=settings.compare.trailing_windows,
        ),
        rollout=rollout_config_of(settings),
    )


def rollout_config_of(settings: Settings) -> RolloutConfig:
    """``gateway.rollout`` as the core's config: the same fields, the delay as a timedelta."""
    r = settings.gateway.rollout
    fields = r.model_dump(exclude={"apply_delay_s"})
    return RolloutConfig(**fields, apply_delay=timedelta(seconds=r.apply_delay_s))


def judge_of(settings: Settings, rewarders: Sequence[Rewarder]) -> JudgeSpec | None:
    """The judge the ``reward.judge`` settings describe, when a reward function needs its
    verdicts (None otherwise); a judge reward without them fails here, naming what is missing."""
    if not any(r.needs_verdict for r in rewarders):
        return None
    j = settings.reward.judge
    missing = j.missing()
    if missing:
        names = ", ".join(r.name for r in rewarders if r.needs_verdict)
        raise ConfigError(
            f"the reward function {names} needs the LLM judge: set {', '.join(missing)}"
        )
    assert j.model is not None and j.rubric_file is not None
    return JudgeSpec(
        model=j.model,
        rubric=j.rubric_file.read_text(encoding="utf-8"),
        max_prompt_chars=j.max_prompt_chars,
    )
