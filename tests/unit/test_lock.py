"""The lock file ./dev installs from meets what pyproject.toml asks for.

``requirements.lock`` (uv pip compile, see the README's Dependencies) pins every package with
its hashes; when someone changes a requirement in ``pyproject.toml`` without compiling the lock
again, a fresh ``./dev`` would install a set that does not satisfy it: this test says which.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)")


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        m = PIN.match(line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    return [Requirement(r) for r in wanted]


def test_every_requirement_is_pinned_within_its_bounds() -> None:
    pins = _pins()
    wrong = []
    for req in _requirements():
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            # a requirement only for other platforms may be left out by a marker; not here
            wrong.append(f"{req}: not in requirements.lock")
        elif not req.specifier.contains(pin, prereleases=True):
            wrong.append(f"{req}: requirements.lock pins {pin}")
    assert not wrong, "compile the lock again (README, Dependencies):\n" + "\n".join(wrong)


def test_faust_is_the_version_the_handover_patch_is_for() -> None:
    # the day a newer faust-streaming is published, a fresh install must not pick it: the
    # worker refuses to start on any version the patch was not written for
    from streams.runtime.handover import FAUST_VERSION

    [faust] = [r for r in _requirements() if canonicalize_name(r.name) == "faust-streaming"]
    assert str(faust.specifier) == f"=={FAUST_VERSION}"
    assert _pins()["faust-streaming"] == FAUST_VERSION


def test_every_pin_has_hashes() -> None:
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    blocks = [b for b in re.split(r"\n(?=[A-Za-z0-9])", text) if PIN.match(b)]
    assert blocks and all("--hash=sha256:" in b for b in blocks)
