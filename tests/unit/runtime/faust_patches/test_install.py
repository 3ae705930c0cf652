"""One install of every patch, behind one version gate; no test hook in the product."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.runtime import faust_patches

PACKAGE = Path(__file__).resolve().parents[4] / "streams"


def test_install_refuses_another_faust_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faust_patches, "_distribution_version", lambda name: "0.16.0")
    with pytest.raises(faust_patches.HandoverPatchError, match=r"0\.15\.3, found 0\.16\.0"):
        faust_patches.install()


def test_install_patches_once() -> None:
    from faust.transport.consumer import Consumer

    from streams.runtime.faust_patches import consumer

    faust_patches.install()  # this folder's conftest installed them: nothing changes
    faust_patches.install(skip=faust_patches.HANDOVER)
    assert faust_patches.installed() <= faust_patches.PATCHES.keys()
    if "consumer.contiguous_commit" in faust_patches.installed():
        assert Consumer._new_offset is consumer._new_offset


def test_each_patch_names_its_upstream_issue_and_the_test_that_fails_without_it() -> None:
    for name, patch in faust_patches.PATCHES.items():
        doc = patch.__doc__ or ""
        assert "Upstream" in doc, f"{name}: what upstream does"
        assert "Fails without it: ``tests/" in doc, f"{name}: the test that fails without it"
        named = doc.split("Fails without it:")[1].split("``")[1::2]
        for test in (t.replace("\n", "").replace(" ", "") for t in named):
            path, _, function = test.partition("::")
            source = (PACKAGE.parent / path).read_text(encoding="utf-8")
            assert f"def {function}(" in source, f"{name}: {test} does not exist"


def test_no_production_module_reads_a_test_variable() -> None:
    readers = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if "TESTONLY" in path.read_text(encoding="utf-8")
    ]
    assert readers == []
