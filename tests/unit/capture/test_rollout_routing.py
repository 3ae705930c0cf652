"""The gateway side of the rollout: a ShareBook applies each agent's changes once, in version
order, and a RolloutStrategy routes a call by the share in force at its start, so replicas that
read the same changes in any order, at any moment, decide every call alike."""

from __future__ import annotations

import random
from datetime import timedelta

from streams.capture.routing import RolloutStrategy, ShareBook, check_routable, decide_route
from streams.core.select import build_strategy, sample_point
from streams.models import RoutingShare
from tests.unit.factories import T0, at, start


def change(version: int, share: float, effective: float, agent: str = "support") -> RoutingShare:
    return RoutingShare(
        agent_name=agent,
        share=share,
        version=version,
        effective_at=at(effective),
        decided_at=at(effective - 5),
        action="promote",
    )


CHANGES = [change(1, 0.1, 10), change(2, 0.2, 100), change(3, 0.0, 200), change(1, 0.5, 50, "x")]


def test_the_share_in_force_at_a_time() -> None:
    book = ShareBook()
    assert all(book.apply(c) for c in CHANGES)
    assert book.share_at("support", at(5)) is None  # before the first: the fallback strategy
    got = [book.share_at("support", at(t)) for t in (10, 99.999, 100, 250)]
    assert [c.share if c else None for c in got] == [0.1, 0.1, 0.2, 0.0]
    assert {a: c.version for a, c in book.latest().items()} == {"support": 3, "x": 1}


def test_a_repeated_version_is_ignored_and_an_older_one_kept_in_order() -> None:
    book = ShareBook()
    book.apply(change(2, 0.2, 100))
    assert not book.apply(change(2, 0.9, 100))
    assert book.apply(change(1, 0.1, 10))  # read late (a compacted topic), still in force then
    assert [book.share_at("support", at(t)).share for t in (50, 150)] == [0.1, 0.2]  # type: ignore[union-attr]


def test_replicas_agree_on_every_call() -> None:
    fallback = build_strategy("sampling:0.3")
    rng = random.Random(7)
    one, two = ShareBook(), ShareBook()
    for c in CHANGES:
        one.apply(c)
    for c in sorted(CHANGES, key=lambda c: rng.random()):  # another order
        two.apply(c)
    for c in CHANGES:  # and again, as a restarted follower does
        assert not two.apply(c)
    a, b = RolloutStrategy(fallback, one), RolloutStrategy(fallback, two)
    check_routable(a)
    for i in range(2000):
        t = rng.uniform(0, 300)
        s = start(f"call-{i}", event_time=T0 + timedelta(seconds=t), agent_name="support")
        ra, rb = decide_route(a, s, "route"), decide_route(b, s, "route")
        assert ra == rb
        in_force = one.share_at("support", s.event_time)
        expected = sample_point(s.call_id) < (in_force.share if in_force else 0.3)
        assert ra.selection.selected is expected
        if in_force is not None:
            assert ra.selection.strategy == f"rollout(v{in_force.version})"


def test_a_call_keeps_the_share_of_its_start_when_a_change_lands_during_it() -> None:
    book = ShareBook()
    book.apply(change(1, 1.0, 10))
    strategy = RolloutStrategy(build_strategy("sampling:0"), book)
    s = start("long-call", event_time=at(50), agent_name="support")
    before = decide_route(strategy, s, "route")
    book.apply(change(2, 0.0, 60))  # read while the call goes on
    assert decide_route(strategy, s, "route") == before and before.upstream == "trinity"
