"""Trinity as the live worker's ports see it: the client, made when first used, with every
failed request counted and every ``/feedback`` kept out of a commit's last ready-count read and
its ``/commit`` (:class:`~.checkpoint.FeedbackGate`). The feedback port
(:mod:`.feedback`) and the ledger port's commits (:mod:`.ledger`) both go through it.

May import: :mod:`streams.io`, :mod:`streams.errors`, :mod:`streams.observe`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ...errors import TrinityError
from ...io.trinity import TrinityClient
from ...observe.metrics import Metrics
from .checkpoint import FeedbackGate

__all__ = ["ObservedTrinity"]


class ObservedTrinity:
    """The Trinity client (made by ``client`` when first used) with every failed request
    counted (``trajstream_trinity_errors_total`` by route and kind); it answers and raises
    exactly as the client does. Its ``/feedback`` requests and the commit's last ready-count
    read and ``/commit`` pass ``gate``."""

    def __init__(
        self, client: Callable[[], TrinityClient], metrics: Metrics, gate: FeedbackGate
    ) -> None:
        self._factory = client
        self._client: TrinityClient | None = None
        self._metrics = metrics
        self.gate = gate

    @property
    def client(self) -> TrinityClient:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        """For :func:`streams.core.commits.send_commit`: no feedback of this worker meanwhile."""
        return self.gate.exclusive()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name not in ("feedback", "commit", "metrics"):
            return attr

        async def observed(*args: Any, **kwargs: Any) -> Any:
            try:
                if name == "feedback":
                    async with self.gate.shared():
                        return await attr(*args, **kwargs)
                return await attr(*args, **kwargs)
            except TrinityError as exc:
                self._metrics.trinity_error(name, exc)
                raise

        return observed
