"""What ``trajstream replay`` was asked: its options, time and offset parsing, its error.

:class:`ReplayOptions` is the one list of replay's options: each field says its command-line
flag, group, help and how its text is parsed (:func:`_opt`); :func:`add_replay_arguments`
builds the ``trajstream replay`` parser from it and :meth:`ReplayOptions.from_args` reads the
parsed arguments back, so an option is written once.

May import: the standard library and the top-level modules.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ReplayError

__all__ = [
    "OffsetRange",
    "ReplayError",
    "ReplayOptions",
    "add_replay_arguments",
    "parse_offsets",
    "parse_time",
]


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


def _opt(
    group: str,
    flag: str,
    help: str,
    default: Any = None,
    *,
    factory: Any = None,
    parse: str | None = None,
    **argparse_kw: Any,
) -> Any:
    """A field of :class:`ReplayOptions` with its command-line flag: ``group`` of the help,
    ``parse`` how the text becomes the value (``time``, ``offsets``, ``set``, ``list``), the
    rest as :meth:`argparse.ArgumentParser.add_argument` takes it."""
    cli = {"group": group, "flag": flag, "help": help, "parse": parse, "kw": argparse_kw}
    if factory is not None:
        return field(default_factory=factory, metadata={"cli": cli})
    return field(default=default, metadata={"cli": cli})


@dataclass
class ReplayOptions:
    """What ``trajstream replay`` was asked to do (the CLI's arguments, parsed); each field is
    one option of the command, in the order of its help."""

    since: datetime | None = _opt(
        "range",
        "--since",
        "start: ISO 8601 (2026-01-31T12:00Z; no zone means UTC) or an age (90m, 2h, 7d); "
        "default: the beginning of the topics",
        parse="time",
        metavar="TIME",
    )
    until: datetime | None = _opt(
        "range", "--until", "end (exclusive); default: now", parse="time", metavar="TIME"
    )
    offsets: list[OffsetRange] = _opt(
        "range",
        "--offsets",
        "explicit offsets instead of a time range (END exclusive, empty: the end of the "
        "partition), e.g. agent-events:0:100-200; repeatable",
        factory=list,
        parse="offsets",
        action="append",
        metavar="TOPIC:PARTITION:START-END",
    )
    lookback_s: float | None = _opt(
        "range",
        "--lookback",
        "also read this long before --since so that calls that started before it are "
        "complete (default: assembly.abandon_after_s)",
        type=float,
        metavar="SECONDS",
    )
    strategy: str | None = _opt(
        "scoring",
        "--strategy",
        "selection strategy (default: selection.strategy), e.g. sampling:1, marked, "
        "any(marked,sampling:0.2)",
        metavar="SPEC",
    )
    reward: str | None = _opt(
        "scoring",
        "--reward",
        "reward function (default: reward.function), e.g. streams.rewards:success or "
        "mypkg.rewards:fn",
        metavar="FUNCTION",
    )
    compare_reward: str | None = _opt(
        "scoring",
        "--compare-reward",
        "A/B: also score with this function and compare, side by side (a dry run)",
        metavar="FUNCTION",
    )
    min_reward: float = _opt(
        "scoring",
        "--min-reward",
        "threshold for SFT rows and for the A/B agreement (default 0.5)",
        0.5,
        type=float,
        metavar="X",
    )
    dry_run: bool = _opt(
        "output",
        "--dry-run",
        "count and report only; send and write nothing (the default without --to)",
        False,
        action="store_true",
    )
    to: set[str] = _opt(
        "output",
        "--to",
        "send feedback to Trinity (trinity.url) and/or write dataset files; repeatable",
        factory=set,
        parse="set",
        action="append",
        choices=["trinity", "files"],
    )
    out: Path | None = _opt(
        "output",
        "--out",
        "directory for --to files: trajectories.jsonl, sft.jsonl, dpo.jsonl, manifest.json",
        type=Path,
        metavar="DIR",
    )
    dpo_margin: float = _opt(
        "output",
        "--dpo-margin",
        "least reward difference for a DPO pair from reward ranking (default 0.2)",
        0.2,
        type=float,
        metavar="X",
    )
    commit_every: int | None = _opt(
        "output",
        "--commit-every",
        "POST /commit after every N acknowledged feedbacks (and at the end)",
        type=int,
        metavar="N",
    )
    commit_interval_s: float | None = _opt(
        "output",
        "--commit-interval",
        "or at the end of each interval of this many seconds in which feedback was "
        "acknowledged, aligned to the clock like the workers' commits (default: "
        "commit.interval_s)",
        type=float,
        metavar="SECONDS",
    )
    redact: bool = _opt(
        "redaction",
        "--redact",
        "replace e-mail addresses, phone numbers and API keys/secrets before anything leaves "
        "(files, task_id to Trinity)",
        False,
        action="store_true",
    )
    redact_patterns: list[str] = _opt(
        "redaction",
        "--redact-pattern",
        "also replace matches of this regular expression with [REDACTED]; repeatable",
        factory=list,
        parse="list",
        action="append",
        metavar="REGEX",
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace, prefix: str, now: datetime) -> ReplayOptions:
        """The options of parsed ``trajstream replay`` arguments (``prefix``: the topics'
        prefix, for ``--offsets``; ``now``: for ages like ``--since 2h``)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = getattr(args, f.name)
            parse = f.metadata["cli"]["parse"]
            if parse == "time":
                values[f.name] = parse_time(raw, now) if raw else None
            elif parse == "offsets":
                values[f.name] = [parse_offsets(spec, prefix) for spec in raw or []]
            elif parse == "set":
                values[f.name] = set(raw or [])
            elif parse == "list":
                values[f.name] = list(raw or [])
            else:
                values[f.name] = raw
        return cls(**values)

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


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of :class:`ReplayOptions` on ``parser``, in their groups."""
    groups: dict[str, Any] = {}
    for f in fields(ReplayOptions):
        cli = f.metadata["cli"]
        group = groups.get(cli["group"])
        if group is None:
            group = groups[cli["group"]] = parser.add_argument_group(cli["group"])
        kw = dict(cli["kw"])
        if cli["parse"] not in ("offsets", "set", "list") and kw.get("action") != "store_true":
            kw["default"] = f.default
        elif kw.get("action") == "append":
            kw["default"] = []
        group.add_argument(cli["flag"], dest=f.name, help=cli["help"], **kw)
