"""streams.io.kafka.create_topics over a scripted admin client: the moments of a topic that
another process is creating (listed without partitions, "already exists" on create) that a
single broker rarely shows, and that a three-broker cluster showed as a worker refusing to
start. The real broker's side is tests/integration/test_topics.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import TopicAlreadyExistsError

from streams.errors import BrokerError
from streams.io import kafka


@dataclass
class ScriptedAdmin:
    listed: list[str]
    # per topic, the partition counts its descriptions show in turn (the last one repeats);
    # None: described with LEADER_NOT_AVAILABLE
    shown: dict[str, list[int | None]]
    create_raises: bool = False
    created: list[str] = field(default_factory=list)
    described: int = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        return list(self.listed)

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": 1}]}

    async def create_topics(self, topics: list[Any]) -> Any:
        if self.create_raises:
            raise TopicAlreadyExistsError
        self.created += [t.name for t in topics]

        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in topics])

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.described += 1
        out = []
        for name in names:
            counts = self.shown[name]
            n = counts.pop(0) if len(counts) > 1 else counts[0]
            out.append(
                {"topic": name, "error_code": 5, "partitions": []}
                if n is None
                else {"topic": name, "error_code": 0, "partitions": [{}] * n}
            )
        return out


def use(monkeypatch: pytest.MonkeyPatch, client: ScriptedAdmin) -> None:
    monkeypatch.setattr(kafka, "admin", lambda *a, **k: client)


async def test_a_topic_listed_before_its_partitions_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = ScriptedAdmin(listed=["p.a", "p.b"], shown={"p.a": [0, 0, 4], "p.b": [None, 4]})
    use(monkeypatch, client)
    assert await kafka.create_topics("broker:9092", {"p.a": 4, "p.b": 4}) == []
    assert client.described == 3


async def test_a_topic_another_process_created_meanwhile_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = ScriptedAdmin(listed=[], shown={"p.a": [2]}, create_raises=True)
    use(monkeypatch, client)
    with pytest.raises(BrokerError, match=r"topic p\.a has 2 partitions.*kafka\.partitions"):
        await kafka.create_topics("broker:9092", {"p.a": 4})


async def test_topics_created_here_are_checked_once_they_have_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = ScriptedAdmin(listed=["p.a"], shown={"p.a": [4], "p.b": [None, None, 4]})
    use(monkeypatch, client)
    assert await kafka.create_topics("broker:9092", {"p.a": 4, "p.b": 4}) == ["p.b"]
    assert client.created == ["p.b"]


async def test_a_topic_that_never_gets_partitions_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka, "CREATING_TIMEOUT_S", 0.3)
    client = ScriptedAdmin(listed=["p.a", "p.b"], shown={"p.a": [4], "p.b": [0]})
    use(monkeypatch, client)
    with pytest.raises(BrokerError, match=r"topic\(s\) p\.b still have no partitions after 0\.3s"):
        await kafka.create_topics("broker:9092", {"p.a": 4, "p.b": 4})
