"""The policy's circuit breaker (streams.capture.breaker), as a table of scripts over a fake
clock: when it opens (consecutive failures, the failure rate of the window, a Retry-After),
how long it stays open, how the half-open probes close or reopen it, and which outcomes are
stale (admitted in an earlier stretch of state) and count for nothing."""

from __future__ import annotations

import pytest

from streams.capture.breaker import Breaker, BreakerConfig, Transition

# A script is a list of tokens, run left to right:
#   a          admit a request: its ticket (or None) is kept as the next index (0, 1, ...)
#   +  p  x    the last admission was a normal request / a probe / refused
#   s3         the request of ticket 3 succeeded;  f3  it failed;  f3:20  failed, Retry-After 20
#   r3         the request of ticket 3 ended without an outcome (the client went away)
#   @12.5      the clock reads 12.5 from now on
#   =open      the breaker is in this state now (closed, open, half_open)
SCRIPTS = [
    (
        "consecutive failures open it; a success in between starts the count again",
        {"failures": 3},
        "a a a a a f0 f1 s2 =closed f3 f4 =closed a f5 =open a x",
        ["closed>open"],
    ),
    (
        "open for the cool-down, then half-open: probes only, the rest refused",
        {"failures": 1, "cooldown_s": 10, "probes": 2},
        "a f0 =open @9.9 a x @10 a p =half_open a p a x",
        ["closed>open", "open>half_open"],
    ),
    (
        "every probe answered closes it; normal requests again",
        {"failures": 1, "cooldown_s": 5, "probes": 2},
        "a f0 @5 a p a p s1 =half_open s2 =closed a +",
        ["closed>open", "open>half_open", "half_open>closed"],
    ),
    (
        "one probe failing opens it again for a new cool-down",
        {"failures": 1, "cooldown_s": 5, "probes": 2},
        "a f0 @5 a a s1 f2 =open @9.9 a x @10 a p",
        ["closed>open", "open>half_open", "half_open>open", "open>half_open"],
    ),
    (
        "a Retry-After opens it at once, for at least that long",
        {"failures": 100, "cooldown_s": 5},
        "a f0:30 =open @29.9 a x @30 a p",
        ["closed>open", "open>half_open"],
    ),
    (
        "a Retry-After shorter than the cool-down: the cool-down",
        {"failures": 100, "cooldown_s": 5},
        "a f0:1 =open @4.9 a x @5 a p",
        ["closed>open", "open>half_open"],
    ),
    (
        "a Retry-After longer than max_cooldown_s: max_cooldown_s",
        {"failures": 100, "cooldown_s": 5, "max_cooldown_s": 60},
        "a f0:3600 @59.9 a x @60 a p",
        ["closed>open", "open>half_open"],
    ),
    (
        "while open, a late failure with a longer Retry-After lengthens the cool-down",
        {"failures": 1, "cooldown_s": 5},
        "a a f0 =open f1:20 @19.9 a x @20 a p",
        ["closed>open", "open>half_open"],
    ),
    (
        "a late success while open changes nothing",
        {"failures": 1, "cooldown_s": 5},
        "a a f0 s1 =open @4 a x",
        ["closed>open"],
    ),
    (
        "a request of an earlier stretch says nothing about a half-open breaker",
        {"failures": 1, "cooldown_s": 5, "probes": 1},
        "a a f0 @5 a p f1 =half_open s1 =half_open s2 =closed",
        ["closed>open", "open>half_open", "half_open>closed"],
    ),
    (
        "a probe whose client went away frees its slot",
        {"failures": 1, "cooldown_s": 5, "probes": 1},
        "a f0 @5 a p a x r1 a p s3 =closed",
        ["closed>open", "open>half_open", "half_open>closed"],
    ),
    (
        "the failure rate opens it once min_requests were made in the window",
        {"failures": 100, "failure_rate": 0.5, "window_s": 10, "min_requests": 4},
        "a a a a s0 f1 s2 =closed f3 =open",
        ["closed>open"],
    ),
    (
        "below min_requests the rate does not count",
        {"failures": 100, "failure_rate": 0.5, "window_s": 10, "min_requests": 6},
        "a a a a s0 f1 s2 f3 =closed",
        [],
    ),
    (
        "outcomes older than the window are forgotten",
        {"failures": 100, "failure_rate": 0.5, "window_s": 10, "min_requests": 4},
        "a a a a a f0 f1 @11 s2 s3 f4 =closed",
        [],
    ),
]


def run(config: dict[str, float], script: str) -> tuple[Breaker, list[Transition]]:
    now = [0.0]
    changes: list[Transition] = []
    breaker = Breaker(BreakerConfig(**config), clock=lambda: now[0], on_change=changes.append)
    tickets: list[int | None] = []
    for token in script.split():
        head, rest = token[0], token[1:]
        if head == "a":
            tickets.append(breaker.admit())
        elif head in "+px":
            last = tickets[-1]
            got = "x" if last is None else "p" if last & 1 else "+"
            assert got == head, f"{token}: the last admission was {got}"
        elif head == "s":
            breaker.success(tickets[int(rest)])
        elif head == "f":
            index, _, retry = rest.partition(":")
            breaker.failure(tickets[int(index)], "why", float(retry) if retry else None)
        elif head == "r":
            breaker.release(tickets[int(rest)])
        elif head == "@":
            now[0] = float(rest)
        elif head == "=":
            assert breaker.state == rest, f"{token}: the breaker is {breaker.state}"
        else:
            raise ValueError(token)
    return breaker, changes


@pytest.mark.parametrize(
    ("name", "config", "script", "moves"), SCRIPTS, ids=[s[0] for s in SCRIPTS]
)
def test_the_breaker_follows_its_script(
    name: str, config: dict[str, float], script: str, moves: list[str]
) -> None:
    _, changes = run(config, script)
    assert [f"{c.before}>{c.after}" for c in changes] == moves


def test_a_transition_says_why_and_how_long() -> None:
    breaker, changes = run({"failures": 2, "cooldown_s": 7}, "a a f0 f1")
    (opened,) = changes
    assert opened.cooldown_s == 7 and opened.at == 0.0
    assert opened.why.startswith("2 consecutive failures") and breaker.why == opened.why
    breaker, changes = run({"failures": 9, "cooldown_s": 7}, "a f0:12")
    assert changes[0].cooldown_s == 12 and "retry after 12s" in changes[0].why


@pytest.mark.parametrize(
    "bad",
    [
        {"failures": 0},
        {"probes": 0},
        {"min_requests": 0},
        {"failure_rate": 0},
        {"failure_rate": 1.5},
        {"window_s": 0},
        {"cooldown_s": 10, "max_cooldown_s": 5},
    ],
)
def test_thresholds_that_make_no_sense_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**bad)


def test_a_success_costs_no_sum_over_the_window() -> None:
    """The healthy path: a success counts into the newest bucket and sums nothing."""
    now = [0.0]
    breaker = Breaker(BreakerConfig(window_s=10), clock=lambda: now[0])
    for i in range(10_000):
        now[0] = i * 0.001
        breaker.success(breaker.admit())
    assert breaker.state == "closed" and len(breaker._buckets) <= 11
