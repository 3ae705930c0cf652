"""What ``trajstream status``, the status page and ``trajstream compare`` read Kafka with:
:class:`TopicReader` (the deployment's topics and its group's offsets; joins no group, commits
nothing), and the topics the workers consume.

May import aiokafka, the package's models, codec, settings, topics and errors, and
:mod:`streams.io.kafka` (the one range reader).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import GroupCoordinatorNotAvailableError, KafkaError

from ..codec import SchemaRegistry
from ..errors import BrokerError, RecordError
from ..io import kafka
from ..settings import KafkaSecuritySettings
from ..topics import Topics
from .snapshot import Member

__all__ = [
    "TopicReader",
    "input_topics",
]


def input_topics(topics: Topics) -> list[str]:
    """The topics the workers consume (their lag is the group's lag)."""
    return [
        topics.agent_events,
        topics.user_feedback,
        topics.ticks,
        topics.trajectories,
        topics.rewarded,
        topics.ledger,
    ]


class TopicReader:
    """Reads the deployment's topics and its group's offsets; joins no group, commits nothing.

    Use as an async context manager. Every Kafka client of the status command and the status
    page is made here (one place to give them the cluster's security settings).
    """

    def __init__(
        self,
        bootstrap: str,
        codec: SchemaRegistry | None = None,
        security: KafkaSecuritySettings | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.codec = codec or SchemaRegistry.default()
        # the cluster's security settings (kafka.security) on every client, as everywhere
        self.consumer = kafka.consumer(
            bootstrap, security, group_id=None, client_id="trajstream-status"
        )
        # offset requests on a consumer of their own: on the reading one they would queue
        # behind its long-polling fetches (fetch_max_wait_ms each)
        self.offsets = kafka.consumer(
            bootstrap, security, group_id=None, client_id="trajstream-status"
        )
        self.admin = kafka.admin(bootstrap, security)
        self._partitions: dict[str, list[int]] = {}

    async def __aenter__(self) -> TopicReader:
        try:
            await self.admin.start()
            await self.consumer.start()
            await self.offsets.start()
        except KafkaError as exc:
            await self.aclose()
            raise BrokerError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from exc
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for close in (self.consumer.stop, self.offsets.stop, self.admin.close):
            try:
                await close()
            except Exception:
                pass

    async def refresh(self) -> dict[str, list[int]]:
        """Every topic of the cluster with its partitions (nothing is created)."""
        names = await self.admin.list_topics()
        described = await self.admin.describe_topics(list(names)) if names else []
        self._partitions = {
            d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described
        }
        return self._partitions

    async def warm(self, topics: Iterable[str]) -> None:
        """Fetch the consumer's metadata for all of ``topics`` at once: one round trip instead
        of one (with a back-off) per topic at its first offset request."""
        tps = [tp for t in topics for tp in self.partitions(t)]
        if tps:
            await self.offsets.end_offsets(tps)

    def partitions(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in self._partitions.get(topic, [])]

    def exists(self, topic: str) -> bool:
        return topic in self._partitions

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self.offsets.end_offsets(list(tps))) if tps else {}

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self.offsets.beginning_offsets(list(tps))) if tps else {}

    async def offsets_at(
        self, tps: Sequence[TopicPartition], at: datetime, ends: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The first offset at or after ``at`` per partition (the end when none is that late)."""
        if not tps:
            return {}
        millis = max(0, int(at.timestamp() * 1000))
        found = await self.offsets.offsets_for_times({tp: millis for tp in tps})
        return {tp: found[tp].offset if found.get(tp) else ends[tp] for tp in tps}

    async def read(
        self, ranges: dict[TopicPartition, tuple[int, int]], stall_s: float = 10.0
    ) -> list[Any]:
        """The raw records of each ``[start, end)`` range, in partition order."""
        # a compacted or truncated range stalls: what was there was read
        out = await kafka.fetch_ranges(
            self.consumer, ranges, stall_s=stall_s, on_stall="stop", max_records=5000
        )
        return [m for tp in sorted(out) for m in out[tp]]

    async def since(self, topic: str, at: datetime, limit: int = 1000) -> list[Any]:
        """The raw records of ``topic`` from ``at`` on, at most ``limit`` per partition (the
        newest), oldest first by timestamp."""
        tps = self.partitions(topic)
        ends = await self.end_offsets(tps)
        starts = await self.offsets_at(tps, at, ends)
        ranges = {tp: (max(starts[tp], ends[tp] - limit), ends[tp]) for tp in tps}
        return sorted(await self.read(ranges), key=lambda m: (m.timestamp, m.offset))

    async def tail(self, topic: str, n: int) -> list[Any]:
        """The last ``n`` raw records of each partition of ``topic``, oldest first by time."""
        tps = self.partitions(topic)
        ends = await self.end_offsets(tps)
        firsts = await self.beginning_offsets(tps)
        ranges = {tp: (max(firsts[tp], ends[tp] - n), ends[tp]) for tp in tps}
        return sorted(await self.read(ranges), key=lambda m: (m.timestamp, m.offset))

    def decode(self, messages: Iterable[Any], kind: type[Any]) -> list[Any]:
        """Decode records of one type; a record that does not decode is left out (the
        workers dead-letter bad input; a reader only reports)."""
        out = []
        for m in messages:
            try:
                out.append(self.codec.decode_as(m.value, kind))
            except (RecordError, ValueError):
                continue
        return out

    async def group(self, group_id: str) -> tuple[str, list[Member]]:
        """The group's state and members, with each member's assigned partitions. A group
        whose coordinator is not there (a cluster where no group ever committed: no offsets
        topic yet) is a dead group without members."""
        try:
            responses = await self.admin.describe_consumer_groups([group_id])
        except GroupCoordinatorNotAvailableError:
            return "Dead", []
        state, members = "Dead", []
        for response in responses:
            for group in response.to_object()["groups"]:
                if group["group"] != group_id or group["error_code"]:
                    continue
                state = group["state"] or "Dead"
                for member in group["members"]:
                    partitions: dict[str, list[int]] = {}
                    if member["member_assignment"]:
                        try:
                            decoded = ConsumerProtocolMemberAssignment.decode(
                                member["member_assignment"]
                            )
                            partitions = {t: sorted(ps) for t, ps in decoded.assignment}
                        except Exception:  # not the consumer protocol: partitions unknown
                            partitions = {}
                    members.append(
                        Member(
                            member_id=member["member_id"],
                            client_id=member["client_id"],
                            host=member["client_host"].lstrip("/"),
                            partitions=partitions,
                        )
                    )
        return state, sorted(members, key=lambda m: (m.host, m.member_id))

    async def committed(self, group_id: str) -> dict[TopicPartition, int]:
        try:
            offsets = await self.admin.list_consumer_group_offsets(group_id)
        except GroupCoordinatorNotAvailableError:  # no group ever committed here
            return {}
        return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
