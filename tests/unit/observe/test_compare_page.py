"""The status page's policy-against-production section, without Kafka: both arms' means per
window and the difference with its band, per agent, and the routing changes."""

from __future__ import annotations

import re

from streams.models import RoutingShare
from streams.observe.compare_page import compare_html
from streams.observe.pages import index_html
from tests.unit.factories import at, comparison
from tests.unit.observe.test_status import snapshot


def test_both_trends_and_the_band_per_agent() -> None:
    rows = [
        comparison(window_start=at(0), policy_mean=0.7, production_mean=0.5, lower=0.1, upper=0.3),
        comparison(
            window_start=at(60),
            policy_mean=0.4,
            production_mean=0.5,
            difference=-0.1,
            lower=-0.2,
            upper=0.0,
            verdict="inconclusive",
        ),
        comparison(
            agent_name="other",
            policy_mean=None,
            policy_count=0,
            difference=None,
            lower=None,
            upper=None,
            verdict="insufficient",
        ),
        comparison(span="trailing", windows=2),  # not drawn: the windows are
    ]
    promote = RoutingShare(
        agent_name="researcher",
        share=0.3,
        previous_share=0.2,
        version=2,
        effective_at=at(70),
        decided_at=at(65),
        action="promote",
        reason="won",
    )
    page = compare_html(rows, [promote])
    means = re.findall(r'data-arm="(\w+)" data-window-start="([^"]+)" data-mean="([^"]+)"', page)
    assert ("policy", at(0).isoformat(), "0.7") in means
    assert ("production", at(60).isoformat(), "0.5") in means
    assert len([m for m in means if m[0] == "policy"]) == 2  # "other" has no policy mean
    bands = re.findall(r'data-lower="([^"]+)" data-upper="([^"]+)" data-verdict="(\w+)"', page)
    assert bands == [("0.1", "0.3", "better"), ("-0.2", "0", "inconclusive")]
    assert page.count('class="band"') == 1  # "other" has no interval
    assert 'data-action="promote" data-share="0.3"' in page
    assert "<b>inconclusive</b>" in page and "<b>insufficient</b>" in page


def test_the_index_has_the_section() -> None:
    empty = index_html(snapshot(), [], [], [], [])
    assert 'id="compare-empty"' in empty
    page = index_html(snapshot(), [], [], [], [], comparisons=[comparison()])
    assert "Policy against production" in page and 'class="compare"' in page


def test_a_window_or_a_routing_change_written_twice_is_shown_once() -> None:
    # a redelivery after the ledger owner was killed writes a window's comparison again (a later
    # emitted_at, maybe other figures: the latest is shown) and a routing version again
    first = comparison(window_start=at(0), policy_mean=0.6, emitted_at=at(70))
    again = comparison(window_start=at(0), policy_mean=0.65, emitted_at=at(90))
    change = RoutingShare(
        agent_name="researcher",
        share=0.3,
        previous_share=0.2,
        version=2,
        effective_at=at(70),
        decided_at=at(65),
        action="promote",
        reason="won",
    )
    page = compare_html([again, first], [change, change.model_copy()])
    means = re.findall(r'data-arm="policy" data-window-start="[^"]+" data-mean="([^"]+)"', page)
    assert means == ["0.65"]
    assert page.count('data-action="promote"') == 1


def test_the_fallbacks_and_the_comparisons_per_version() -> None:
    rows = [
        comparison(window_start=at(0), policy_version=3, policy_fallbacks=4, policy_mixed=1),
        comparison(window_start=at(60), policy_version=None, policy_count=30),
        comparison(window_start=at(60), span="version", policy_version=3, policy_count=10),
        comparison(
            window_start=at(60),
            span="version",
            policy_version=4,
            policy_count=20,
            verdict="worse",
            difference=-0.2,
            lower=-0.3,
            upper=-0.1,
        ),
    ]
    rollback = RoutingShare(
        agent_name="researcher",
        share=0.0,
        previous_share=0.1,
        version=2,
        effective_at=at(130),
        decided_at=at(125),
        action="rollback",
        reason="worse (policy version 4)",
        policy_version=4,
    )
    page = compare_html(rows, [rollback])
    # the chart: the windows only, each naming its one version (none for several)
    assert re.findall(r'class="diff"[^>]*data-policy-version="(\d*)"', page) == ["3", ""]
    falls = re.search(r'class="fallbacks"[^>]*data-routed="(\d+)" data-fallbacks="(\d+)" '
                      r'data-mixed="(\d+)"', page)  # fmt: skip
    assert falls and falls.groups() == ("75", "4", "1")  # 40 + 30 answered, 5 fell back
    versions = re.findall(r'<tr class="version" data-policy-version="(\d+)" '
                          r'data-window-start="([^"]+)" data-verdict="(\w+)"', page)  # fmt: skip
    assert versions == [
        ("4", at(60).isoformat(), "worse"),
        ("3", at(60).isoformat(), "better"),
        ("3", at(0).isoformat(), "better"),
    ]
    assert 'data-action="rollback" data-share="0" data-policy-version="4"' in page
    assert "(policy v4)" in page
