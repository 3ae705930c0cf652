"""The user's manual holds no project history, and its Python blocks name what exists.

The manual is ``README.md``, ``CONTRIBUTING.md``, ``SECURITY.md`` and every page under
``docs/`` (pages added later included). It says what is true now; how it came to be goes in
``CHANGELOG.md``, and benchmark runs in ``bench/HISTORY.md``. So a page of the manual may not
hold (see :data:`RULES`):

- an issue or pull-request number: ``#12``, ``issue 19``, ``PR 7``. A bug of another project
  may be named in GitHub's cross-repository form, ``owner/repo#123``;
- a commit hash: 7 to 40 hexadecimal characters with a digit and a letter, as a word;
- a phrase that tells a change: "this change", "as before", "no longer", "used to be",
  "previously", "the old behaviour";
- the date of a run: a calendar date (``2026-12-05``) outside a code span or block. A date
  with a time (``2026-01-31T12:00Z``) is an example value and may stand anywhere. The
  performance page may date its one run: one paragraph of it may hold dates.

Fenced code blocks and HTML comments are left out of every rule but the first two (an issue
number or a commit hash in an example is still history).

Every ```python block of the manual must parse, and import from ``streams`` only names that
exist (the tutorials' blocks also run, in ``tests/integration/test_docs_tutorials.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERFORMANCE = "docs/explanation/performance.md"
"""The one page allowed a dated run, in one paragraph."""


def manual_pages() -> list[str]:
    top = ["README.md", "CONTRIBUTING.md", "SECURITY.md"]
    return top + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    in_code: bool  # also inside fenced blocks and code spans
    fix: str


RULES = (
    Rule(
        "an issue or pull-request number",
        re.compile(
            r"(?:[\w.-]+/)?[\w.-]*#\d+(?![\w-])"  # #12, project#12 (owner/repo#12 passes)
            r"|\b(?:issues?|PRs?|pull requests?)\s+#?\d+\b",
            re.IGNORECASE,
        ),
        True,
        "leave it out, or name another project's bug as owner/repo#123",
    ),
    Rule(
        "a commit hash",
        re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
        True,
        "leave it out: CHANGELOG.md and bench/HISTORY.md name commits",
    ),
    Rule(
        "a phrase that tells a change",
        re.compile(
            r"\b(?:this change|as before|no longer|used to be|previously|formerly"
            r"|the old (?:behaviou?r|code|version))\b",
            re.IGNORECASE,
        ),
        False,
        "say what is true now; the change goes in CHANGELOG.md",
    ),
    Rule(
        "the date of a run",
        re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b(?!T\d)"),
        False,
        "leave the date out (bench/HISTORY.md dates the runs); an example value takes a time, "
        "2026-01-31T12:00Z, or a code span",
    ),
)


def _prose(text: str) -> str:
    """``text`` without fenced code blocks, HTML comments and code spans, line numbers kept."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"^(\s*)(`{3,}|~{3,}).*?^\1\2[^\n]*$", blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]+`", blank, text)


def _paragraph_of(text: str, offset: int) -> int:
    return text.count("\n\n", 0, offset)


def violations(page: str, text: str) -> list[str]:
    prose = _prose(text)
    out = []
    dated_paragraphs: dict[int, list[str]] = {}
    for rule in RULES:
        for m in rule.pattern.finditer(text if rule.in_code else prose):
            if "/" in m.group(0).partition("#")[0]:
                continue  # owner/repo#123: another project's bug, named as GitHub does
            line = text.count("\n", 0, m.start()) + 1
            where = f"{page}:{line}: {m.group(0)!r} is {rule.name}: {rule.fix}"
            if rule.name == "the date of a run" and page == PERFORMANCE:
                dated_paragraphs.setdefault(_paragraph_of(text, m.start()), []).append(where)
                continue
            out.append(where)
    if len(dated_paragraphs) > 1:
        _first, *rest = sorted(dated_paragraphs)
        out += [w for p in rest for w in dated_paragraphs[p]]
    return out


def test_the_manual_holds_no_project_history() -> None:
    found = [v for page in manual_pages() for v in violations(page, (ROOT / page).read_text())]
    assert not found, (
        "the manual (README.md, CONTRIBUTING.md, SECURITY.md, docs/) says what is true now; "
        "history goes in CHANGELOG.md and bench/HISTORY.md (the rules: tests/unit/"
        "test_manual.py's docstring):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("Targets (issue 19): p50", "an issue or pull-request number"),
        ("see #606 upstream", "an issue or pull-request number"),
        ("faust-streaming#629 reports it", "an issue or pull-request number"),
        ("on e9eccfd it lost calls", "a commit hash"),
        ("at `817d329`", "a commit hash"),
        ("13.0 before this change", "a phrase that tells a change"),
        ("the prefix is trajstream, as before", "a phrase that tells a change"),
        ("A worker no longer commits", "a phrase that tells a change"),
        ("Measured on 2026-12-05 (10,000 events)", "the date of a run"),
    ],
)
def test_each_rule_finds_what_it_names(text: str, rule: str) -> None:
    found = violations("docs/how-to/page.md", text + "\n")
    assert len(found) == 1 and f" is {rule}:" in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "upstream faust-streaming/faust#629 reports it",  # another project's bug, with its owner
        "`--since 2026-01-31T12:00Z`",
        "ISO 8601 (2026-01-31T12:00Z; no zone means UTC)",
        "```bash\ntrajstream replay --since 2026-01-31 --until now\n```",
        "the anchor [run several replicas](capture-gateway.md#run-several-replicas)",
        "[step 7](#7-stop-everything)",
        "a digest such as deadbeef, the number 1000000, a word like accepted",
        "`sha256` of the rubric, the key `<replay_id>#ledger`",
    ],
)
def test_what_is_not_history_passes(text: str) -> None:
    assert violations("docs/how-to/page.md", text + "\n") == []


def test_the_performance_page_may_date_one_run_only() -> None:
    one = "Latest full run: on 2026-12-05, 06:18 UTC.\n\nThe table.\n"
    assert violations(PERFORMANCE, one) == []
    two = one + "\nThe gateway, on 2026-12-04.\n"
    found = violations(PERFORMANCE, two)
    assert len(found) == 1 and "2026-12-04" in found[0], found


# -- the Python blocks of the manual ------------------------------------------------------------


def python_blocks() -> list[tuple[str, int, str]]:
    """Every ```python block of the manual: (page, line, code)."""
    out = []
    for page in manual_pages():
        text = (ROOT / page).read_text()
        for m in re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, re.S | re.M):
            code = "\n".join(line[len(m.group(1)) :] for line in m.group(2).splitlines())
            out.append((page, text.count("\n", 0, m.start()) + 1, code))
    return out


def check_block(page: str, line: int, code: str) -> None:
    """``code`` parses (top-level ``await`` allowed), and every name it imports from
    ``streams`` exists."""
    import ast
    import importlib
    import importlib.util

    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(code, f"{page}:{line}", "exec", flags)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streams"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                found = hasattr(module, alias.name) or (
                    hasattr(module, "__path__")  # a package: the name may be a submodule
                    and importlib.util.find_spec(f"{node.module}.{alias.name}") is not None
                )
                assert found, f"{page}:{line}: {node.module} has no {alias.name}"


@pytest.mark.parametrize(("page", "line", "code"), python_blocks(), ids=lambda v: str(v)[:40])
def test_each_python_block_parses_and_names_what_streams_has(
    page: str, line: int, code: str
) -> None:
    """The tutorials' blocks run in tests/integration/test_docs_tutorials.py; every other
    page's at least parse, and import from ``streams`` only what it has."""
    check_block(page, line, code)


def test_a_block_that_imports_what_streams_lacks_fails() -> None:
    with pytest.raises(AssertionError, match=r"streams\.sdk has no NoSuchProducer"):
        check_block("page.md", 1, "from streams.sdk import NoSuchProducer\n")
    with pytest.raises(SyntaxError):
        check_block("page.md", 1, "async with x as (:\n")
