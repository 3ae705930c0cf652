"""What every test run shares: SIGTERM tears the fixtures down (:mod:`tests.interrupt`)."""

from __future__ import annotations

import pytest

from tests.interrupt import install


def pytest_configure(config: pytest.Config) -> None:
    install()
