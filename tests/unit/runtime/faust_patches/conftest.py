"""The patches are installed once for the process before these tests run; with
``TESTONLY_TRAJSTREAM_WITHOUT_PATCHES=<name>,...`` (or ``..._HANDOVER_UNPATCHED=1``) without
those, so that each test can be seen failing without the patch it names (see
``tests/integration/faults.py``; run this folder alone for that: a test elsewhere in the same
process may have installed them all first)."""

from __future__ import annotations

import os

import pytest

from streams.runtime import faust_patches
from tests.integration.faults import skipped_patches


@pytest.fixture(autouse=True, scope="package")
def _patched() -> None:
    faust_patches.install(skip=skipped_patches(os.environ))
