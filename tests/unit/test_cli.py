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


def test_replay_options_are_one_list_the_parser_is_built_from() -> None:
    from dataclasses import fields
    from datetime import UTC, datetime
    from pathlib import Path

    from streams.cli import build_parser
    from streams.runtime.replay_options import OffsetRange, ReplayOptions

    now = datetime(2026, 1, 31, 12, tzinfo=UTC)
    args = build_parser().parse_args(
        (
            "replay --offsets agent-events:0:5-9 --lookback 30 --strategy marked --reward m:f "
            "--min-reward 0.7 --to files --to trinity --out d --dpo-margin 0.1 --commit-every 3 "
            "--commit-interval 2 --redact --redact-pattern a+ --redact-pattern b"
        ).split()
    )
    options = ReplayOptions.from_args(args, "p", now)
    assert options == ReplayOptions(
        offsets=[OffsetRange("p.agent-events", 0, 5, 9)],
        lookback_s=30.0,
        strategy="marked",
        reward="m:f",
        min_reward=0.7,
        to={"files", "trinity"},
        out=Path("d"),
        dpo_margin=0.1,
        commit_every=3,
        commit_interval_s=2.0,
        redact=True,
        redact_patterns=["a+", "b"],
    )
    since = ReplayOptions.from_args(
        build_parser().parse_args(["replay", "--since", "2h"]), "p", now
    )
    assert since.since == datetime(2026, 1, 31, 10, tzinfo=UTC) and since.to == set()
    # nothing given: every field's own default
    assert ReplayOptions.from_args(build_parser().parse_args(["replay"]), "p", now) == (
        ReplayOptions()
    )
    assert all("cli" in f.metadata for f in fields(ReplayOptions))
