"""What ``trajstream replay`` was asked: its options, time and offset parsing, its error.

May import: the standard library and the top-level modules.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ..errors import ConfigError, ReplayError

__all__ = ["OffsetRange", "ReplayError", "ReplayOptions", "parse_offsets", "parse_time"]


_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: datetime) -> datetime:
    """``2026-01-31T12:00:00Z`` (no zone: UTC), ``2026-01-31``, ``now``, or an age: ``90s``,
    ``30m``, ``2h``, ``7d``, ``1w`` before ``now``."""
    text = text.strip()
    if text == "now":
        return now
    age = _AGE.fullmatch(text)
    if age:
        return now - timedelta(seconds=float(age.group(1)) * _UNITS[age.group(2)])
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"bad time {text!r}: use ISO 8601 (2026-01-31T12:00Z), now, or an age like 90m, 2h, 7d"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int | None  # exclusive; None: the end of the partition when the replay starts


_OFFSETS = re.compile(r"(?P<topic>.+):(?P<partition>\d+):(?P<start>\d+)-(?P<end>\d*)")


def parse_offsets(spec: str, prefix: str) -> OffsetRange:
    """``TOPIC:PARTITION:START-END`` (END exclusive, may be left out: the end of the partition).
    TOPIC is ``agent-events`` or ``user-feedback``, with or without the prefix."""
    match = _OFFSETS.fullmatch(spec.strip())
    if not match:
        raise ConfigError(
            f"bad --offsets {spec!r}: use TOPIC:PARTITION:START-END, e.g. agent-events:0:100-200"
        )
    topic = match["topic"]
    inputs = {f"{prefix}.agent-events", f"{prefix}.user-feedback"}
    if f"{prefix}.{topic}" in inputs:
        topic = f"{prefix}.{topic}"
    if topic not in inputs:
        raise ConfigError(
            f"bad --offsets {spec!r}: {topic} is not an input topic ({', '.join(sorted(inputs))})"
        )
    start, end = int(match["start"]), int(match["end"]) if match["end"] else None
    if end is not None and end < start:
        raise ConfigError(f"bad --offsets {spec!r}: END is before START")
    return OffsetRange(topic, int(match["partition"]), start, end)


@dataclass
class ReplayOptions:
    """What ``trajstream replay`` was asked to do (the CLI's arguments, parsed)."""

    since: datetime | None = None
    until: datetime | None = None
    offsets: list[OffsetRange] = field(default_factory=list)
    strategy: str | None = None
    reward: str | None = None
    compare_reward: str | None = None
    dry_run: bool = False
    to: set[str] = field(default_factory=set)
    out: Path | None = None
    min_reward: float = 0.5
    dpo_margin: float = 0.2
    commit_every: int | None = None
    commit_interval_s: float | None = None
    redact: bool = False
    redact_patterns: list[str] = field(default_factory=list)
    lookback_s: float | None = None

    def validate(self) -> None:
        """Usage errors, before anything is read (ConfigError: exit 2)."""
        unknown = self.to - {"trinity", "files"}
        if unknown:
            raise ConfigError(f"--to {', '.join(sorted(unknown))}: use trinity or files")
        if self.offsets and (self.since or self.until):
            raise ConfigError("give a time range (--since/--until) or --offsets, not both")
        if self.since and self.until and self.until <= self.since:
            raise ConfigError(
                f"--until {self.until.isoformat()} is not after --since {self.since.isoformat()}"
            )
        if "files" in self.to and self.out is None:
            raise ConfigError("--to files needs --out DIR")
        if self.out is not None and "files" not in self.to:
            raise ConfigError("--out needs --to files")
        if self.compare_reward and self.to:
            raise ConfigError(
                "--compare-reward is a dry run that compares two reward functions; leave out --to"
            )
        if not math.isfinite(self.min_reward) or not math.isfinite(self.dpo_margin):
            raise ConfigError("--min-reward and --dpo-margin must be numbers")
        if self.lookback_s is not None and self.lookback_s < 0:
            raise ConfigError("--lookback must not be negative")
