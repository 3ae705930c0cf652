"""``trajstream audit``: every selection decision on ``<p>.decisions``, counted by agent,
strategy, decision and reason, as a table.

May import: the package's models, codec, settings, topics and errors, :mod:`streams.io.kafka`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ..codec import SchemaRegistry
from ..errors import ConfigError
from ..io import kafka
from ..models import SelectionDecision
from ..settings import Settings
from ..topics import Topics

__all__ = ["audit_table", "count_decisions"]

Row = tuple[str, str, str, str]


async def count_decisions(settings: Settings, bootstrap: str) -> Counter[Row]:
    """The decisions ``<p>.decisions`` holds now, per (agent, strategy, decision, reason);
    read whole with the one range reader, joining no group."""
    topic = Topics(settings.kafka.topic_prefix, settings.kafka.partitions).decisions
    codec = SchemaRegistry.default()
    counts: Counter[Row] = Counter()
    partitions = (await kafka.topic_partitions(bootstrap, settings.kafka.security)).get(topic)
    if partitions is None:
        raise ConfigError(f"topic {topic} does not exist (kafka.topic_prefix?)")
    consumer = kafka.consumer(bootstrap, settings.kafka.security, group_id=None)
    await consumer.start()
    try:
        for m in await kafka.read_whole(consumer, topic, partitions):
            d = codec.decode_as(m.value, SelectionDecision)
            decision = "selected" if d.selection.selected else "rejected"
            counts[(d.agent_name or "-", d.selection.strategy, decision, d.selection.reason)] += 1
    finally:
        await consumer.stop()
    return counts


def audit_table(counts: Mapping[Row, int]) -> str:
    """The audit's rows under a header, each column as wide as its longest value."""
    header = ("agent", "strategy", "decision", "reason", "calls")
    rows = [(*key, str(n)) for key, n in sorted(counts.items())]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        lines.append(" ".join([*cells, row[-1].rjust(max(widths[-1], 7))]))
    return "\n".join(lines)
