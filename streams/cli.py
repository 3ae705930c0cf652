"""``trajstream``: the one command line entry point.

    trajstream broker start|stop|status|run   the local Kafka, one node or --brokers N (no Docker)
    trajstream topics                         create the deployment's topics
    trajstream worker                         run a stream worker (add more to scale out)
    trajstream produce FILE...                publish JSON-lines agent events
    trajstream otlp                           receive OpenTelemetry GenAI spans (OTLP/HTTP)
    trajstream simulate                       drive simulated agent traffic
    trajstream audit                          why calls were or were not selected
    trajstream status [--json] [--web]        workers, lag, commits, dead letters, hints
    trajstream standin                        run the Trinity stand-in server
    trajstream demo                           the whole loop on local parts, with a summary
    trajstream replay                         re-score a range of history: dry run, Trinity, files
    trajstream settings                       print the effective settings

Every command reads the settings (environment ``TRAJSTREAM_*``, ``--config FILE``); a bad
setting stops it at once with the setting's name. Exit codes: 0 ok, 1 failure, 2 usage or
configuration error.

This module builds the parser from :data:`COMMANDS` and dispatches. Each command's options are
written once, beside its body in :mod:`streams.commands` (by area; ``compare`` and ``routing`` in
:mod:`streams.policy_cli`): an option that sets a setting (``gateway --port``) is made from the
setting's field by :func:`streams.cli_support.setting_option` (type, help, environment variable)
and applied over the environment and the file for that run; replay's options are the fields of
``ReplayOptions``. The command bodies are re-exported here.

May import: anything in the package (the devtools lazily, per subcommand).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .cli_support import resolve_bootstrap, setting_overrides
from .commands import capture, local, operate, pipeline
from .commands.capture import cmd_gateway, cmd_otlp, cmd_produce
from .commands.local import cmd_broker, cmd_demo, cmd_simulate, cmd_standin
from .commands.operate import audit_table, cmd_audit, cmd_commits_resume, cmd_status
from .commands.pipeline import cmd_replay, cmd_settings, cmd_topics, cmd_worker
from .errors import ConfigError, TrajstreamError
from .policy_cli import add_commands as add_policy_commands
from .settings import Settings, load_settings

__all__ = [
    "audit_table",
    "build_parser",
    "cmd_audit",
    "cmd_broker",
    "cmd_commits_resume",
    "cmd_demo",
    "cmd_gateway",
    "cmd_otlp",
    "cmd_produce",
    "cmd_replay",
    "cmd_settings",
    "cmd_simulate",
    "cmd_standin",
    "cmd_status",
    "cmd_topics",
    "cmd_worker",
    "main",
    "resolve_bootstrap",
    "startup",
]

COMMANDS = (  # each adds its subcommand(s) and options, beside its body; in the order of --help
    local.add_broker,
    capture.add_gateway,
    pipeline.add_topics,
    pipeline.add_worker,
    capture.add_produce,
    capture.add_otlp,
    local.add_simulate,
    operate.add_audit,
    operate.add_status,
    operate.add_commits,
    add_policy_commands,  # compare, routing
    local.add_standin,
    local.add_demo,
    pipeline.add_replay,
    pipeline.add_settings,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trajstream",
        description="Turn production LLM-agent traffic on Kafka into Trinity-RFT training.",
    )
    parser.add_argument("--config", type=Path, help="settings file (.toml or .yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
              "error": logging.ERROR}  # fmt: skip


def startup(
    argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, Settings]:
    """What every command does before it touches anything outside the process: parse ``argv``,
    load the settings (environment, ``--config``, then the options that set a setting), and run
    the command's own start-up checks (``check`` of its parser: e.g. the gateway refusing an open
    relay). A setting that would stop the command raises :class:`ConfigError` naming it.

    :func:`main` runs exactly this; the compose and Kubernetes tests run it on each service's
    command and environment, so a service that would refuse to start fails a test."""
    args = (parser or build_parser()).parse_args(argv)
    # the options that set a setting (cli_support.setting_option) win over env and file
    settings = load_settings(args.config, **setting_overrides(args))
    check = getattr(args, "check", None)
    if check is not None:
        check(settings)
    return args, settings


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, settings = startup(argv, parser)
        # log_level is every command's (the worker passes it on to Faust too)
        logging.basicConfig(
            level=LOG_LEVELS[settings.log_level],
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        for noisy in ("httpx", "aiokafka"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, LOG_LEVELS[settings.log_level]))
        return int(args.func(args, settings))
    except ConfigError as exc:
        print(f"trajstream: {exc}", file=sys.stderr)
        return 2
    except TrajstreamError as exc:
        print(f"trajstream: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
