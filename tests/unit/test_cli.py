"""Unit tests of streams.cli's pure parts."""

from __future__ import annotations

import pytest

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


def _setting_options() -> dict[tuple[str, str], tuple[str, object]]:
    """(command, flag) -> (setting path, argparse action) of every option that sets a setting."""
    import argparse

    from streams.cli import build_parser

    found: dict[tuple[str, str], tuple[str, object]] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        overrides = parser.get_default("setting_overrides") or {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}".strip())
            elif action.dest in overrides:
                found[(name, action.option_strings[0])] = (overrides[action.dest], action)

    walk(build_parser(), "")
    return found


def test_options_that_set_a_setting_follow_its_field() -> None:
    import typing
    from pathlib import Path

    from streams.cli_support import setting_field

    options = _setting_options()
    assert {key: path for key, (path, _) in options.items()} == {
        ("gateway", "--host"): "gateway.host",
        ("gateway", "--port"): "gateway.port",
        ("gateway", "--mode"): "gateway.mode",
        ("gateway", "--production-url"): "gateway.production_url",
        ("otlp", "--host"): "otlp.host",
        ("otlp", "--port"): "otlp.port",
    }
    for (command, flag), (path, action) in options.items():
        info = setting_field(path)
        annotation = info.annotation
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) not in (None, typing.Literal) and len(members) == 1:
            annotation = members[0]  # X | None
        where = f"{command} {flag} ({path})"
        if typing.get_origin(annotation) is typing.Literal:
            assert action.choices == list(typing.get_args(annotation)), where
        elif annotation in (int, float, Path):
            assert action.type is annotation, where
        else:
            assert annotation is str and action.type is None, where
        help_text = action.help.replace("%%", "%")
        env = "TRAJSTREAM_" + path.upper().replace(".", "__")
        assert f"{path} [{env}]" in help_text, where
        assert info.description is None or info.description in help_text, where
        assert action.default is None, where  # the settings decide unless given


def test_a_setting_option_wins_over_the_environment_for_its_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from streams.cli import build_parser, main
    from streams.cli_support import setting_overrides
    from streams.settings import load_settings

    monkeypatch.setenv("TRAJSTREAM_GATEWAY__MODE", "shadow")
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__PORT", "9000")
    args = build_parser().parse_args(["gateway", "--port", "8123", "--host", "0.0.0.0"])
    assert setting_overrides(args) == {"gateway": {"port": 8123, "host": "0.0.0.0"}}
    settings = load_settings(None, **setting_overrides(args))
    assert (settings.gateway.port, settings.gateway.host, settings.gateway.mode) == (
        8123,
        "0.0.0.0",
        "shadow",
    )
    assert setting_overrides(build_parser().parse_args(["otlp"])) == {}
    assert setting_overrides(build_parser().parse_args(["worker"])) == {}
    # validated as the setting: a usage error naming it, before the command runs
    assert main(["otlp", "--port", "70000"]) == 2
    assert "bad setting otlp.port [TRAJSTREAM_OTLP__PORT]" in capsys.readouterr().err


def test_setting_option_refuses_what_it_cannot_type() -> None:
    import argparse

    from streams.cli_support import setting_option

    with pytest.raises(TypeError, match=r"gateway\.api_keys"):
        setting_option(argparse.ArgumentParser(), "gateway.api_keys")
    with pytest.raises(KeyError):
        setting_option(argparse.ArgumentParser(), "gateway.no_such_setting")
