"""The pipeline's side of a fallible, moving policy, on a real broker with a real worker process:
agent events written as the gateway writes them when the policy falls back (steps answered by
production with ``fallback``, a call that falls back part way, a policy stream that broke) and
as the policy's versions change (``policy_version`` on each step Trinity answered).

Real answers: every Trinity step's id is the stand-in's own (a chat completion it served, so its
``/feedback`` and ``/commit`` count it), every production step's id is the other stand-in's, in
the same ``chatcmpl-`` format. Windows are fed one after the other (the next once the ledger
holds every acknowledgement of the previous: each closes with all its calls), so the
comparisons and the rollout's decisions are exact:

1. version 1 wins, but 3 of the 7 calls routed to the policy fell back: started, promotion
   blocked, and the decision says why; no production id and no id of a mixed call reaches
   ``/feedback``; the policy's calls are trained and committed;
2. versions 1 and 2 share a window: compared per version, the rollout judges version 2 (the
   newest with enough calls) and promotes it;
3. version 3 loses: the rollback names version 3, and the next commit is held.

``trajstream compare --policy-version`` and the status snapshot read it back.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from streams.capture.sdk import TrajstreamProducer
from streams.devtools.standin import StandIn
from streams.models import (
    AgentCall,
    CallPhase,
    CallStatus,
    ChatMessage,
    CommitRecord,
    Comparison,
    Completion,
    FeedbackAck,
    RewardedTrajectory,
    RoutingShare,
    WindowSummary,
    utcnow,
)
from streams.observe.status import collect
from streams.settings import Settings

from .conftest import base_env, read_topic, wait_for
from .test_rollout import cli

pytestmark = pytest.mark.integration

AGENT = "support"
WORKER = {
    "TRAJSTREAM_SELECTION__STRATEGY": "sampling:0",  # the gateway's route decides
    "TRAJSTREAM_REWARD__FUNCTION": "streams.rewards:success",
    "TRAJSTREAM_WINDOWS__SIZE_S": 60,
    # windows close when the next one's calls pass their end (never on their own meanwhile)
    "TRAJSTREAM_WINDOWS__GRACE_S": 30,
    "TRAJSTREAM_COMPARE__MIN_COUNT": 3,
    "TRAJSTREAM_COMMIT__INTERVAL_S": 1,
    "TRAJSTREAM_COMMIT__TICK_S": 0.25,
    "TRAJSTREAM_GATEWAY__ROLLOUT__ENABLED": "true",
    "TRAJSTREAM_GATEWAY__ROLLOUT__INITIAL_SHARE": 0.1,
    "TRAJSTREAM_GATEWAY__ROLLOUT__STEP": 0.1,
    "TRAJSTREAM_GATEWAY__ROLLOUT__PROMOTE_AFTER": 1,
    "TRAJSTREAM_GATEWAY__ROLLOUT__MAX_FALLBACK_RATE": 0.2,
    "TRAJSTREAM_GATEWAY__ROLLOUT__APPLY_DELAY_S": 0,
}


class Calls:
    """Calls of one agent as the gateway records them, with real ids from both stand-ins."""

    def __init__(self, http: httpx.AsyncClient, trinity: StandIn, production: StandIn) -> None:
        self.http, self.trinity, self.production = http, trinity, production
        self.n = 0
        self.arms: dict[str, str] = {}  # call_id -> the arm it should be
        self.trinity_ids: dict[str, list[str]] = {}  # call_id -> Trinity's ids of its steps
        self.production_ids: set[str] = set()

    async def answer(self, by: StandIn) -> str:
        r = await self.http.post(
            f"{by.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "help me"}]},
        )
        r.raise_for_status()
        return str(r.json()["id"])

    async def call(
        self, at: datetime, arm: str, steps: list[dict[str, Any]], ok: bool
    ) -> list[AgentCall | Completion]:
        """One call at event time ``at``: routed to the policy unless ``arm`` is production;
        each step a dict of what the gateway records (``by``: who answered)."""
        self.n += 1
        cid = f"{arm}-{self.n}"
        self.arms[cid] = arm
        route = "production" if arm == "production" else "trinity"
        records: list[AgentCall | Completion] = [
            AgentCall(
                event_id=f"{cid}/start",
                call_id=cid,
                phase=CallPhase.START,
                event_time=at,
                agent_name=AGENT,
                input_messages=[ChatMessage(role="user", content="help me")],
                attributes={
                    "trajstream.route.upstream": route,
                    "trajstream.route.mode": "route",
                    "trajstream.route.selected": str(route == "trinity").lower(),
                },
            )
        ]
        for seq, step in enumerate(steps):
            by = step.pop("by")
            rid = await self.answer(self.trinity if by == "trinity" else self.production)
            if by == "trinity":
                self.trinity_ids.setdefault(cid, []).append(rid)
            else:
                self.production_ids.add(rid)
            records.append(
                Completion(
                    event_id=f"{cid}/{seq}",
                    call_id=cid,
                    seq=seq,
                    event_time=at + timedelta(seconds=0.1 * (seq + 1)),
                    request_model="m",
                    response_model="policy" if by == "trinity" else "production-model",
                    response_id=rid,
                    upstream=by,
                    output_messages=[ChatMessage(role="assistant", content="done")],
                    **step,
                )
            )
        records.append(
            AgentCall(
                event_id=f"{cid}/end",
                call_id=cid,
                phase=CallPhase.END,
                event_time=at + timedelta(seconds=1),
                agent_name=AGENT,
                output="done",
                status=CallStatus.OK if ok else CallStatus.ERROR,
                step_count=len(steps),
            )
        )
        return records

    async def policy(self, at: datetime, version: int, ok: bool) -> list[Any]:
        return await self.call(at, "trinity", [{"by": "trinity", "policy_version": version}], ok)

    async def production_call(self, at: datetime, ok: bool) -> list[Any]:
        return await self.call(at, "production", [{"by": "production"}], ok)


async def acked(bootstrap: str, prefix: str, calls: set[str]) -> None:
    """Wait until the ledger topic holds an acknowledgement of every call in ``calls``."""

    def done(records: list[Any]) -> bool:
        return calls <= {r.rewarded.call_id for r in records if isinstance(r, FeedbackAck)}

    records = await read_topic(bootstrap, f"{prefix}.ledger", until=done, timeout=90)
    assert done(records), calls - {
        r.rewarded.call_id for r in records if isinstance(r, FeedbackAck)
    }


def of(records: list[Any], kind: type[Any]) -> list[Any]:
    return [r for r in records if isinstance(r, kind)]


def changes(records: list[Any]) -> list[RoutingShare]:
    seen: dict[int, RoutingShare] = {}
    for r in of(records, RoutingShare):
        seen.setdefault(r.version, r)
    return [seen[v] for v in sorted(seen)]


async def test_fallbacks_mixed_calls_and_versions_through_the_pipeline(
    kafka_bootstrap, prefix, standin, production, workers, tmp_path
):
    workers(TRAJSTREAM_TRINITY__URL=standin.url, **WORKER)
    now = utcnow()
    base = now.replace(second=0, microsecond=0) - timedelta(minutes=12)

    def window(k: int, i: int) -> datetime:  # windows two apart: each closes on the next's calls
        return base + timedelta(seconds=120 * k + 1 + i)

    async with (
        httpx.AsyncClient(timeout=30) as http,
        TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as producer,
    ):
        calls = Calls(http, standin, production)

        async def feed(*made: list[Any]) -> set[str]:
            records = [r for call in made for r in call]
            await producer.publish_many(records)
            return {r.call_id for r in records}

        # -- window 0: version 1 wins, 3 of the 7 calls routed to the policy fall back --------
        fallback = [
            {"by": "production", "fallback": "connect"},
            {"by": "production", "fallback": "sticky"},
        ]
        part_way = [
            {"by": "trinity", "policy_version": 1},
            {"by": "production", "fallback": "timeout"},
        ]
        broke = [{"by": "trinity", "policy_version": 1, "error_type": "RemoteProtocolError"}]
        w0 = await feed(
            *[await calls.policy(window(0, i), 1, ok=True) for i in range(4)],
            *[await calls.production_call(window(0, i), ok=False) for i in range(4)],
            await calls.call(window(0, 5), "trinity-fallback", fallback, ok=True),
            await calls.call(window(0, 6), "mixed", part_way, ok=True),
            await calls.call(window(0, 7), "mixed", broke, ok=False),
        )
        await acked(kafka_bootstrap, prefix, w0)
        # -- window 1: versions 1 (losing) and 2 (winning) -------------------------------------
        w1 = await feed(
            *[await calls.policy(window(1, i), 1, ok=False) for i in range(4)],
            *[await calls.policy(window(1, i), 2, ok=True) for i in range(4)],
            *[await calls.production_call(window(1, i), ok=False) for i in range(4)],
        )
        await acked(kafka_bootstrap, prefix, w1)
        # -- window 2: version 3 loses; a later call closes it --------------------------------
        w2 = await feed(
            await calls.policy(window(2, 0), 2, ok=True),  # too few calls of version 2 alone
            *[await calls.policy(window(2, i), 3, ok=False) for i in range(4)],
            *[await calls.production_call(window(2, i), ok=True) for i in range(4)],
        )
        await acked(kafka_bootstrap, prefix, w2)
        # committed before the call that closes the window (and rolls the policy back) comes
        w2_ids = {m for c in w2 for m in calls.trinity_ids.get(c, [])}
        await wait_for(lambda: w2_ids <= set(standin.state.trained), 60, "window 2 committed")
        closer = await feed(await calls.policy(window(3, 0), 3, ok=True))

    trained_calls = {c for c, arm in calls.arms.items() if arm == "trinity"}
    sent_ids = {m for c in trained_calls for m in calls.trinity_ids[c]}
    untrained_trinity_ids = {
        m for c, arm in calls.arms.items() if arm == "mixed" for m in calls.trinity_ids[c]
    }
    assert len(untrained_trinity_ids) == 2 and len(calls.production_ids) == 15

    routing = changes(
        await read_topic(
            kafka_bootstrap,
            f"{prefix}.routing",
            until=lambda rs: any(c.action == "rollback" for c in changes(rs)),
            timeout=90,
        )
    )
    steps = [(c.version, c.action, c.share, c.policy_version) for c in routing]
    assert steps == [
        (1, "start", 0.1, 1),
        (2, "blocked", 0.1, 1),  # better, but 3 of 7 fell back (> 20 %)
        (3, "promote", 0.2, 2),  # the newest version with enough calls, not the pooled window
        (4, "rollback", 0.0, 3),
    ], steps
    assert "(1 fallback, 2 mixed)" in routing[1].reason
    assert "gateway.rollout.max_fallback_rate 20.0%" in routing[1].reason
    assert [(e.span, e.policy_version) for e in routing[2].evidence] == [("version", 2)]
    assert "policy version 3" in routing[3].reason

    # only Trinity's ids of the calls it answered alone reach /feedback, each call trained once
    await wait_for(
        lambda: {m for f in standin.state.feedback for m in f.applied} >= sent_ids,
        60,
        "every policy call fed back",
    )
    fed = [m for f in standin.state.feedback for m in f.body["msg_ids"]]
    assert set(fed) == sent_ids and not set(fed) & (calls.production_ids | untrained_trinity_ids)
    assert all(f.status == 200 for f in standin.state.feedback)
    # the first windows' calls were committed (trained); the closer's commit is held by the
    # rollback, and says why
    closing_id = calls.trinity_ids[next(iter(closer))][0]
    assert sent_ids - {closing_id} <= set(standin.state.trained)
    assert closing_id not in standin.state.trained
    commits = of(
        await read_topic(
            kafka_bootstrap,
            f"{prefix}.commits",
            until=lambda rs: any(c.held for c in of(rs, CommitRecord)),
            timeout=60,
        ),
        CommitRecord,
    )
    assert any(c.sent and c.feedback_count for c in commits)
    assert any(c.held and "rolled back" in c.held_reason for c in commits)

    # the rewarded records: every call scored, with its arm and its version
    rewarded = {
        r.call_id: r
        for r in of(
            await read_topic(
                kafka_bootstrap,
                f"{prefix}.rewarded",
                until=lambda rs: (
                    len({r.call_id for r in of(rs, RewardedTrajectory)}) >= len(calls.arms)
                ),
            ),
            RewardedTrajectory,
        )
    }
    assert {c: r.upstream for c, r in rewarded.items()} == calls.arms
    assert all(r.msg_ids == [] for r in rewarded.values() if r.upstream != "trinity")
    assert {rewarded[c].policy_version for c in w1 if calls.arms[c] == "trinity"} == {1, 2}
    assert [r.policy_version for r in rewarded.values() if r.upstream == "mixed"] == [1, 1]

    # the windows per version, and the comparisons: fallbacks beside the means, per version
    windows = of(await read_topic(kafka_bootstrap, f"{prefix}.windows"), WindowSummary)
    policy_w1 = {
        (w.policy_version, w.count)
        for w in windows
        if w.upstream == "trinity" and w.window_start == base + timedelta(seconds=120)
    }
    assert policy_w1 == {(1, 4), (2, 4)}
    comparisons = of(await read_topic(kafka_bootstrap, f"{prefix}.comparisons"), Comparison)
    first = next(c for c in comparisons if c.span == "window" and c.window_start == base)
    assert (first.policy_count, first.production_count, first.verdict) == (4, 4, "better")
    assert (first.policy_fallbacks, first.policy_mixed, first.policy_version) == (1, 2, 1)
    assert first.fallback_rate == pytest.approx(3 / 7)
    second = [c for c in comparisons if c.window_start == base + timedelta(seconds=120)]
    assert {(c.span, c.policy_version, c.verdict) for c in second} == {
        ("window", None, "better"),
        ("version", 1, "inconclusive"),
        ("version", 2, "better"),
    }

    # read back per version, as an operator would
    env = base_env(kafka_bootstrap, prefix, tmp_path)
    shown = json.loads(cli(env, "compare", "--agent", AGENT, "--policy-version", "2", "--json"))
    assert {(c["span"], c["policy_version"]) for c in shown["comparisons"]} == {("version", 2)}
    assert [r["action"] for r in shown["routing"]] == ["promote"]
    settings = Settings(
        app_id=prefix, kafka={"bootstrap_servers": kafka_bootstrap, "topic_prefix": prefix}
    )
    status = await collect(settings, kafka_bootstrap, sample_gap_s=0)
    (falls,) = status.fallbacks
    assert (falls.agent, falls.routed, falls.answered, falls.fallbacks, falls.mixed) == (
        AGENT,
        7 + 8 + 5,
        4 + 8 + 5,
        1,
        2,
    )
