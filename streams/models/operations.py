"""Operators' records, accepted only on the ledger topic: resuming held commits, pinning or
releasing an agent's rollout.

May import: pydantic, the standard library and :mod:`streams.models.base`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from .base import AvroModel, NonEmpty, UtcDateTime

__all__ = [
    "CommitResume",
    "RoutingOverride",
]


class CommitResume(AvroModel):
    """An operator's request to resume held commits; accepted only on the ledger topic."""

    avro_name: ClassVar[str] = "io.trajstream.CommitResume"
    agent_name: str | None = None
    model: str | None = None
    requested_at: UtcDateTime
    requested_by: str = ""
    reason: str = ""


class RoutingOverride(AvroModel):
    """An operator's pin (share) or release (share None) of an agent's rollout; ledger only."""

    avro_name: ClassVar[str] = "io.trajstream.RoutingOverride"
    agent_name: NonEmpty
    share: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    requested_at: UtcDateTime
    requested_by: str = ""
    reason: str = ""
