"""Unit tests of streams.cli's pure parts."""

from __future__ import annotations

from streams.cli import audit_table


def test_audit_columns_fit_long_strategy_names() -> None:
    long = "any(marked,sampling:0.25,rule:agent_name=a-support-agent-with-a-long-name)"
    table = audit_table(
        {
            ("support", long, "selected", "marked"): 3,
            ("a-much-longer-agent-name", "marked", "rejected", "unmarked,not-sampled"): 1200,
        }
    ).splitlines()
    header, *rows = table
    assert header.split() == ["agent", "strategy", "decision", "reason", "calls"]
    # every column starts at the same offset in every line
    for column in ("strategy", "decision", "reason"):
        at = header.index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows), (column, table)
    assert rows[1].split()[1] == long
    assert len({len(line) for line in table}) == 1  # counts right-aligned in one column


def test_audit_table_without_decisions_is_the_header() -> None:
    assert audit_table({}).split() == ["agent", "strategy", "decision", "reason", "calls"]


def test_commits_resume_parses_its_filters() -> None:
    from streams.cli import build_parser, cmd_commits_resume

    args = build_parser().parse_args(["commits", "resume", "--agent", "a", "--by", "ops"])
    assert (args.func, args.agent, args.model, args.by, args.reason) == (
        cmd_commits_resume,
        "a",
        None,
        "ops",
        "",
    )


def test_hold_on_drift_reaches_the_ledger_config() -> None:
    from streams.runtime.config import ledger_config_of
    from streams.settings import Settings

    assert not ledger_config_of(Settings()).hold_on_drift
    assert ledger_config_of(Settings(commit={"hold_on_drift": True})).hold_on_drift
