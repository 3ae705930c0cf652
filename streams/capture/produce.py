"""``trajstream produce``: publish JSON-lines files of agent events.

For producers in other languages and for captured traffic. One event per line, an object with a
``type`` of ``agent_call``, ``completion`` or ``user_feedback`` and the fields of that record
(see ``schemas/``; timestamps as ISO 8601 with a timezone, e.g. ``2026-01-31T12:00:00Z``)::

    {"type": "agent_call", "event_id": "e1", "call_id": "c1", "phase": "START",
     "event_time": "2026-01-31T12:00:00Z"}

(shown on two lines here; one line in the file)

Every line is validated before anything is published. Invalid lines are reported with their line
number and reason, and then nothing is published unless ``skip_invalid`` is set.

May import: pydantic, the top-level modules (models, codec).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pydantic

from ..codec import _summarise
from ..errors import ConfigError
from ..models import AgentCall, Completion, UserFeedback

__all__ = ["LineError", "Parsed", "input_files", "parse_lines", "read_events"]

TYPES: dict[str, type[AgentCall] | type[Completion] | type[UserFeedback]] = {
    "agent_call": AgentCall,
    "completion": Completion,
    "user_feedback": UserFeedback,
}


@dataclass(frozen=True)
class LineError:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass
class Parsed:
    events: list[AgentCall | Completion | UserFeedback] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)


def parse_lines(lines: Iterable[str]) -> Parsed:
    """Validate every line; blank lines are skipped."""
    out = Parsed()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            out.errors.append(LineError(number, f"not JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(obj, dict):
            out.errors.append(LineError(number, "not a JSON object"))
            continue
        kind = obj.pop("type", None)
        model = TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            out.errors.append(
                LineError(number, f"type must be one of {', '.join(TYPES)}, got {kind!r}")
            )
            continue
        try:
            out.events.append(model.model_validate(obj))
        except pydantic.ValidationError as exc:
            out.errors.append(LineError(number, f"invalid {kind}: {_summarise(exc)}"))
    return out


def read_events(path: Path) -> Parsed:
    """Parse a file; a line that is not UTF-8 is reported with its number, like any bad line."""
    lines: list[str] = []
    undecodable: list[LineError] = []
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                reason = f"not UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
                undecodable.append(LineError(number, reason))
                lines.append("")  # keeps the numbering; blank lines are skipped
    parsed = parse_lines(lines)
    parsed.errors = sorted([*parsed.errors, *undecodable], key=lambda e: e.line)
    return parsed


def input_files(paths: Iterable[Path]) -> list[Path]:
    """The files ``trajstream produce`` reads: each file named, and the ``*.jsonl`` files of
    each directory named (in name order). A path that is neither, or a directory without a
    ``.jsonl`` file, is a :class:`~streams.errors.ConfigError` saying which."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.jsonl") if p.is_file())
            if not found:
                raise ConfigError(f"input directory {path} holds no .jsonl file")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise ConfigError(f"input {path} is neither a file nor a directory")
        else:
            raise ConfigError(f"input file {path} does not exist")
    return files
