"""What every test run shares: SIGTERM tears the fixtures down (:mod:`tests.interrupt`), and,
when the run is spread over several processes (pytest-xdist, ``./dev test``), one Kafka broker.

Under xdist the controller starts the local broker once, before its workers start, and hands
its address to them in ``PYTEST_TRAJSTREAM_BOOTSTRAP`` (read by the ``kafka_bootstrap`` fixture
of ``tests/integration/conftest.py``); it stops it when the run ends, also after a failure or
SIGTERM. Without xdist, the fixture starts the broker itself, as before. A run of unit tests only
starts none.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.interrupt import install

# Property tests check properties, not speed: no per-example deadline (Hypothesis's default
# 200 ms fails an example that a loaded machine merely ran slowly); timing is for bench/.
settings.register_profile("trajstream", deadline=None)
settings.load_profile("trajstream")

SHARED_BOOTSTRAP = "PYTEST_TRAJSTREAM_BOOTSTRAP"
ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("TRAJSTREAM_CACHE_DIR", ROOT / ".cache" / "trajstream"))


def _configured_cluster() -> bool:
    return bool(
        os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        or os.environ.get("TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS")
        or os.environ.get(SHARED_BOOTSTRAP)
    )


def _selects_integration(config: pytest.Config) -> bool:
    unit = (ROOT / "tests" / "unit").resolve()
    paths = [Path(a.split("::")[0]) for a in config.args] or [ROOT / "tests"]
    return any(not (ROOT / p).resolve().is_relative_to(unit) for p in paths)


def _is_xdist_controller(config: pytest.Config) -> bool:
    return (
        not hasattr(config, "workerinput")
        and config.pluginmanager.has_plugin("xdist")
        and bool(getattr(config.option, "numprocesses", None))
        and not getattr(config.option, "collectonly", False)
    )


def pytest_configure(config: pytest.Config) -> None:
    install()
    if _is_xdist_controller(config) and not _configured_cluster() and _selects_integration(config):
        from streams.devtools.broker import LocalBroker

        broker = LocalBroker(CACHE_DIR)
        config.stash[_BROKER] = broker
        os.environ[SHARED_BOOTSTRAP] = broker.start(timeout=180)


def pytest_unconfigure(config: pytest.Config) -> None:
    broker = config.stash.get(_BROKER, None)
    if broker is not None:
        os.environ.pop(SHARED_BOOTSTRAP, None)
        broker.stop()


_BROKER = pytest.StashKey[object]()
