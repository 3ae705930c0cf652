"""The Reference pages (docs/reference/) against the code they are generated from.

A page that differs from what :mod:`streams.devtools.refdocs` renders fails here with its name
and the command that writes it again. The other tests show that the comparison can fail (a new
setting, a new option), that the generated pages cover what the code reads, and that the site
builds with ``mkdocs build --strict``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from streams import cli
from streams.devtools import refdocs
from streams.settings import CommitSettings, Settings
from streams.topics import Topics

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(refdocs.PAGES))
def test_the_committed_page_is_the_generated_one(name: str) -> None:
    path = ROOT / refdocs.REFERENCE_DIR / name
    committed = path.read_text(encoding="utf-8") if path.is_file() else ""
    assert committed == refdocs.render(name), (
        f"docs/reference/{name} differs from the code: run `{refdocs.HINT}` and commit the page"
    )


def _copy_of_the_pages(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / refdocs.REFERENCE_DIR, tmp_path / refdocs.REFERENCE_DIR)
    return tmp_path


def test_check_names_each_stale_page_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy_of_the_pages(tmp_path)
    assert refdocs.main(["--check", "--root", str(root)]) == 0
    (root / refdocs.REFERENCE_DIR / "metrics.md").write_text("# Metrics\n", encoding="utf-8")
    (root / refdocs.REFERENCE_DIR / "cli.md").unlink()
    assert refdocs.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/reference/metrics.md differs" in err
    assert "docs/reference/cli.md differs" in err
    assert "settings.md" not in err
    assert refdocs.HINT in err
    assert refdocs.main(["--root", str(root)]) == 0  # writing them again
    assert refdocs.check(root) == []


def test_a_new_setting_makes_the_settings_page_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy_of_the_pages(tmp_path)
    field = FieldInfo(annotation=int, default=7, description="a setting added by the test")
    monkeypatch.setitem(CommitSettings.__pydantic_fields__, "probe_s", field)
    assert refdocs.check(root) == ["docs/reference/settings.md"]
    page = refdocs.render("settings.md")
    assert "`commit.probe_s`<br>`TRAJSTREAM_COMMIT__PROBE_S`" in page
    assert "a setting added by the test" in page


def test_a_new_option_makes_the_cli_page_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy_of_the_pages(tmp_path)

    def add_probe(sub: argparse._SubParsersAction) -> None:
        p = sub.add_parser("probe", help="a command added by the test")
        p.add_argument("--depth", type=int, default=3, help="how deep")

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, add_probe))
    assert refdocs.check(root) == ["docs/reference/cli.md"]
    page = refdocs.render("cli.md")
    assert "## trajstream probe" in page
    assert "| `--depth DEPTH` | `3` | how deep |" in page


def test_the_pages_do_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = refdocs.render_all()
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__PORT", "9999")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__TOPIC_PREFIX", "elsewhere")
    monkeypatch.setenv("COLUMNS", "40")
    assert refdocs.render_all() == before


def _settings(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    out = {}
    for name, info in model.model_fields.items():
        nested = refdocs._model_of(info.annotation) or refdocs._list_model(info.annotation)
        if nested is not None:
            out.update(_settings(nested, f"{prefix}{name}."))
        if refdocs._model_of(info.annotation) is None:
            out[prefix + name] = info
    return out


def test_every_setting_is_described_and_on_the_page() -> None:
    page = refdocs.render("settings.md")
    settings = _settings(Settings)
    assert len(settings) > 100
    undescribed = [path for path, info in settings.items() if not info.description]
    assert undescribed == [], "add description= to these settings' Field"
    for path in settings:
        assert f"`{path.replace('api_keys.', 'api_keys[].')}`" in page


def test_the_security_rules_are_read_from_the_validators() -> None:
    rules = refdocs.security_rules()
    need = "`kafka.security.mechanism`, `kafka.security.username`, `kafka.security.password`"
    assert f"| `SASL_SSL` | {need} | none |" in rules
    assert f"| `SASL_PLAINTEXT` | {need} | `kafka.security.ssl_cafile`," in rules
    assert "| `SSL` | nothing | `kafka.security.mechanism` |" in rules
    assert "within 10 s" in rules  # check_kafka's own time limit
    assert rules in refdocs.render("settings.md")


def test_every_subcommand_is_on_the_cli_page() -> None:
    page = refdocs.render("cli.md")
    parser = cli.build_parser()
    seen = 0
    todo = [("trajstream", parser)]
    while todo:
        prog, p = todo.pop()
        for name, _, sub in refdocs._subparsers(p):
            assert f"# {prog} {name}\n" in page
            todo.append((f"{prog} {name}", sub))
            seen += 1
            for action in sub._actions:
                for flag in action.option_strings:
                    if flag not in ("-h", "--help"):
                        assert f"`{flag}" in page
    assert seen >= 19  # 16 commands, and the actions of commits and routing


def test_topics_page_has_every_topic_and_union_from_the_code() -> None:
    page = refdocs.render("topics.md")
    topics = Topics("<p>", 4)
    for topic, names in topics.value_types().items():
        assert f"| `{topic}` |" in page
        if len(names) > 1:
            union = ", ".join(n.rsplit(".", 1)[1] for n in names)
            assert f"| `{topic}-value` | `[{union}]` |" in page
    # the README's table lacked these; its registry union of the ledger lacked RoutingOverride
    assert "| `<p>.comparisons` |" in page and "| `<p>.routing` |" in page
    assert "`[FeedbackAck, Tick, CommitResume, RoutingOverride]`" in page
    for schema in (ROOT / "schemas").glob("*.avsc"):
        assert f"### {schema.stem.rsplit('.', 1)[1]}\n" in page


def test_metrics_page_has_every_metric_of_the_worker() -> None:
    from streams.observe.metrics import METRICS

    page = refdocs.render("metrics.md")
    for name in METRICS:
        assert f"| `{name}` |" in page
    assert "| `trajstream_gateway_requests_total` | counter |" in page


def test_otlp_page_maps_every_attribute_the_code_reads() -> None:
    page = refdocs.render("otlp-mapping.md")
    mapped = page.split("## Every attribute read")[0]  # the tables and the text, not the index
    read = refdocs.attributes_read()
    assert {"gen_ai.operation.name", "gen_ai.usage.input_tokens", "trajstream.call_id"} <= read
    missing = sorted(a for a in read if f"`{a}`" not in mapped)
    assert missing == [], "attributes the OTLP mapping reads but its page does not explain"


def test_http_page_lists_every_route() -> None:
    page = refdocs.render("http-api.md")
    for path in ("/v1/chat/completions", "/calls/{call_id}/end", "/v1/traces", "/readyz"):
        assert f"`{path}`" in page
    assert "| GET | `/healthz` | no |" in page  # the gateway's probe needs no client key


def test_python_api_names_importable_objects() -> None:
    for _, module, _, members in refdocs.PYTHON_API:
        mod = importlib.import_module(module)
        for member in members:
            assert hasattr(mod, member), f"{module}.{member}"
    # the import paths the README tells users to use are the documented objects
    from streams import rewards, sdk, select

    assert sdk.TrajstreamProducer is importlib.import_module("streams.capture.sdk").TrajstreamProducer
    assert rewards.RewardResult is importlib.import_module("streams.core.rewards").RewardResult
    assert select.Strategy is importlib.import_module("streams.core.select").Strategy


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed")
def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "python-api" / "index.html").is_file()
