"""``trajstream compare`` without Kafka: what ``--agent``, ``--since`` and ``--policy-version``
keep of the published comparisons and routing changes, and the table it prints."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from streams.models import Comparison, RoutingShare
from streams.observe.policy import PolicyView, render
from tests.unit.factories import at, comparison


def change(version: int, action: str, judged: int | None, decided: float) -> RoutingShare:
    return RoutingShare(
        agent_name="researcher",
        share=0.1,
        version=version,
        effective_at=at(decided + 5),
        decided_at=at(decided),
        action=action,
        reason="why",
        policy_version=judged,
    )


VIEW = PolicyView(
    comparisons=[
        comparison(window_start=at(0), window_end=at(60), policy_version=3),
        comparison(window_start=at(60), window_end=at(120), policy_version=None, policy_count=30),
        comparison(
            window_start=at(60), window_end=at(120), span="version", policy_version=3,
            policy_count=10,
        ),
        comparison(
            window_start=at(60), window_end=at(120), span="version", policy_version=4,
            policy_count=20, verdict="worse",
        ),
        comparison(agent_name="other", window_start=at(0), window_end=at(60), policy_version=4),
        comparison(span="trailing", window_start=at(0), window_end=at(120), windows=2),
    ],
    routing=[
        change(1, "start", 3, 70), change(2, "rollback", 4, 130), change(3, "resume", None, 200),
    ],
)  # fmt: skip


def kept(view: PolicyView) -> list[tuple[str, str, float, int | None]]:
    return [
        (c.agent_name, c.span, c.window_start.timestamp() - at(0).timestamp(), c.policy_version)
        for c in view.comparisons
    ]


@pytest.mark.parametrize(
    ("agent", "since", "version", "comparisons", "routing"),
    [
        (None, None, None, 6, [1, 2, 3]),
        ("researcher", None, 3, [("researcher", "window", 0, 3), ("researcher", "version", 60, 3)],
         [1]),
        (None, None, 4, [("researcher", "version", 60, 4), ("other", "window", 0, 4)], [2]),
        ("researcher", at(100), 4, [("researcher", "version", 60, 4)], [2]),
        ("other", None, 3, [], []),
    ],
)  # fmt: skip
def test_what_each_filter_keeps(
    agent: str | None,
    since: object,
    version: int | None,
    comparisons: int | list[tuple[str, str, float, int | None]],
    routing: list[int],
) -> None:
    view = VIEW.of(agent, since, version)  # type: ignore[arg-type]
    got = kept(view)
    assert (len(got) if isinstance(comparisons, int) else got) == comparisons
    assert [r.version for r in view.routing] == routing


def screen(view: PolicyView) -> str:
    buffer = io.StringIO()
    render(view, Console(file=buffer, width=220))
    return buffer.getvalue()


def test_the_table_has_a_row_per_version_of_a_window_several_answered() -> None:
    text = screen(VIEW.of("researcher"))
    rows = [ln for ln in text.splitlines() if ln.startswith("│")]
    lines = [ln for ln in rows if " v3 " in ln or " v4 " in ln or "several" in ln]
    assert len(lines) == 4  # the first window (v3), the second (several), then v3 and v4
    assert "several" in lines[1] and "worse" in lines[3]
    assert "rollback of policy v4" in text and "routing v3 resume:" in text


def test_the_fallbacks_stand_beside_the_means() -> None:
    falls: Comparison = comparison(policy_fallbacks=4, policy_mixed=1, fallback_rate=5 / 45)
    text = screen(PolicyView([falls, falls.model_copy(update={"span": "trailing"})]))
    assert "4 + 1 mixed (11%)" in text
    assert "fallbacks 4 + 1 mixed (11%)" in text  # the trailing line
