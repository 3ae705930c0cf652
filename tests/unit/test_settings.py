"""Unit tests of streams.settings: defaults, environment, config files and error messages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from streams import settings as settings_module
from streams.errors import ConfigError
from streams.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TRAJSTREAM_* or KAFKA_* variable from the caller, no config file left from a test."""
    for key in list(os.environ):
        if key.startswith("TRAJSTREAM_") or key == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(key)
    monkeypatch.setattr(settings_module, "_CONFIG_FILE", {})
    monkeypatch.chdir(tmp_path)


def get(settings: Settings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("app_id", "trajstream"),
        ("log_level", "info"),
        ("cache_dir", Path(".cache/trajstream")),
        ("kafka.bootstrap_servers", None),
        ("kafka.topic_prefix", "trajstream"),
        ("kafka.partitions", 4),
        ("kafka.replication_factor", 1),
        ("trinity.url", "http://127.0.0.1:8010"),
        ("trinity.timeout_s", 10.0),
        ("selection.strategy", "any(marked,sampling)"),
        ("selection.rate", 0.1),
        ("selection.mark_ttl_s", 60.0),
        ("assembly.max_steps", 256),
        ("assembly.abandon_after_s", 600.0),
        ("reward.function", "streams.rewards:success"),
        ("reward.weights", {}),
        ("windows.size_s", 60),
        ("windows.grace_s", 10.0),
        ("commit.interval_s", 300.0),
        ("commit.min_batch", 1),
        ("commit.commit_empty", False),
        ("reward.train_mixed", False),
        ("gateway.rollout.max_fallback_rate", 0.1),
        ("config", None),
        ("bootstrap_servers", None),
    ],
)
def test_defaults(dotted: str, value: Any) -> None:
    assert get(load_settings(), dotted) == value


@pytest.mark.parametrize(
    ("env", "value", "dotted", "expected"),
    [
        ("TRAJSTREAM_LOG_LEVEL", "debug", "log_level", "debug"),
        ("TRAJSTREAM_APP_ID", "prod-1", "app_id", "prod-1"),
        ("TRAJSTREAM_KAFKA__PARTITIONS", "12", "kafka.partitions", 12),
        (
            "TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS",
            "k1:9092,k2:9092",
            "bootstrap_servers",
            "k1:9092,k2:9092",
        ),
        ("TRAJSTREAM_COMMIT__INTERVAL_S", "60", "commit.interval_s", 60.0),
        ("TRAJSTREAM_COMMIT__COMMIT_EMPTY", "true", "commit.commit_empty", True),
        ("TRAJSTREAM_SELECTION__RATE", "0.25", "selection.rate", 0.25),
        (
            "TRAJSTREAM_SELECTION__STRATEGY",
            "any(marked:30,sampling:0.2)",
            "selection.strategy",
            "any(marked:30,sampling:0.2)",
        ),
        (
            "TRAJSTREAM_REWARD__WEIGHTS",
            '{"streams.rewards:success": 2}',
            "reward.weights",
            {"streams.rewards:success": 2.0},
        ),
        (
            "TRAJSTREAM_TRINITY__URL",
            "https://trinity.example:443",
            "trinity.url",
            "https://trinity.example:443",
        ),
    ],
)
def test_environment_overrides(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, dotted: str, expected: Any
) -> None:
    monkeypatch.setenv(env, value)
    assert get(load_settings(), dotted) == expected


def test_keyword_overrides_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_LOG_LEVEL", "debug")
    assert load_settings(log_level="error").log_level == "error"


def test_home_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRAJSTREAM_CACHE_DIR", "~/cache")
    assert load_settings().cache_dir == tmp_path / "cache"


@pytest.mark.parametrize(
    ("kafka_env", "own_env", "expected"),
    [
        (None, None, None),
        ("", None, None),
        ("broker:9092", None, "broker:9092"),
        ("broker:9092", "mine:9093", "mine:9093"),
        (None, "mine:9093", "mine:9093"),
    ],
)
def test_kafka_bootstrap_servers_is_honoured(
    monkeypatch: pytest.MonkeyPatch,
    kafka_env: str | None,
    own_env: str | None,
    expected: str | None,
) -> None:
    if kafka_env is not None:
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_env)
    if own_env is not None:
        monkeypatch.setenv("TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS", own_env)
    assert load_settings().bootstrap_servers == expected


# -- config files ----------------------------------------------------------------------------

TOML = """\
log_level = "warn"

[kafka]
partitions = 8

[selection]
strategy = "marked:120"
rate = 0.5

[reward]
function = "composite"
weights = { "streams.rewards:success" = 3, "streams.rewards:user_rating" = 1 }
"""

YAML = """\
log_level: warn
kafka:
  partitions: 8
selection:
  strategy: "marked:120"
  rate: 0.5
reward:
  function: composite
  weights:
    "streams.rewards:success": 3
    "streams.rewards:user_rating": 1
"""

FROM_FILE = {
    "log_level": "warn",
    "kafka.partitions": 8,
    "selection.strategy": "marked:120",
    "selection.rate": 0.5,
    "reward.function": "composite",
    "reward.weights": {"streams.rewards:success": 3.0, "streams.rewards:user_rating": 1.0},
    "commit.interval_s": 300.0,  # not in the file: the default
}


@pytest.fixture(
    params=[("settings.toml", TOML), ("settings.yaml", YAML), ("settings.yml", YAML)],
    ids=["toml", "yaml", "yml"],
)
def config_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    name, text = request.param
    path: Path = tmp_path / name
    path.write_text(text)
    return path


def test_config_file_by_argument(config_file: Path) -> None:
    loaded = load_settings(config_file)
    for dotted, value in FROM_FILE.items():
        assert get(loaded, dotted) == value, dotted


def test_config_file_by_environment(monkeypatch: pytest.MonkeyPatch, config_file: Path) -> None:
    monkeypatch.setenv("TRAJSTREAM_CONFIG", str(config_file))
    loaded = load_settings()
    for dotted, value in FROM_FILE.items():
        assert get(loaded, dotted) == value, dotted
    assert loaded.config == config_file


def test_config_argument_wins_over_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch, config_file: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.toml"
    other.write_text('[selection]\nstrategy = "sampling:0.5"\n')
    monkeypatch.setenv("TRAJSTREAM_CONFIG", str(other))
    loaded = load_settings(config_file)
    assert loaded.selection.strategy == "marked:120" and loaded.config == config_file
    monkeypatch.setenv("TRAJSTREAM_CONFIG", str(tmp_path / "missing.toml"))
    assert load_settings(config_file).selection.strategy == "marked:120"  # not even checked
    with pytest.raises(ConfigError, match="no such file"):  # without --config it is read
        load_settings()


def test_environment_beats_the_file_and_keywords_beat_both(
    monkeypatch: pytest.MonkeyPatch, config_file: Path
) -> None:
    monkeypatch.setenv("TRAJSTREAM_SELECTION__RATE", "0.75")
    loaded = load_settings(config_file, log_level="debug")
    assert (loaded.selection.rate, loaded.log_level, loaded.kafka.partitions) == (0.75, "debug", 8)
    assert loaded.selection.strategy == "marked:120"  # the rest of the section still applies


def test_a_later_load_without_a_file_forgets_it(config_file: Path) -> None:
    assert load_settings(config_file).log_level == "warn"
    assert load_settings().log_level == "info"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "[kafka]\npartitions = 0\n",
            r"bad setting kafka\.partitions \[TRAJSTREAM_KAFKA__PARTITIONS\]",
        ),
        (
            "[selection]\nrate = 1.5\n",
            r"bad setting selection\.rate \[TRAJSTREAM_SELECTION__RATE\]",
        ),
        ("colour = 'blue'\n", r"bad setting colour \[TRAJSTREAM_COLOUR\]: Extra inputs"),
    ],
)
def test_bad_values_in_a_file_are_config_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_settings(path)


def test_misspelt_key_in_a_config_file_section_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("[commit]\nintervl_s = 60\n")
    with pytest.raises(ConfigError, match="intervl_s"):
        load_settings(path)


@pytest.mark.parametrize("name", ["missing.toml", "missing.yaml", "dir/missing.yml"])
def test_missing_config_file_is_a_config_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / name)


def test_missing_config_file_in_the_environment_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRAJSTREAM_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"TRAJSTREAM_CONFIG=.*missing\.toml: no such file"):
        load_settings()


def test_config_file_of_another_format_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"log_level": "debug"}')
    with pytest.raises(ConfigError, match=r"use a \.toml or \.yaml file"):
        load_settings(path)


def test_config_file_of_another_format_in_the_environment_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"log_level": "debug"}')
    monkeypatch.setenv("TRAJSTREAM_CONFIG", str(path))
    with pytest.raises(ConfigError, match=r"settings\.json"):
        load_settings()


# -- error messages --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "value", "dotted"),
    [
        ("TRAJSTREAM_SELECTION__RATE", "1.5", "selection.rate"),
        ("TRAJSTREAM_SELECTION__RATE", "-0.1", "selection.rate"),
        ("TRAJSTREAM_KAFKA__PARTITIONS", "0", "kafka.partitions"),
        ("TRAJSTREAM_KAFKA__PARTITIONS", "four", "kafka.partitions"),
        ("TRAJSTREAM_COMMIT__INTERVAL_S", "abc", "commit.interval_s"),
        ("TRAJSTREAM_COMMIT__INTERVAL_S", "0", "commit.interval_s"),
        ("TRAJSTREAM_COMMIT__MIN_BATCH", "0", "commit.min_batch"),
        ("TRAJSTREAM_WINDOWS__SIZE_S", "1.5", "windows.size_s"),
        ("TRAJSTREAM_LOG_LEVEL", "verbose", "log_level"),
        ("TRAJSTREAM_APP_ID", "has space", "app_id"),
        ("TRAJSTREAM_TRINITY__URL", "ftp://trinity", "trinity.url"),
        ("TRAJSTREAM_KAFKA__TOPIC_PREFIX", "a/b", "kafka.topic_prefix"),
        (
            "TRAJSTREAM_GATEWAY__ROLLOUT__MAX_FALLBACK_RATE",
            "1.5",
            "gateway.rollout.max_fallback_rate",
        ),
        ("TRAJSTREAM_REWARD__TRAIN_MIXED", "maybe", "reward.train_mixed"),
    ],
)
def test_config_error_names_the_setting_and_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, dotted: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert f"bad setting {dotted} [{env}]" in message
    assert f"(got {value!r})" in message
    assert isinstance(info.value.__cause__, Exception)


@pytest.mark.parametrize(
    ("overrides", "dotted", "env"),
    [
        ({"selection": {"rate": 1.5}}, "selection.rate", "TRAJSTREAM_SELECTION__RATE"),
        ({"kafka": {"partitions": 0}}, "kafka.partitions", "TRAJSTREAM_KAFKA__PARTITIONS"),
        ({"commit": {"interval_s": "abc"}}, "commit.interval_s", "TRAJSTREAM_COMMIT__INTERVAL_S"),
    ],
)
def test_config_error_for_keyword_overrides(
    overrides: dict[str, Any], dotted: str, env: str
) -> None:
    with pytest.raises(ConfigError, match=rf"bad setting {dotted} \[{env}\]"):
        load_settings(**overrides)


def test_every_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_SELECTION__RATE", "1.5")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__PARTITIONS", "0")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "selection.rate" in str(info.value) and "kafka.partitions" in str(info.value)


@pytest.mark.parametrize("spec", ["bogus", "sampling:abc", "any()", "no.such.module:Strategy"])
def test_strategy_spelling_is_not_validated_here(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv("TRAJSTREAM_SELECTION__STRATEGY", spec)
    assert load_settings().selection.strategy == spec


@pytest.mark.parametrize(
    "env", ["TRAJSTREAM_COLOUR", "TRAJSTREAM_COMMIT__INTERVL_S", "TRAJSTREAM_KAFKA__PARTITIONS__X"]
)
def test_unknown_variables_are_config_errors(monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv(env, "1")
    with pytest.raises(ConfigError, match=f"unknown setting {env}"):
        load_settings()


def test_variables_that_are_not_settings_are_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_VENV", "/somewhere")
    assert load_settings().app_id == "trajstream"


# -- issue 14: settings that lied ---------------------------------------------------------------


def test_a_trinity_url_with_credentials_is_refused_naming_the_setting() -> None:
    from streams.errors import ConfigError
    from streams.settings import load_settings

    with pytest.raises(ConfigError, match=r"trinity\.url") as err:
        load_settings(trinity={"url": "http://user:secret@trinity:8010"})
    assert "credentials" in str(err.value)
    assert "secret" not in str(err.value)


@pytest.mark.parametrize(
    "name", ["BROKER_URL", "TOPIC_REPLICATION_FACTOR", "APP_STORE", "APP_ENV_PREFIX"]
)
def test_faust_environment_overrides_are_refused(name: str) -> None:
    from streams.errors import ConfigError
    from streams.settings import check_faust_environment

    with pytest.raises(ConfigError, match=name):
        check_faust_environment({name: "x"})


def test_faust_variables_that_override_nothing_pass() -> None:
    from streams.settings import check_faust_environment

    check_faust_environment({"BROKER_SESSION_TIMEOUT": "10", "PATH": "/bin"})


def test_the_refused_names_are_faust_settings_read_from_the_environment() -> None:
    """Guards the list against a Faust upgrade renaming its variables."""
    from faust.types.settings.settings import Settings as FaustSettings

    from streams.settings import FAUST_ENV_OVERRIDES

    read = {p.env_name for p in FaustSettings.SETTINGS.values() if p.env_name}
    assert set(FAUST_ENV_OVERRIDES) <= read


# -- reward.judge ------------------------------------------------------------------------------


def test_the_judge_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from streams.cli import cmd_settings

    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Score the answer.\n")
    monkeypatch.setenv("TRAJSTREAM_REWARD__FUNCTION", "streams.rewards:judge")
    monkeypatch.setenv("TRAJSTREAM_REWARD__JUDGE__URL", "https://judge.example/v1/")
    monkeypatch.setenv("TRAJSTREAM_REWARD__JUDGE__MODEL", "gpt-judge")
    monkeypatch.setenv("TRAJSTREAM_REWARD__JUDGE__RUBRIC_FILE", str(rubric))
    monkeypatch.setenv("TRAJSTREAM_REWARD__JUDGE__API_KEY", "sk-very-secret")
    s = load_settings()
    j = s.reward.judge
    assert (j.url, j.model, j.rubric_file, j.max_age_s) == (
        "https://judge.example/v1",
        "gpt-judge",
        rubric,
        900.0,
    )
    assert j.api_key is not None and j.api_key.get_secret_value() == "sk-very-secret"
    assert "sk-very-secret" not in repr(s) and "sk-very-secret" not in str(j)
    cmd_settings(None, s)  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    assert "sk-very-secret" not in printed
    assert json.loads(printed)["reward"]["judge"]["api_key"] == "**********"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"RUBRIC_FILE": "no/such/rubric.txt"}, "reward.judge.rubric_file"),
        ({"URL": "ftp://judge"}, "reward.judge.url"),
        ({"URL": "https://user:pw@judge/v1"}, "reward.judge.url"),
        ({"MAX_AGE_S": "0"}, "reward.judge.max_age_s"),
        ({"REPLAY_MISSING": "guess"}, "reward.judge.replay_missing"),
        ({"MAX_PROMPT_CHARS": "10000000"}, "reward.judge.max_prompt_chars"),
    ],
)
def test_a_bad_judge_setting_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], names: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(f"TRAJSTREAM_REWARD__JUDGE__{key}", value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert names in str(err.value) and "pw@" not in str(err.value)


@pytest.mark.parametrize(("text", "says"), [("  \n", "is empty"), ("x" * 70_000, "larger than")])
def test_an_empty_or_huge_rubric_file_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, says: str
) -> None:
    (tmp_path / "rubric.txt").write_text(text)
    monkeypatch.setenv("TRAJSTREAM_REWARD__JUDGE__RUBRIC_FILE", str(tmp_path / "rubric.txt"))
    with pytest.raises(ConfigError, match=rf"reward\.judge\.rubric_file.*{says}"):
        load_settings()


def test_a_judge_reward_without_its_settings_fails_at_start(tmp_path: Path) -> None:
    from streams.core.rewards import build_rewarder
    from streams.runtime.config import judge_of

    plain = [build_rewarder("streams.rewards:success")]
    assert judge_of(load_settings(), plain) is None  # no judge needed, none configured
    composite = build_rewarder(
        "composite", {"streams.rewards:success": 0.5, "streams.rewards:judge": 0.5}
    )
    with pytest.raises(ConfigError) as err:
        judge_of(load_settings(reward={"judge": {"model": "m"}}), [composite])
    message = str(err.value)
    assert "reward.judge.url [TRAJSTREAM_REWARD__JUDGE__URL]" in message
    assert "reward.judge.rubric_file" in message and "reward.judge.model" not in message
    rubric = tmp_path / "r.txt"
    rubric.write_text("Rubric.")
    settings = load_settings(
        reward={"judge": {"url": "http://j/v1", "model": "m", "rubric_file": str(rubric)}}
    )
    spec = judge_of(settings, [composite])
    assert spec is not None and (spec.model, spec.rubric) == ("m", "Rubric.")


def test_the_documented_judge_example_is_valid(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The documentation's reward.judge example (the first TOML block with a ``[reward.judge]``
    table, in the README or a page of docs/) loads, and names a rubric file that exists."""
    import re

    from streams.core.rewards import build_rewarder
    from streams.runtime.config import judge_of

    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    examples = [
        m.group(1)
        for page in pages
        for m in re.finditer(r"```toml\n(.*?)```", page.read_text(), re.DOTALL)
        if "[reward.judge]" in m.group(1)
    ]
    assert examples, "no TOML example with [reward.judge] in README.md or docs/"
    (tmp_path / "judge.toml").write_text(examples[0])
    monkeypatch.chdir(root)  # the rubric file is named relative to the repository
    s = load_settings(tmp_path / "judge.toml")
    rewarder = build_rewarder(s.reward.function, s.reward.weights)
    spec = judge_of(s, [rewarder])
    assert spec is not None and '"score"' in spec.rubric and rewarder.needs_verdict
