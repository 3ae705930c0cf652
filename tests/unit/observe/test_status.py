"""What ``trajstream status`` judges from a snapshot: the hints, the JSON, the screen (pure)."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console

from streams.models import CommitRecord, DeadLetter, DriftAlert
from streams.observe.status import Member, Status, TopicLag, hints, render

from ..factories import T0, at


def member(n: int = 0) -> Member:
    return Member(
        member_id=f"m{n}",
        client_id="faust-0.15.3",
        host="10.0.0.1",
        partitions={"p.agent-events": [0, 1], "p.ledger": [0], "p-pending-changelog": [0]},
    )


def snapshot(**kw: Any) -> Status:
    fields: dict[str, Any] = {
        "at": at(3600),
        "prefix": "p",
        "group": "p",
        "group_state": "Stable",
        "members": [member()],
        "lag": [TopicLag("p.agent-events", 0, 0, {0: 0, 1: 0}, committed_moved=True)],
        "sample_gap_s": 2.0,
        "open_calls": 0,
        "commits": [
            CommitRecord(
                commit_seq=0,
                interval_start=T0,
                interval_end=at(3500),
                feedback_count=3,
                reward_mean=0.5,
            )
        ],
        "last_commit_at": at(3500),
        "commit_interval_s": 300.0,
        "rewarded_since_commit": 0,
        "oldest_uncommitted_at": None,
        "dead_letters": {},
        "recent_dead_letters": [],
        "late_events": 0,
        "alerts": [],
        "partitions": 4,
    }
    fields.update(kw)
    return Status(**fields)


def whats(s: Status) -> list[str]:
    return [h.what for h in hints(s)]


def test_a_healthy_deployment_needs_nothing():
    assert hints(snapshot()) == []


@pytest.mark.parametrize(
    ("changes", "level", "says"),
    [
        ({"members": []}, "error", "no workers in consumer group p"),
        ({"group_state": "PreparingRebalance"}, "warning", "partitions are being reassigned"),
        ({"members": [member(i) for i in range(6)]}, "info", "2 of 6 workers have no keyed"),
        (
            {"lag": [TopicLag("p.agent-events", 50, 20, {0: 50}, committed_moved=True)]},
            "warning",
            "lag grew from 20 to 50 records in 2s",
        ),
        (
            {
                "lag": [
                    TopicLag("p.rewarded", 9, 9, {0: 0, 1: 9}, committed_moved=True, stalled=[1])
                ]
            },
            "warning",
            "no offset committed in 2s while records wait on p.rewarded[1]",
        ),
        (
            {"rewarded_since_commit": 4, "oldest_uncommitted_at": at(3600 - 601)},
            "error",
            "4 rewarded trajectories since the last commit at 00:58:20, the oldest 601s ago",
        ),
        (
            {"dead_letters": {"assemble": 2, "feedback": 1}},
            "warning",
            "3 dead letters in the last hour (assemble 2, feedback 1)",
        ),
        (
            {
                "alerts": [
                    DriftAlert(
                        agent_name="bot",
                        model="m",
                        window_start=T0,
                        window_end=at(60),
                        mean=0.2,
                        trailing_mean=0.9,
                        trailing_windows=5,
                        fraction=0.8,
                        raised_at=at(61),
                    )
                ]
            },
            "warning",
            "reward drift: bot/m window mean 0.200 < 0.8 x trailing 0.900",
        ),
        (
            {
                "commits": [
                    CommitRecord(
                        commit_seq=1,
                        interval_start=T0,
                        interval_end=at(3500),
                        feedback_count=2,
                        sent=False,
                        trinity_response='{"held": "reward drop of bot/m", "holds": []}',
                    )
                ]
            },
            "warning",
            "commits are held (commit.hold_on_drift): reward drop of bot/m",
        ),
    ],
)
def test_each_state_that_needs_attention_has_a_hint(changes, level, says):
    found = [h for h in hints(snapshot(**changes)) if says in h.what]
    assert found, whats(snapshot(**changes))
    assert found[0].level == level
    assert found[0].do  # and says what to do


def test_uncommitted_work_within_two_intervals_is_fine():
    s = snapshot(rewarded_since_commit=4, oldest_uncommitted_at=at(3600 - 599))
    assert hints(s) == []


def test_no_commit_ever():
    s = snapshot(commits=[], last_commit_at=None, rewarded_since_commit=2, oldest_uncommitted_at=T0)
    assert any("and no commit yet" in w for w in whats(s))


def test_a_little_lag_growth_is_noise():
    s = snapshot(lag=[TopicLag("p.ticks", 4, 0, {0: 1, 1: 1, 2: 1, 3: 1}, committed_moved=True)])
    assert hints(s) == []


def test_one_sample_says_nothing_of_growth():
    s = snapshot(
        sample_gap_s=0.0,
        lag=[TopicLag("p.agent-events", 50, 0, {0: 50}, committed_moved=False, stalled=[0])],
    )
    assert hints(s) == []


def test_json_is_plain_and_leaves_out_payloads():
    letter = DeadLetter(
        reason="bad",
        error_type="RecordError",
        stage="assemble",
        source_topic="p.agent-events",
        source_partition=0,
        source_offset=7,
        key=b"k",
        payload=b"\x00secret",
        failed_at=at(10),
    )
    s = snapshot(dead_letters={"assemble": 1}, recent_dead_letters=[letter])
    s.hints = hints(s)
    data = json.loads(json.dumps(s.to_json()))
    assert data["recent_dead_letters"][0]["key"] == "k"
    assert "payload" not in data["recent_dead_letters"][0]
    assert data["total_lag"] == 0
    assert data["at"] == at(3600).isoformat()
    assert data["hints"][0]["level"] == "warning"


def test_screen_shows_workers_lag_commits_and_hints():
    s = snapshot(
        members=[],
        dead_letters={"assemble": 1},
        commits=[],
        last_commit_at=None,
    )
    s.hints = hints(s)
    out = io.StringIO()
    render(s, Console(file=out, width=120))
    text = out.getvalue()
    assert "workers (0)" in text and "p.agent-events" in text
    assert "last commits: none yet" in text
    assert "no workers in consumer group p" in text
    assert "start one: `trajstream worker`" in text


def test_screen_marks_the_ledger_owner():
    s = snapshot()
    out = io.StringIO()
    render(s, Console(file=out, width=120))
    assert "0,1 + ledger" in out.getvalue()
    assert "nothing needs attention" in out.getvalue()


def test_timestamps_are_utc():
    assert snapshot().at.utcoffset() == timedelta(0)


def test_a_commit_not_sent_for_nothing_ready_is_not_a_hold():
    record = CommitRecord(
        commit_seq=1,
        interval_start=T0,
        interval_end=at(3500),
        feedback_count=0,
        sent=False,
        trinity_response='{"not_sent": "nothing ready at Trinity"}',
    )
    assert not record.held and record.held_reason == ""
    assert hints(snapshot(commits=[record])) == []


def test_the_comparison_and_a_rollback_show_on_the_screen_and_as_a_hint():
    from streams.models import RoutingShare
    from tests.unit.factories import comparison

    rollback = RoutingShare(
        agent_name="researcher",
        share=0.0,
        previous_share=0.3,
        version=4,
        effective_at=at(3600),
        decided_at=at(3595),
        action="rollback",
        reason="worse than production with confidence for 1 window(s)",
    )
    s = snapshot(
        comparisons=[comparison(), comparison(span="trailing", windows=3, verdict="worse")],
        routing=[rollback],
    )
    buffer = io.StringIO()
    render(s, Console(file=buffer, width=200))
    screen = buffer.getvalue()
    assert "policy vs production" in screen
    assert "+0.200 [+0.120, +0.280] @ 95%" in screen and "3 windows" in screen
    assert "0 (rollback)" in screen
    (hint,) = [h for h in hints(s) if "rolled back" in h.what]
    assert "trajstream routing resume --agent researcher" in hint.do
    assert s.to_json()["routing"][0]["action"] == "rollback"


def test_fallbacks_per_agent_from_the_window_comparisons():
    from streams.observe.snapshot import fallbacks_of
    from tests.unit.factories import comparison

    def window(agent: str, start: float, answered: int, falls: int, mixed: int, emitted: float):
        return comparison(
            agent_name=agent,
            window_start=at(start),
            policy_count=answered,
            policy_fallbacks=falls,
            policy_mixed=mixed,
            emitted_at=at(emitted),
        )

    got = fallbacks_of(
        [
            window("a", 0, 40, 5, 1, 70),
            window("a", 0, 40, 6, 1, 80),  # the same window emitted again: the last counts
            window("a", 60, 50, 0, 3, 130),
            window("b", 0, 0, 0, 0, 70),  # nothing routed to the policy: not listed
            comparison(agent_name="a", span="trailing", policy_fallbacks=99),
            comparison(agent_name="a", span="version", policy_fallbacks=99, policy_version=2),
        ]
    )
    assert [(f.agent, f.routed, f.answered, f.fallbacks, f.mixed) for f in got] == [
        ("a", 100, 90, 6, 4)
    ]
    assert got[0].rate == 0.1


@pytest.mark.parametrize(("rate", "hinted"), [(0.1, False), (0.25, True)])
def test_a_policy_that_falls_back_often_is_a_hint_and_on_the_screen(rate: float, hinted: bool):
    from streams.observe.snapshot import PolicyFallbacks

    falls = int(rate * 100)
    s = snapshot(fallbacks=[PolicyFallbacks("support", 100, 100 - falls, falls - 2, 2)])
    found = [h for h in hints(s) if "fell back to production" in h.what]
    assert bool(found) is hinted
    if hinted:
        assert "25 of 100 calls of support" in found[0].what
        assert "gateway.rollout.max_fallback_rate" in found[0].do
    buffer = io.StringIO()
    render(s, Console(file=buffer, width=200))
    screen = buffer.getvalue()
    assert "calls routed to the policy (last hour)" in screen and f"{rate:.0%}" in screen
    assert s.to_json()["fallbacks"][0]["rate"] == rate
