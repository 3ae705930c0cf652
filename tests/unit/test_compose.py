"""docker-compose.yml cannot start here (no Docker engine); check that it matches the real CLI
and settings, so it does not rot while nobody runs it: each service's command and environment
(interpolated as ``docker compose`` does) go through :func:`streams.cli.startup`, the parsing,
settings and start-up checks the process itself runs first."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.cli import build_parser, startup
from streams.errors import ConfigError
from streams.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docker-compose.yml").read_text()

_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\})")


def interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Compose's interpolation: ``${VAR}``, ``${VAR:-default}`` (unset or empty),
    ``${VAR-default}`` (unset), ``$$`` for a literal ``$``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        value = environ.get(m["name"])
        if m["op"] == ":-" and not value:
            return m["default"]
        if m["op"] == "-" and value is None:
            return m["default"]
        return value or ""

    return _VARIABLE.sub(one, text)


def _interpolated(node: Any, environ: Mapping[str, str]) -> Any:
    # compose interpolates the values of the parsed file, so a JSON value stays one string
    if isinstance(node, str):
        return interpolate(node, environ)
    if isinstance(node, dict):
        return {k: _interpolated(v, environ) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolated(v, environ) for v in node]
    return node


def services(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    return _interpolated(yaml.safe_load(TEXT), environ or {})["services"]


SERVICES = services()


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
    assert "127.0.0.1:8000:8000" in SERVICES["gateway"]["ports"]


def start_checks(name: str, env: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """What the service's process runs before it touches anything: parse, settings, checks."""
    for key in list(os.environ):
        if key.startswith(("TRAJSTREAM_", "FAUST_", "F_")):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    startup(list(SERVICES[name]["command"]))


@pytest.mark.parametrize("name", [n for n, s in SERVICES.items() if "build" in s])
def test_each_service_passes_the_start_up_checks_of_its_command(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    start_checks(name, SERVICES[name].get("environment", {}), monkeypatch)


def test_the_gateway_takes_its_client_key_from_the_environment_with_a_demo_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert SERVICES["gateway"]["environment"]["TRAJSTREAM_GATEWAY__API_KEYS"] == "demo-key"
    mine = services({"TRAJSTREAM_GATEWAY__API_KEYS": '[{"key": "support-key-1", "agent": "support"}]'})
    env = mine["gateway"]["environment"]
    start_checks("gateway", env, monkeypatch)
    keys = load_settings().gateway.api_keys
    assert [(k.key.get_secret_value(), k.agent) for k in keys] == [("support-key-1", "support")]


def test_a_gateway_on_all_addresses_without_a_key_would_refuse_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above can fail: the compose file as it was (no key) is refused, naming it."""
    env = dict(SERVICES["gateway"]["environment"])
    del env["TRAJSTREAM_GATEWAY__API_KEYS"]
    with pytest.raises(ConfigError, match=r"gateway\.api_keys \[TRAJSTREAM_GATEWAY__API_KEYS\]"):
        start_checks("gateway", env, monkeypatch)


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET} $$x", env) == (
        "x d  d  $x"
    )


def test_dockerfile_copies_what_the_package_needs() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for part in ("schemas", "streams", "pyproject.toml", 'ENTRYPOINT ["trajstream"]'):
        assert part in text


def _seconds(duration: str) -> float:
    """Compose's durations as this file writes them: ``30s``, ``1m30s``."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, f"unreadable duration {duration!r}"
    return 60 * int(parts[1] or 0) + int(parts[2] or 0)


@pytest.mark.parametrize("name", ["worker", "gateway"])
def test_a_graceful_stop_gets_its_time_before_compose_kills_the_container(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compose kills a container 10 s after SIGTERM unless told otherwise; the worker's final
    commit and flush take up to ``stop_timeout_s``, the gateway's flush ``flush_timeout_s``."""
    start_checks(name, SERVICES[name]["environment"], monkeypatch)
    settings = load_settings()
    needed = settings.stop_timeout_s if name == "worker" else settings.gateway.flush_timeout_s
    grace = _seconds(SERVICES[name].get("stop_grace_period", "10s"))
    assert grace > needed, f"{name}: stop_grace_period {grace:g}s, its stop needs {needed:g}s"


def test_what_the_gateway_spilled_outlives_its_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """``docker compose down`` removes containers, not named volumes: the spill directory must be
    one, or records the broker never received go with the container."""
    start_checks("gateway", SERVICES["gateway"]["environment"], monkeypatch)
    spill_dir = str(load_settings().gateway.spill_dir)
    # short syntax: SOURCE:TARGET[:MODE]; a SOURCE not a path is a named volume
    mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["gateway"].get("volumes", [])}
    source = mounts.get(spill_dir)
    assert source is not None, f"{spill_dir} is not mounted: it would go with the container"
    assert not source.startswith((".", "/", "~")), f"{spill_dir} is on a bind mount, {source}"
    assert source in (yaml.safe_load(TEXT).get("volumes") or {}), f"volume {source} undeclared"


def test_compose_durations_read_as_compose_reads_them() -> None:
    assert [_seconds(d) for d in ("30s", "1m", "1m30s")] == [30, 60, 90]
