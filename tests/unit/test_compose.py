"""docker-compose.yml cannot start here (no Docker engine); check that it matches the real CLI
and settings, so it does not rot while nobody runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streams.cli import build_parser
from streams.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_services_are_the_broker_the_standin_the_workers_the_gateway_and_a_producer() -> None:
    assert {"kafka", "standin", "worker", "gateway", "producer"} <= set(SERVICES)
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:4.")
    env = SERVICES["kafka"]["environment"]
    assert "broker" in env["KAFKA_PROCESS_ROLES"] and "controller" in env["KAFKA_PROCESS_ROLES"]
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"


@pytest.mark.parametrize("name", [n for n, s in SERVICES.items() if "build" in s])
def test_each_trajstream_command_parses_with_the_real_cli(name: str) -> None:
    command = SERVICES[name]["command"]
    # the image's entrypoint is `trajstream`, so the command is its arguments
    args = build_parser().parse_args(command)
    assert args.command == command[0]


@pytest.mark.parametrize("name", [n for n, s in SERVICES.items() if "build" in s])
def test_each_environment_is_valid_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = SERVICES[name].get("environment", {})
    for key, value in env.items():
        assert key.startswith("TRAJSTREAM_"), f"{name}: {key} is not a trajstream setting"
        monkeypatch.setenv(key, str(value))
    load_settings()  # raises ConfigError naming any bad or unknown value


def test_workers_and_producer_reach_the_broker_and_the_standin_by_service_name() -> None:
    for name in ("worker", "producer"):
        env = SERVICES[name]["environment"]
        assert env["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert env["TRAJSTREAM_TRINITY__URL"] == "http://standin:8010"
    assert SERVICES["standin"]["command"][-1] == "8010"


def test_the_gateway_routes_by_the_workers_strategy_to_the_standin() -> None:
    gateway, worker = SERVICES["gateway"]["environment"], SERVICES["worker"]["environment"]
    assert gateway["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert gateway["TRAJSTREAM_TRINITY__URL"] == "http://standin:8010"
    for key in ("TRAJSTREAM_SELECTION__STRATEGY", "TRAJSTREAM_SELECTION__RATE"):
        assert gateway[key] == worker[key], "the gateway must route as the workers select"
    assert "8000:8000" in SERVICES["gateway"]["ports"]


def test_dockerfile_copies_what_the_package_needs() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for part in ("schemas", "streams", "pyproject.toml", 'ENTRYPOINT ["trajstream"]'):
        assert part in text
