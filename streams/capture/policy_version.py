"""Which version of the policy's weights answers: read from Trinity's ``GET /metrics`` (its
``rollout/model_{i}/model_version`` keys) by the gateway in the background, or from an answer
that carries one (the ``X-Model-Version`` header, where a server in front of Trinity adds it),
and stamped on each step Trinity answered (``Completion.policy_version``).

A version is known only when it is certain: while Trinity's rollout models are on different
versions (a weight sync goes from one model to the next), no one version answered, so none is
stamped; a version read longer ago than ``max_age_s`` is not known any more; and the gateway
forgets it when Trinity stops answering (the circuit breaker opens: Trinity may come back with
other weights).

May import: the standard library only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

__all__ = ["VERSION_HEADER", "VersionBook", "version_of_header", "version_of_metrics"]

VERSION_HEADER = "X-Model-Version"
"""An answer's header naming the version of the weights that made it, taken when present."""

_MODEL_VERSION = re.compile(r"^rollout/model_(\d+)/model_version$")


def version_of_metrics(metrics: Any) -> int | None:
    """The one version every rollout model of Trinity's ``/metrics`` JSON is on; None when
    they differ or none is given.

    >>> key = "rollout/model_{}/model_version".format
    >>> version_of_metrics({key(0): 3, key(1): 3, "explore_step_num": 9})
    3
    >>> version_of_metrics({key(0): 3, key(1): 4}), version_of_metrics({"explore_step_num": 7})
    (None, None)
    """
    if not isinstance(metrics, dict):
        return None
    found = {
        value
        for key, value in metrics.items()
        if isinstance(key, str)
        and _MODEL_VERSION.match(key)
        and isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 0
    }
    return found.pop() if len(found) == 1 else None


def version_of_header(value: str | None) -> int | None:
    """The version an answer's ``X-Model-Version`` header names (a non-negative integer)."""
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() and len(text) < 19 else None


class VersionBook:
    """The version the gateway knows now (see the module docstring).

    >>> t = [0.0]
    >>> book = VersionBook(max_age_s=10, clock=lambda: t[0])
    >>> book.observe(4)
    >>> book.current
    4
    >>> t[0] = 10.5
    >>> book.current is None
    True
    """

    def __init__(self, max_age_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._version: int | None = None
        self._read_at = 0.0

    def observe(self, version: int | None) -> None:
        """What a read found (None: no one version)."""
        self._version, self._read_at = version, self.clock()

    def forget(self) -> None:
        """Trinity stopped answering: the version it comes back with is not known yet."""
        self._version = None

    @property
    def current(self) -> int | None:
        """The version known now (None: not known)."""
        if self._version is None or self.clock() - self._read_at > self.max_age_s:
            return None
        return self._version
