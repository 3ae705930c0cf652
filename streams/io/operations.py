"""Operator records: what an operator writes for the workers to act on (``trajstream commits
resume``: a :class:`~streams.models.CommitResume` on ``<p>.ledger``, which the ledger, the one
decision maker, applies).

An operator action: whoever may write the ledger topic may resume commits (grant it to the
workers' principal and to operators only).

May import: the package's models, codec, settings, topics, :mod:`streams.io.kafka`.
"""

from __future__ import annotations

from ..codec import SchemaRegistry
from ..models import CommitResume, utcnow
from ..settings import Settings
from ..topics import Topics
from . import kafka

__all__ = ["resume_commits"]


async def resume_commits(
    settings: Settings,
    bootstrap: str,
    agent: str | None,
    model: str | None,
    by: str = "",
    reason: str = "",
) -> CommitResume:
    """Ask the ledger to end the commit holds of ``agent`` and ``model`` (None: any); the
    record published, keyed ``agent|model`` (``*`` for any) on the ledger's one partition."""
    record = CommitResume(
        agent_name=agent, model=model, requested_at=utcnow(), requested_by=by, reason=reason
    )
    topic = Topics(settings.kafka.topic_prefix, settings.kafka.partitions).ledger
    key = f"{agent or '*'}|{model or '*'}".encode()
    client = kafka.producer(bootstrap, settings.kafka.security)
    await client.start()
    try:
        await client.send_and_wait(
            topic, SchemaRegistry.default().encode(record), key=key, partition=0
        )
    finally:
        await client.stop()
    return record
