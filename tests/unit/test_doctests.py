"""The examples in the package's docstrings run, and give what they show."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "streams"


def _modules_with_examples() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()


def test_the_package_has_examples() -> None:
    assert "streams.runtime.faust_patches.offsets" in MODULES
    assert "streams.devtools.broker.process" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name}: no example found"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
