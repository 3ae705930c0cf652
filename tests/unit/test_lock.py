"""The lock file ./dev installs from meets what pyproject.toml asks for.

``requirements.lock`` (uv pip compile, see CONTRIBUTING.md, "Dependencies") pins every package
with its hashes; when someone changes a requirement in ``pyproject.toml`` without compiling the
lock again, a fresh ``./dev`` would install a set that does not satisfy it: this test says which.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)")


def _pins(name: str = "requirements.lock") -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        m = PIN.match(line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def _requirements(test: bool = True) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    if test:
        wanted += list(project["optional-dependencies"]["test"])
    return [Requirement(r) for r in wanted]


@pytest.mark.parametrize(
    ("lock", "test"), [("requirements.lock", True), ("requirements-runtime.lock", False)]
)
def test_every_requirement_is_pinned_within_its_bounds(lock: str, test: bool) -> None:
    pins = _pins(lock)
    wrong = []
    for req in _requirements(test):
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            # a requirement only for other platforms may be left out by a marker; not here
            wrong.append(f"{req}: not in {lock}")
        elif not req.specifier.contains(pin, prereleases=True):
            wrong.append(f"{req}: {lock} pins {pin}")
    assert not wrong, "compile the lock again (CONTRIBUTING.md, Dependencies):\n" + "\n".join(
        wrong
    )


def test_faust_is_the_version_the_patches_are_for() -> None:
    # the day a newer faust-streaming is published, a fresh install must not pick it: the
    # worker refuses to start on any version the patches were not written for
    from streams.runtime.faust_patches import FAUST_VERSION

    [faust] = [r for r in _requirements() if canonicalize_name(r.name) == "faust-streaming"]
    assert str(faust.specifier) == f"=={FAUST_VERSION}"
    assert _pins()["faust-streaming"] == FAUST_VERSION


def test_the_image_lock_is_the_dev_lock_without_the_test_tools() -> None:
    full, runtime = _pins(), _pins("requirements-runtime.lock")
    assert runtime.keys() < full.keys()
    assert {n: v for n, v in runtime.items() if full[n] != v} == {}


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-runtime.lock"])
def test_every_pin_has_hashes(lock: str) -> None:
    text = (ROOT / lock).read_text(encoding="utf-8")
    blocks = [b for b in re.split(r"\n(?=[A-Za-z0-9])", text) if PIN.match(b)]
    assert blocks and all("--hash=sha256:" in b for b in blocks)
