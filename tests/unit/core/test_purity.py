"""The core imports no Faust, Kafka client or HTTP library, and nothing outside the core but
the top-level modules: it is tested, and replayed, without a broker or a server."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import streams.core

FORBIDDEN = ("faust", "aiokafka", "aiohttp", "httpx", "mode")
OUTSIDE = ("streams.runtime", "streams.io", "streams.capture", "streams.devtools", "streams.cli")


def test_every_core_module_imports_without_faust_kafka_or_http() -> None:
    modules = [f"streams.core.{m.name}" for m in pkgutil.iter_modules(streams.core.__path__)]
    assert {"streams.core.assemble", "streams.core.reward_join", "streams.core.commits"} <= set(
        modules
    )
    # a fresh interpreter: this test process has imported faust and httpx already
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
    )
    bad = [m for m in loaded if m.split(".")[0] in FORBIDDEN or m.startswith(OUTSIDE)]
    assert bad == [], f"the core imported {bad}"
