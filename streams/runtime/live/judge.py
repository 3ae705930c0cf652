"""The judge port of the live worker (stage 2b): a judge request -> the judge's answer, retried
while it is unavailable -> a verdict on ``<p>.verdicts``.

The rule is the core's, shared with replay (:class:`~streams.core.judge.JudgeStage`); the port
is the judge over HTTP with the one retry loop (:func:`streams.io.judge.judge_port`), the client
made when first used.

May import: the core, :mod:`streams.io`, the top-level modules, :mod:`streams.observe`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...core.effects import Out
from ...core.judge import JudgeAnswerError, JudgeStage
from ...core.retry import RetryPolicy
from ...envelope import Envelope
from ...errors import RecordError
from ...io.judge import JudgeClient, judge_port
from ...observe.metrics import Metrics
from .channels import source_of
from .guard import StageGuard

__all__ = ["JudgePort"]


class JudgePort:
    """The judge stage over HTTP (see the module); ``client`` makes the judge's client."""

    def __init__(
        self,
        client: Callable[[], JudgeClient],
        policy: RetryPolicy,
        guard: StageGuard,
        *,
        metrics: Metrics,
        stats: Counter[str],
        clock: Callable[[], datetime],
    ) -> None:
        self._factory = client
        self._client: JudgeClient | None = None
        self.guard = guard
        self.metrics = metrics
        self.stats = stats
        self.clock = clock
        self.stage = JudgeStage()
        # the one retry loop over this worker's client, with the stages' clock (requested_at)
        self.ask = judge_port(lambda: self.client, policy, clock=clock, on_retry=self._retried)

    @property
    def client(self) -> JudgeClient:
        if self._client is None:
            self._client = self._factory()
        return self._client

    async def handle(self, event: Any) -> None:
        """One judge request through the core's judge stage, the judge asked over this
        worker's port: its verdict (scored or not) on ``<p>.verdicts``; a request that cannot
        be read is a ``judge`` dead letter. Never raises for what the judge answered."""

        async def answer(env: Envelope) -> Out:
            out = await self.stage.on_record(env, self.ask, self.clock)
            for verdict in out.records("verdicts"):
                self.metrics.judge_verdict(scored=verdict.error is None)  # type: ignore[attr-defined]
            return out

        await self.guard.run(
            "judge", source_of(event), answer, expected=(RecordError, JudgeAnswerError)
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def _retried(self) -> None:
        self.stats["judge.retries"] += 1
        self.metrics.judge_retry()
