"""Unit tests of streams.select: the strategies, their combinations and their spellings."""

from __future__ import annotations

import hashlib
import math
import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.select import (
    AllOf,
    AnyOf,
    CallView,
    ExplicitMark,
    PerKey,
    SamplingRate,
    Strategy,
    build_strategy,
    sample_point,
)
from streams.errors import ConfigError
from streams.models import Selection
from tests.unit.factories import T0, end, mark, start


def view(call_id: str = "call-1", *, model: str | None = None, **end_kw: Any) -> CallView:
    return CallView(call_id, start(call_id), end(call_id, **end_kw), model)


class MyStrategy:
    """A plugin strategy, named in the settings as ``tests.unit.core.test_select:MyStrategy``."""

    name = "mine"

    def decide(self, call: CallView) -> Selection:
        hit = call.call_id.startswith("keep")
        return Selection(selected=hit, strategy=self.name, reason="kept" if hit else "dropped")


class NotAStrategy:
    pass


class Fixed:
    """A strategy with a fixed answer, for testing the combinators."""

    def __init__(self, name: str, selected: bool) -> None:
        self.name = name
        self.selected = selected
        self.calls = 0

    def decide(self, call: CallView) -> Selection:
        self.calls += 1
        return Selection(selected=self.selected, strategy=self.name, reason=f"{self.name}-reason")


# -- SamplingRate ----------------------------------------------------------------------------


@given(st.text(min_size=1))
def test_sample_point_is_the_documented_formula(call_id: str) -> None:
    digest = hashlib.sha256(call_id.encode("utf-8")).digest()
    expected = int.from_bytes(digest[:8], "big") / 2**64
    assert sample_point(call_id) == expected
    assert 0.0 <= sample_point(call_id) < 1.0


@given(call_id=st.text(min_size=1), rate=st.floats(0.0, 1.0))
def test_sampling_is_deterministic_and_follows_the_point(call_id: str, rate: float) -> None:
    strategy = SamplingRate(rate)
    first = strategy.decide(view(call_id))
    assert strategy.decide(view(call_id)) == first
    assert SamplingRate(rate).decide(view(call_id)) == first  # another worker, same answer
    assert first.selected == (sample_point(call_id) < rate)
    assert first.reason == ("sampled" if first.selected else "not-sampled")
    assert first.strategy == f"sampling({rate:g})"


@pytest.mark.parametrize(("rate", "selected"), [(0.0, False), (1.0, True)])
def test_sampling_extremes(rate: float, selected: bool) -> None:
    assert all(SamplingRate(rate).decide(view(f"c{i}")).selected is selected for i in range(200))


@pytest.mark.parametrize("rate", [-0.01, 1.01, 2.0, math.nan])
def test_sampling_rate_out_of_range_is_a_config_error(rate: float) -> None:
    with pytest.raises(ConfigError, match="between 0 and 1"):
        SamplingRate(rate)


N_IDS = 20_000
_rng = random.Random(20260101)
POINTS = [sample_point(f"call-{_rng.getrandbits(64):016x}-{i}") for i in range(N_IDS)]


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5])
def test_selected_fraction_is_binomial_within_four_sigma(p: float) -> None:
    selected = sum(point < p for point in POINTS)
    sigma = math.sqrt(N_IDS * p * (1 - p))
    assert abs(selected - N_IDS * p) <= 4 * sigma, (selected, N_IDS * p, sigma)


def test_sequential_ids_are_not_correlated() -> None:
    # ids that differ in one character must not select in runs
    points = [sample_point(f"call-{i}") for i in range(N_IDS)]
    hits = sum(point < 0.5 for point in points)
    assert abs(hits - N_IDS / 2) <= 4 * math.sqrt(N_IDS / 4)


# -- ExplicitMark ----------------------------------------------------------------------------

ENDED = T0 + timedelta(seconds=100)


@pytest.mark.parametrize(
    ("mark_age", "expected"),
    [
        (None, (False, "unmarked")),
        (timedelta(0), (True, "marked")),
        (timedelta(seconds=30), (True, "marked")),
        (timedelta(seconds=60), (True, "marked")),  # exactly the TTL: still valid
        (timedelta(seconds=60, milliseconds=1), (False, "expired")),
        (timedelta(hours=5), (False, "expired")),
        (timedelta(seconds=-3), (True, "marked")),  # within the clock skew
        (timedelta(seconds=-5), (True, "marked")),  # exactly the skew
        (timedelta(seconds=-5, milliseconds=-1), (False, "mark-from-future")),
        (timedelta(hours=-1), (False, "mark-from-future")),
    ],
    ids=[
        "unmarked",
        "fresh",
        "30s",
        "at-ttl",
        "ttl+1ms",
        "5h",
        "future-3s",
        "future-at-skew",
        "future-skew+1ms",
        "future-1h",
    ],
)
def test_explicit_mark(mark_age: timedelta | None, expected: tuple[bool, str]) -> None:
    the_mark = None if mark_age is None else mark(marked_at=ENDED - mark_age)
    strategy = ExplicitMark(ttl=timedelta(seconds=60), max_skew=timedelta(seconds=5))
    decision = strategy.decide(view(event_time=ENDED, mark=the_mark))
    assert (decision.selected, decision.reason) == expected
    assert decision.strategy == "marked(ttl=60s)"


def test_mark_on_the_start_counts_and_the_end_mark_wins() -> None:
    on_start = CallView("c", start("c", mark=mark(marked_at=T0)), end("c", event_time=T0))
    assert ExplicitMark().decide(on_start).selected
    expired_end = CallView(
        "c",
        start("c", mark=mark(marked_at=T0)),
        end("c", event_time=T0, mark=mark(marked_at=T0 - timedelta(hours=1))),
    )
    assert ExplicitMark().decide(expired_end).reason == "expired"
    no_start = CallView("c", None, end("c", event_time=T0))
    assert ExplicitMark().decide(no_start).reason == "unmarked"


# -- combinators -----------------------------------------------------------------------------


def test_any_of_returns_the_first_selecting_decision_and_stops() -> None:
    a, b, c = Fixed("a", False), Fixed("b", True), Fixed("c", True)
    decision = AnyOf([a, b, c]).decide(view())
    assert decision == Selection(selected=True, strategy="b", reason="b-reason")
    assert (a.calls, b.calls, c.calls) == (1, 1, 0)


def test_any_of_nothing_selected_joins_the_reasons() -> None:
    strategy = AnyOf([Fixed("a", False), Fixed("b", False)])
    assert strategy.decide(view()) == Selection(
        selected=False, strategy="any(a,b)", reason="a-reason,b-reason"
    )


def test_all_of_returns_the_first_refusal_and_stops() -> None:
    a, b, c = Fixed("a", True), Fixed("b", False), Fixed("c", False)
    assert AllOf([a, b, c]).decide(view()) == Selection(
        selected=False, strategy="b", reason="b-reason"
    )
    assert c.calls == 0


def test_all_of_everything_selected_joins_the_reasons() -> None:
    strategy = AllOf([Fixed("a", True), Fixed("b", True)])
    assert strategy.decide(view()) == Selection(
        selected=True, strategy="all(a,b)", reason="a-reason,b-reason"
    )


@pytest.mark.parametrize(
    ("by", "agent", "model", "expected"),
    [
        ("agent", "researcher", None, "r"),
        ("agent", "coder", "qwen", "c"),
        ("agent", "other", "qwen", "default"),
        ("agent", None, "qwen", "default"),
        ("model", "researcher", "qwen", "q"),
        ("model", "researcher", "llama", "default"),
        ("model", "researcher", None, "default"),
    ],
)
def test_per_key(by: str, agent: str | None, model: str | None, expected: str) -> None:
    strategies = {
        "researcher": Fixed("r", True),
        "coder": Fixed("c", True),
        "qwen": Fixed("q", True),
    }
    strategy = PerKey(by, strategies, Fixed("default", False))
    call = CallView("c", start("c", agent_name=agent), end("c", agent_name=agent), model)
    assert strategy.decide(call).strategy == expected
    assert strategy.name == f"per-{by}"


def test_call_view_agent_name_falls_back_to_the_start() -> None:
    call = CallView("c", start("c", agent_name="from-start"), end("c", agent_name=None))
    assert call.agent_name == "from-start"
    assert call.ended_at == call.end.event_time


# -- build_strategy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kwargs", "cls", "name"),
    [
        ("sampling", {}, SamplingRate, "sampling(0.1)"),
        ("sampling", {"rate": 0.3}, SamplingRate, "sampling(0.3)"),
        ("sampling:0.25", {"rate": 0.3}, SamplingRate, "sampling(0.25)"),
        ("sampling:0", {}, SamplingRate, "sampling(0)"),
        ("sampling:1", {}, SamplingRate, "sampling(1)"),
        ("marked", {}, ExplicitMark, "marked(ttl=60s)"),
        ("marked", {"mark_ttl": timedelta(seconds=5)}, ExplicitMark, "marked(ttl=5s)"),
        ("marked:120", {}, ExplicitMark, "marked(ttl=120s)"),
        ("marked:0.5", {}, ExplicitMark, "marked(ttl=0.5s)"),
        ("  sampling:0.2  ", {}, SamplingRate, "sampling(0.2)"),
        ("any(marked,sampling:0.1)", {}, AnyOf, "any(marked(ttl=60s),sampling(0.1))"),
        ("any( marked , sampling )", {"rate": 0.2}, AnyOf, "any(marked(ttl=60s),sampling(0.2))"),
        ("all(marked,sampling:1)", {}, AllOf, "all(marked(ttl=60s),sampling(1))"),
        (
            "any(all(marked:30,sampling:0.5),sampling:0.01)",
            {},
            AnyOf,
            "any(all(marked(ttl=30s),sampling(0.5)),sampling(0.01))",
        ),
        (
            "all(any(marked,sampling),any(sampling:0.5))",
            {},
            AllOf,
            "all(any(marked(ttl=60s),sampling(0.1)),any(sampling(0.5)))",
        ),
        (
            "any(marked,tests.unit.core.test_select:MyStrategy)",
            {},
            AnyOf,
            "any(marked(ttl=60s),mine)",
        ),
    ],
)
def test_build_strategy_spellings(spec: str, kwargs: dict[str, Any], cls: type, name: str) -> None:
    strategy = build_strategy(spec, **kwargs)
    assert type(strategy) is cls
    assert strategy.name == name
    assert isinstance(strategy, Strategy)


def test_built_strategies_decide() -> None:
    marked = view(event_time=T0, mark=mark(marked_at=T0))
    assert build_strategy("all(marked,sampling:1)").decide(marked).reason == "marked,sampled"
    assert not build_strategy("all(marked,sampling:0)").decide(marked).selected
    assert build_strategy("any(sampling:0,marked)").decide(marked).reason == "marked"
    assert build_strategy("any(sampling:0,marked)").decide(view()).reason == "not-sampled,unmarked"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("sampling:abc", "'abc' is not a number"),
        ("sampling:2", "between 0 and 1"),
        ("sampling:-0.5", "between 0 and 1"),
        ("sampling:nan", "between 0 and 1"),
        ("marked:abc", "'abc' is not a number"),
        ("bogus", "unknown selection strategy 'bogus'"),
        ("", "unknown selection strategy ''"),
        ("random:0.1", "unknown selection strategy"),
        ("any()", "combines nothing"),
        ("all( , )", "combines nothing"),
        ("any(marked,bogus)", "unknown selection strategy 'bogus'"),
        ("any(marked", "unknown selection strategy"),
        ("tests.unit.core.test_select", "unknown selection strategy"),  # a module, no attribute
        ("tests.unit.core.test_select:NotAStrategy", "has no name and decide"),
        ("tests.unit.core.test_select:Missing", "has no attribute 'Missing'"),
        ("no_such_package.mod:Strategy", "cannot import 'no_such_package.mod'"),
    ],
)
def test_build_strategy_refuses_bad_spellings(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_strategy(spec)


@pytest.mark.parametrize("spec", ["marked:-5", "marked:nan", "marked:inf"])
def test_build_strategy_refuses_bad_mark_ttls(spec: str) -> None:
    with pytest.raises(ConfigError):
        build_strategy(spec)


def test_plugin_by_dotted_path() -> None:
    strategy = build_strategy("tests.unit.core.test_select:MyStrategy")
    assert type(strategy).__name__ == "MyStrategy"
    assert strategy.name == "mine"
    assert strategy.decide(view("keep-1")).selected
    assert strategy.decide(view("drop-1")).reason == "dropped"


def test_plugin_loader_seam_accepts_instances() -> None:
    seen: list[str] = []

    def loader(name: str) -> object:
        seen.append(name)
        return MyStrategy()  # an instance is used as it is

    strategy = build_strategy("any(sampling:0,pkg.mod:thing)", loader=loader)
    assert seen == ["pkg.mod:thing"]
    assert strategy.decide(view("keep-2")).strategy == "mine"
