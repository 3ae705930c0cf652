"""The status page's renders: pure functions of the records, checked without Kafka."""

from __future__ import annotations

import re
from xml.etree import ElementTree

from streams.models import FeedbackKind, Selection, SelectionDecision, UserFeedback, WindowSummary
from streams.observe.pages import DecisionRow, call_html, index_html, trend_svg

from ..factories import T0, at, rewarded, trajectory
from .test_status import snapshot


def window(agent: str, start: float, mean: float, model: str = "m") -> WindowSummary:
    return WindowSummary(
        window_start=at(start),
        window_end=at(start + 60),
        agent_name=agent,
        model=model,
        count=3,
        mean=mean,
        min=0.0,
        max=1.0,
        stddev=0.1,
        success_rate=mean,
        emitted_at=at(99),
    )


def test_trend_has_one_point_per_window_and_one_line_per_agent_and_model():
    windows = [
        window("a", 0, 0.2),
        window("a", 60, 0.8),
        window("b", 0, 1.0),
        window("a", 0, 0.5, "n"),
    ]
    svg = trend_svg(windows)
    root = ElementTree.fromstring(svg)  # well-formed XML, as a browser parses inline SVG
    ns = "{http://www.w3.org/2000/svg}"
    circles = root.findall(f"{ns}circle")
    assert len(circles) == 4
    assert {
        (c.get("data-agent"), c.get("data-model"), c.get("data-window-start")) for c in circles
    } == {
        ("a", "m", at(0).isoformat()),
        ("a", "m", at(60).isoformat()),
        ("b", "m", at(0).isoformat()),
        ("a", "n", at(0).isoformat()),
    }
    assert len(root.findall(f"{ns}polyline")) == 3
    # higher mean, higher on the screen (smaller y)
    by_mean = {float(c.get("data-mean")): float(c.get("cy")) for c in circles}
    assert by_mean[1.0] < by_mean[0.8] < by_mean[0.5] < by_mean[0.2]
    # later window, further right
    a = sorted(
        (c for c in circles if c.get("data-agent") == "a" and c.get("data-model") == "m"),
        key=lambda c: c.get("data-window-start"),
    )
    assert float(a[0].get("cx")) < float(a[1].get("cx"))


def test_trend_without_windows_says_so():
    assert "no closed reward windows yet" in trend_svg([])


def test_names_are_escaped():
    svg = trend_svg([window('<script>alert(1)</script>"', 0, 0.5)])
    assert "<script>" not in svg
    ElementTree.fromstring(svg)


def decision(call_id: str, selected: bool = True) -> SelectionDecision:
    return SelectionDecision(
        call_id=call_id,
        agent_name="bot<b>",
        model="m",
        selection=Selection(
            selected=selected,
            strategy="sampling(1)",
            reason="sampled" if selected else "not-sampled",
        ),
        closed_reason="ended",
        steps=3,
        decided_at=at(5),
    )


def test_index_links_each_call_with_its_partition_and_time():
    rows = [DecisionRow(decision("c/1"), 2, 1000), DecisionRow(decision("c2", False), 0, 2000)]
    page = index_html(snapshot(), rows, [window("a", 0, 0.5)], [], [])
    assert 'href="/calls/c%2F1?p=2&amp;t=1000"' in page
    assert page.index("c2") < page.index("c/1")  # newest first
    assert "bot&lt;b&gt;" in page and "bot<b>" not in page
    assert "not-sampled" in page and "nothing needs attention" in page
    assert len(re.findall("<circle", page)) == 1


def test_call_page_shows_decision_steps_reward_and_components():
    t = trajectory(
        "c1",
        feedback=[
            UserFeedback(
                event_id="f", call_id="c1", event_time=T0, kind=FeedbackKind.RATING, rating=4.0
            )
        ],
    )
    r = rewarded("c1", 0.75, components={"success": 1.0, "latency_efficiency": 0.5})
    page = call_html("c1", decision("c1"), t, r)
    assert re.findall(r'<tr class="step" data-seq="(\d+)"', page) == ["0", "1", "2"]
    assert '<span id="reward">0.75</span>' in page
    assert "<td>latency_efficiency</td><td>0.5</td>" in page
    assert "RATING 4.0" in page
    assert "selected</span> by <code>sampling(1)</code> (sampled)" in page


def test_call_page_for_a_rejected_call():
    page = call_html("c9", decision("c9", selected=False), None, None)
    assert 'id="no-trajectory"' in page and 'id="no-reward"' in page
    assert "rejected" in page
    page = call_html("zz", None, None, None)
    assert 'id="no-decision"' in page


def test_the_versions_of_a_policy_window_are_one_point():
    split = [
        window("a", 0, 0.2).model_copy(update={"upstream": "trinity", "policy_version": 3}),
        window("a", 0, 0.8).model_copy(update={"upstream": "trinity", "policy_version": 4}),
    ]
    root = ElementTree.fromstring(trend_svg(split))
    (circle,) = root.findall("{http://www.w3.org/2000/svg}circle")
    assert float(circle.get("data-mean") or 0) == 0.5  # 3 calls at 0.2, 3 at 0.8
