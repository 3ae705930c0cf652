"""Every command and code block of the tutorials, run as written against a local broker and the
Trinity stand-in.

Each fenced block of a page in :data:`PAGES` is preceded by an HTML comment (invisible on the
site and on GitHub) that says what this test does with it:

``<!-- test: run [expect="text"] [timeout=S] [exit=N] -->``
    bash (or sh) and python blocks are executed, in page order, in one work directory, like a
    reader's terminal: what a bash block exports is seen by the blocks after it. ``expect``
    runs the block again (every second, up to ``timeout``, default 30 s) until its output
    holds the text, for what happens asynchronously (a worker's output); ``exit`` is the exit
    status the block must end with (default 0).
``<!-- test: output -->``
    what the run block above prints: each line must match a line of its output, in order;
    ``...`` matches anything and runs of spaces are one space (ids, prefixes and column widths
    vary).
``<!-- test: fixture -->``
    one ``trajstream`` command that starts a server in the background (``broker start``,
    ``standin``, ``worker``, ``gateway``): the test parses it with the real CLI parser and starts
    the same server with its fixture (the session's broker, the ``standin`` fixture, the
    ``workers`` fixture, :func:`gateway_process`), with the environment the blocks before it
    exported and the settings its options set. Every process is stopped when the test ends.
``<!-- test: file NAME [reason="..."] -->``
    written to NAME in the work directory (and parsed, for .toml, .yaml and .json); a file that
    no later run block names must say why it is not used here.
``<!-- test: same PAGE -->``
    every line of the block is a line of a block of PAGE (run there).
``<!-- test: skip REASON -->``
    not run, for the reason given (docker, a clone of the public repository, ``./dev demo``).

:func:`test_every_block_is_run_or_says_why` fails for a block without a marker, an unknown
kind, a skip without a reason, a file nobody uses without one: a new block cannot go untested
silently. Addresses in the blocks are the defaults a reader has (the stand-in on
``127.0.0.1:8010``, the gateway on ``127.0.0.1:8000``, a second gateway that must not start on
``--port 8001``); the test replaces them with its own free ports, and gives each page its own
topic prefix.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import sys
import tomllib
from collections.abc import Callable
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from streams.cli import build_parser
from streams.cli_support import setting_env, setting_overrides
from streams.devtools.broker import free_port
from streams.devtools.standin import StandIn

from .conftest import REPO_ROOT, WorkerProcess, base_env, gateway_process

pytestmark = pytest.mark.integration

PAGES = (
    "docs/index.md",
    "docs/tutorials/quick-start.md",
    "docs/tutorials/first-agent.md",
    "docs/tutorials/trinity-serve.md",
    "README.md",
)
KINDS = ("run", "output", "fixture", "file", "same", "skip")
STANDIN_DEFAULT = "127.0.0.1:8010"
GATEWAY_DEFAULT = "127.0.0.1:8000"
MARKER = re.compile(r"^\s*<!--\s*test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
ENV_NOISE = {"_", "SHLVL", "PWD", "OLDPWD"}


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    marker: str | None
    kind: str = ""
    rest: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.marker:
            self.kind, _, self.rest = self.marker.partition(" ")
            if self.kind in ("run", "file"):
                words = shlex.split(self.rest)
                self.options = dict(w.split("=", 1) for w in words if "=" in w)
                bare = [w for w in words if "=" not in w]
                if bare:
                    self.options["name"] = bare[0]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` with the marker on the last non-blank line before each."""
    lines = (REPO_ROOT / page).read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        before = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        marker = MARKER.match(before)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        code = "\n".join(body) + "\n"
        out.append(Block(page, i + 1, lang, code, marker.group(1) if marker else None))
        i = j + 1
    return out


def code_lines(code: str) -> list[str]:
    """The lines of a block that do something: no blank or comment lines, no trailing comments
    (set off by two spaces or more)."""
    lines = (re.sub(r"\s{2,}#.*$", "", ln).strip() for ln in code.splitlines())
    return [ln for ln in lines if ln and not ln.startswith("#")]


def fixture_command(block: Block) -> list[str]:
    """The ``trajstream`` command of a fixture block, its words without redirections or ``&``."""
    lines = code_lines(block.code)
    assert len(lines) == 1, f"{block.where}: a fixture block holds one command"
    m = re.search(r"\btrajstream\s+([^)&|>]*)", lines[0])
    assert m, f"{block.where}: a fixture block runs trajstream"
    return shlex.split(m.group(1))


def fixture_kind(words: list[str]) -> str:
    kind = {"standin": "standin", "worker": "worker", "gateway": "gateway"}.get(words[0])
    if words[:2] == ["broker", "start"]:
        kind = "broker"
    assert kind, f"no fixture starts `trajstream {' '.join(words)}`"
    return kind


def matches(expected: str, actual: str) -> str | None:
    """None when each line of ``expected`` matches a line of ``actual`` in order; else the first
    line that did not."""

    def norm(s: str) -> str:
        return " ".join(s.split())

    got = [norm(ln) for ln in actual.splitlines()]
    at = 0
    for want in (norm(ln) for ln in expected.splitlines() if ln.strip()):
        parts = [part.strip() for part in want.split("...")]
        pattern = re.compile(".*?".join(re.escape(part) for part in parts))
        while at < len(got) and not pattern.fullmatch(got[at]):
            at += 1
        if at == len(got):
            return want
        at += 1
    return None


def test_every_block_is_run_or_says_why() -> None:
    tutorials = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs/tutorials").glob("*.md")}
    assert tutorials <= set(PAGES), f"pages this test does not read: {tutorials - set(PAGES)}"
    problems = []
    for page in PAGES:
        found = blocks(page)
        for n, b in enumerate(found):
            previous = found[n - 1] if n else None
            later_runs = "".join(x.code for x in found[n + 1 :] if x.kind == "run")
            if b.marker is None:
                problems.append(f"{b.where}: no <!-- test: ... --> marker before the block")
            elif b.kind not in KINDS:
                problems.append(f"{b.where}: unknown kind {b.kind!r} (one of {KINDS})")
            elif b.kind == "skip" and len(b.rest.split()) < 3:
                problems.append(f"{b.where}: a skip says why, in a few words")
            elif b.kind == "run" and b.lang not in ("bash", "sh", "python"):
                problems.append(f"{b.where}: a run block is bash or python, not {b.lang!r}")
            elif b.kind == "output" and (previous is None or previous.kind != "run"):
                problems.append(f"{b.where}: an output block follows a run block")
            elif b.kind == "file" and "name" not in b.options:
                problems.append(f"{b.where}: a file block names its file")
            elif (
                b.kind == "file"
                and b.options["name"] not in later_runs
                and not b.options.get("reason")
            ):
                problems.append(f"{b.where}: no run block uses {b.options['name']}: say why")
            elif b.kind == "fixture":
                try:
                    fixture_kind(fixture_command(b))
                except AssertionError as exc:
                    problems.append(f"{b.where}: {exc}")
            elif b.kind == "same":
                there = {ln for x in blocks(b.rest) for ln in code_lines(x.code)}
                missing = [ln for ln in code_lines(b.code) if ln not in there]
                if missing:
                    problems.append(f"{b.where}: not in a block of {b.rest}: {missing[0]!r}")
    assert not problems, "\n".join(problems)


@dataclass
class Terminal:
    """What a reader's terminal holds while following a page: the environment, the work
    directory, the servers started, the output of the last run block."""

    env: dict[str, str]
    workdir: Path
    scratch: Path
    subs: dict[str, str]
    stack: AsyncExitStack
    workers: Callable[..., WorkerProcess]
    bootstrap: str
    started: list[str] = field(default_factory=list)
    output: str = ""
    count: int = 0

    def text(self, code: str) -> str:
        for default, ours in self.subs.items():
            code = code.replace(default, ours)
        return code

    async def run(self, block: Block) -> None:
        timeout = float(block.options.get("timeout", 30))
        want_exit = int(block.options.get("exit", 0))
        expect = block.options.get("expect")
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = max(1.0, deadline - asyncio.get_running_loop().time())
            code, out = await self._once(block, left)
            done = code == want_exit and (expect is None or expect in out)
            if done or expect is None or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(1)
        self.output = out
        assert code == want_exit, f"{block.where}: exit {code}, not {want_exit}:\n{out}"
        assert expect is None or expect in out, f"{block.where}: no {expect!r} in:\n{out}"

    async def _once(self, block: Block, timeout: float) -> tuple[int, str]:
        self.count += 1
        code = self.text(block.code)
        if block.lang == "python":
            script = self.scratch / f"block-{self.count}.py"
            script.write_text(code)
            argv = [sys.executable, str(script)]
            envfile = None
        else:
            script = self.scratch / f"block-{self.count}.sh"
            envfile = self.scratch / f"env-{self.count}"
            trap = f"trap 'env -0 > {shlex.quote(str(envfile))}' EXIT"
            script.write_text(f"set -eo pipefail\n{trap}\n{code}")
            argv = ["bash", str(script)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=self.env,
            cwd=self.workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            raw, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            raw = b"(timed out)"
        finally:
            with suppress(ProcessLookupError):  # whatever the block left behind, too
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if envfile is not None and envfile.exists() and proc.returncode == 0:
            pairs = [kv.split("=", 1) for kv in envfile.read_bytes().decode().split("\0") if kv]
            exported = {k: v for k, v in pairs if k not in ENV_NOISE}
            self.env = {**{k: v for k, v in self.env.items() if k in ENV_NOISE}, **exported}
        return int(proc.returncode or 0), raw.decode(errors="replace")

    def check_output(self, block: Block) -> None:
        missing = matches(self.text(block.code), self.output)
        assert missing is None, f"{block.where}: {missing!r} not in the output:\n{self.output}"

    def write_file(self, block: Block) -> None:
        name = block.options["name"]
        text = self.text(block.code)
        (self.workdir / name).write_text(text)
        if name.endswith(".toml"):
            tomllib.loads(text)
        elif name.endswith((".yaml", ".yml")):
            yaml.safe_load(text)
        elif name.endswith(".json"):
            json.loads(text)

    async def start(self, block: Block) -> None:
        words = fixture_command(block)
        args = build_parser().parse_args(words)  # the reader's command line, as trajstream reads it
        kind = fixture_kind(words)
        settings = self._flatten(setting_overrides(args))
        if args.config:
            settings["TRAJSTREAM_CONFIG"] = str(self.workdir / args.config)
        self.started.append(kind)
        if kind == "broker":
            self.env["KAFKA_BOOTSTRAP_SERVERS"] = self.bootstrap
        elif kind == "standin":
            # the standin fixture is up already; a port other than the default is its address
            assert args.host == "127.0.0.1", f"{block.where}: the stand-in on {args.host}"
            self.subs.setdefault(f"127.0.0.1:{args.port}", self.subs[STANDIN_DEFAULT])
        elif kind == "worker":
            self.workers(**{**self._ours(), **settings})
        else:
            port = settings.pop("TRAJSTREAM_GATEWAY__PORT", "8000")
            env = {**self.env, **settings}
            env.setdefault("TRAJSTREAM_GATEWAY__SPILL_DIR", str(self.scratch / "spill"))
            gw = await self.stack.enter_async_context(
                gateway_process(env, self.scratch / "gateway.log")
            )
            self.subs[f"127.0.0.1:{port}"] = urlsplit(gw.url).netloc

    def _ours(self) -> dict[str, str]:
        """What the blocks exported, as the settings of a worker (``TRAJSTREAM_*`` only)."""
        return {k: v for k, v in self.env.items() if k.startswith("TRAJSTREAM_")}

    @staticmethod
    def _flatten(nested: dict[str, Any], path: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in nested.items():
            here = f"{path}.{key}" if path else key
            if isinstance(value, dict):
                out.update(Terminal._flatten(value, here))
            else:
                out[setting_env(here)] = str(value)
        return out


RUNNABLE = [p for p in PAGES if any(b.kind in ("run", "fixture", "file") for b in blocks(p))]


@pytest.mark.parametrize("page", RUNNABLE)
async def test_the_page_runs_as_written(
    page: str,
    kafka_bootstrap: str,
    standin: StandIn,
    prefix: str,
    workers: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    workdir, scratch = tmp_path / "work", tmp_path / "scratch"
    workdir.mkdir()
    scratch.mkdir()
    env = base_env(kafka_bootstrap, prefix, tmp_path)
    # the trajstream command of the environment running this test, as `. .venv/bin/activate`
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    async with AsyncExitStack() as stack:
        terminal = Terminal(
            env=env,
            workdir=workdir,
            scratch=scratch,
            subs={
                STANDIN_DEFAULT: urlsplit(standin.url).netloc,
                "--port 8001": f"--port {free_port()}",
            },
            stack=stack,
            workers=workers,
            bootstrap=kafka_bootstrap,
        )
        for block in blocks(page):
            if block.kind == "run":
                await terminal.run(block)
            elif block.kind == "output":
                terminal.check_output(block)
            elif block.kind == "file":
                terminal.write_file(block)
            elif block.kind == "fixture":
                await terminal.start(block)
    if "worker" in terminal.started and "gateway" in terminal.started:
        # what the page showed through curl, read from the stand-in itself
        state = standin.state
        assert any(f.status == 200 and f.applied for f in state.feedback), state.feedback
        assert state.trained, "no experience was committed"
