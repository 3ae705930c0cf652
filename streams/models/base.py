"""What every record model shares: the base class bound to an Avro schema, UTC timestamps at
millisecond precision, the enums and the constrained field types.

May import: pydantic and the standard library only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "AvroModel",
    "CallPhase",
    "CallStatus",
    "Count32",
    "Count64",
    "FeedbackKind",
    "Int32",
    "NonEmpty",
    "StepKind",
    "UtcDateTime",
    "utcnow",
]


def _to_utc_millis(value: datetime) -> datetime:
    if value.tzinfo is UTC and not value.microsecond % 1000:
        return value  # as decoded from Avro (timestamp-millis): nothing to change
    if value.tzinfo is None:
        raise ValueError("timestamp has no timezone; send UTC, e.g. 2026-01-31T12:00:00Z")
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


UtcDateTime = Annotated[datetime, AfterValidator(_to_utc_millis)]
"""A timezone-aware datetime, normalised to UTC at millisecond precision."""


def utcnow() -> datetime:
    """Now, in UTC, at millisecond precision (what survives an Avro round trip)."""
    return _to_utc_millis(datetime.now(UTC))


class CallPhase(StrEnum):
    START = "START"
    END = "END"


class CallStatus(StrEnum):
    OK = "OK"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"


class StepKind(StrEnum):
    LLM = "LLM"
    TOOL = "TOOL"


class FeedbackKind(StrEnum):
    RATING = "RATING"
    THUMBS = "THUMBS"
    CORRECTION = "CORRECTION"
    PREFERENCE = "PREFERENCE"


class AvroModel(BaseModel):
    """Base of every record model: strict about unknown fields, bound to one Avro schema."""

    model_config = ConfigDict(extra="forbid", frozen=False, use_enum_values=False)
    avro_name: ClassVar[str]

    def to_avro(self) -> dict[str, Any]:
        """The record as fastavro writes it."""
        return self.model_dump(mode="python")


NonEmpty = Annotated[str, Field(min_length=1)]


Int32 = Annotated[int, Field(ge=-(2**31), lt=2**31)]


Count32 = Annotated[int, Field(ge=0, lt=2**31)]


Count64 = Annotated[int, Field(ge=0, lt=2**63)]
