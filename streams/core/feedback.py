"""Stage 3's rule, feedback: which ``/feedback`` requests one rewarded trajectory becomes.

Trinity takes one reward per request, for a list of msg_ids. A trajectory whose steps share one
reward is one request, as before; with per-step rewards
(:attr:`~streams.models.RewardedTrajectory.step_rewards`) it is one request per distinct reward,
with exactly the msg_ids that have it, in step order, the requests in the order of each reward's
first step. Both runners (the live feedback stage and ``trajstream replay``) send these, then
record one acknowledgement for the trajectory (counted once by the ledger, with the number of
requests). A redelivery sends them all again: Trinity ignores a msg_id it rewarded before, so a
set interrupted half-way is completed, and nothing is counted twice.

May import: the standard library, :mod:`streams.models`, :mod:`streams.core.arms`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from ..models import FeedbackAck, RewardedTrajectory
from .arms import trains

__all__ = ["FeedbackPort", "FeedbackRequest", "deliver", "feedback_requests"]


@dataclass(frozen=True, slots=True)
class FeedbackRequest:
    """One ``/feedback`` body: ``{"msg_ids": msg_ids, "reward": reward, task_id, run_id}``."""

    msg_ids: list[str]
    reward: float
    task_id: str
    run_id: int


def feedback_requests(rewarded: RewardedTrajectory) -> list[FeedbackRequest]:
    """The ``/feedback`` requests of ``rewarded``: one per distinct reward, see the module;
    none for a call production answered, in whole or in part (:func:`streams.core.arms.trains`):
    it is acknowledged with no request, for the ledger's windows of its upstream."""
    if not trains(rewarded):
        return []
    groups: dict[float, list[str]] = {}
    for msg_id in rewarded.msg_ids:
        reward = rewarded.step_rewards.get(msg_id, rewarded.reward)
        groups.setdefault(reward, []).append(msg_id)
    return [
        FeedbackRequest(ids, reward, rewarded.task_id, rewarded.run_id)
        for reward, ids in groups.items()
    ]


FeedbackPort = Callable[[FeedbackRequest, str], Awaitable[int]]
"""How a runner sends one ``/feedback`` request (``what`` names it in logs and errors): until
Trinity acknowledges it (the one retry loop), returning the attempts it took; a rejection or
giving up raises."""


async def deliver(
    rewarded: RewardedTrajectory, send: FeedbackPort, now: Callable[[], datetime]
) -> FeedbackAck:
    """The feedback stage, for both runners: every request of ``rewarded``
    (:func:`feedback_requests`), each acknowledged before the next, then the trajectory's one
    :class:`~streams.models.FeedbackAck` (the most attempts any request took, and how many
    requests there were) for the ledger. What the port raises goes to the runner: the live
    worker makes it a dead letter, replay a rejected trajectory or an error to re-run."""
    requests = feedback_requests(rewarded)
    attempts = 0
    for request in requests:
        attempts = max(attempts, await send(request, f"feedback for {rewarded.call_id}"))
    return FeedbackAck(
        rewarded=rewarded, acked_at=now(), attempts=attempts, feedbacks=len(requests)
    )
