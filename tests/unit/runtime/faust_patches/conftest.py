"""The patches are installed once for the process before these tests run; with
``TESTONLY_TRAJSTREAM_WITHOUT_PATCHES=<name>,...`` (or ``..._HANDOVER_UNPATCHED=1``) without
those, so that each test can be seen failing without the patch it names (see
``tests/integration/faults.py``)."""

from __future__ import annotations

import os

from streams.runtime import faust_patches
from tests.integration.faults import skipped_patches

faust_patches.install(skip=skipped_patches(os.environ))
