"""The SDK's topics follow the settings when the caller names none (kafka.topic_prefix)."""

from __future__ import annotations

import asyncio
import inspect
import os
from pathlib import Path
from typing import Any

import pytest

import streams.settings as settings_module
from streams.capture.openai_wrapper import TrajstreamCapture
from streams.capture.sdk import TrajstreamProducer, default_topics
from streams.errors import ConfigError


class _NoProducer:
    """Stands in for the aiokafka producer: these tests never send."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TRAJSTREAM_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(settings_module, "_CONFIG_FILE", {})


def _producer(**kwargs: Any) -> TrajstreamProducer:
    fake: Any = _NoProducer()
    return TrajstreamProducer("localhost:9092", producer=fake, **kwargs)


def test_without_settings_the_prefix_is_the_settings_default() -> None:
    topics = _producer().topics
    assert topics.agent_events == "trajstream.agent-events"
    assert topics.user_feedback == "trajstream.user-feedback"
    assert topics.partitions == 4


def test_the_environment_s_topic_prefix_is_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_KAFKA__TOPIC_PREFIX", "support")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__PARTITIONS", "12")
    topics = _producer().topics
    assert topics.agent_events == "support.agent-events"
    assert topics.user_feedback == "support.user-feedback"
    assert topics.partitions == 12


def test_a_config_file_s_topic_prefix_is_followed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "prod.toml"
    config.write_text('[kafka]\ntopic_prefix = "support"\n')
    monkeypatch.setenv("TRAJSTREAM_CONFIG", str(config))
    assert _producer().topics.agent_events == "support.agent-events"


def test_a_command_s_config_file_is_followed(tmp_path: Path) -> None:
    config = tmp_path / "prod.toml"
    config.write_text('[kafka]\ntopic_prefix = "billing"\n')
    settings_module.load_settings(config)  # what `trajstream --config prod.toml ...` does
    assert _producer().topics.agent_events == "billing.agent-events"


def test_a_prefix_given_wins_over_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_KAFKA__TOPIC_PREFIX", "support")
    topics = _producer(topic_prefix="trajstream", partitions=2).topics
    assert topics.agent_events == "trajstream.agent-events"
    assert topics.partitions == 2
    # each left unset follows the settings on its own
    assert _producer(partitions=2).topics.agent_events == "support.agent-events"


def test_a_bad_setting_is_named_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_KAFKA__TOPIC_PREFIX", "not a prefix")
    with pytest.raises(ConfigError, match="topic_prefix"):
        _producer()
    # a caller that names its topics does not read the settings at all
    assert _producer(topic_prefix="ok", partitions=4).topics.agent_events == "ok.agent-events"


def test_from_settings_and_the_wrapper_take_the_same_default() -> None:
    settings = settings_module.load_settings(kafka={"topic_prefix": "support"})

    async def build() -> TrajstreamProducer:  # aiokafka's producer wants a running loop
        return TrajstreamProducer.from_settings(settings, "localhost:9092")

    assert asyncio.run(build()).topics.agent_events == "support.agent-events"
    for name in ("topic_prefix", "partitions"):
        assert inspect.signature(TrajstreamCapture).parameters[name].default is None
    assert default_topics(None, None).agent_events == "trajstream.agent-events"
