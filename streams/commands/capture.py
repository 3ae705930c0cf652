"""The ingress commands: ``trajstream produce``, ``otlp`` and ``gateway``
(:mod:`streams.capture`).

May import: anything in the package but :mod:`streams.cli` (capture lazily, per command).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ..cli_support import ensure_topics, event_loop, resolve_bootstrap, setting_option, subjects
from ..settings import Settings

__all__ = [
    "add_gateway",
    "add_otlp",
    "add_produce",
    "cmd_gateway",
    "cmd_otlp",
    "check_gateway_settings",
    "cmd_produce",
]


def add_produce(sub: Any) -> None:
    p = sub.add_parser("produce", help="publish JSON-lines files of agent events")
    p.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a JSON-lines file, or a directory: its *.jsonl files, in name order",
    )
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="publish the valid lines of a file that has invalid ones",
    )
    p.set_defaults(func=cmd_produce)


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from ..capture.produce import input_files, read_events
    from ..capture.sdk import TrajstreamProducer

    events: list[Any] = []
    bad = 0
    for path in input_files(args.files):
        parsed = read_events(path)
        for err in parsed.errors:
            print(f"{path}:{err}", file=sys.stderr)
        bad += len(parsed.errors)
        events.extend(parsed.events)
    if bad and not args.skip_invalid:
        print(
            f"{bad} invalid line(s); nothing published (use --skip-invalid to publish the "
            "valid ones)",
            file=sys.stderr,
        )
        return 1
    bootstrap = resolve_bootstrap(settings)
    ensure_topics(settings, bootstrap)

    async def publish() -> None:
        async with TrajstreamProducer.from_settings(settings, bootstrap) as producer:
            await producer.publish_many(events)

    asyncio.run(publish())
    print(f"published {len(events)} event(s)" + (f", skipped {bad} invalid" if bad else ""))
    return 1 if bad and not events else 0


def add_otlp(sub: Any) -> None:
    p = sub.add_parser(
        "otlp",
        help="receive OpenTelemetry GenAI spans on POST /v1/traces (OTLP/HTTP) as agent events",
    )
    setting_option(p, "otlp.host")  # --host, --port: settings for this run (streams.cli.main)
    setting_option(p, "otlp.port", lead="listen port")
    p.set_defaults(func=cmd_otlp)


def cmd_otlp(args: argparse.Namespace, settings: Settings) -> int:
    from ..capture.otlp_http import run_otlp

    bootstrap = resolve_bootstrap(settings)
    ensure_topics(settings, bootstrap)
    asyncio.run(run_otlp(settings, bootstrap, ready=lambda url: print(url, flush=True)))
    return 0


def add_gateway(sub: Any) -> None:
    p = sub.add_parser(
        "gateway",
        help="the OpenAI-compatible gateway: route selected calls to Trinity, record every step",
        description="Serve OpenAI's chat completions and Responses APIs and Anthropic's Messages "
        "API in front of Trinity and a production model. Agents set their client's base_url to http://HOST:PORT/calls/<call_id>/v1.",
    )
    # settings for this run (applied by streams.cli.main)
    setting_option(p, "gateway.host")
    setting_option(p, "gateway.port")
    setting_option(p, "gateway.mode")
    setting_option(p, "gateway.production_url")
    p.set_defaults(func=cmd_gateway, check=check_gateway_settings)


def check_gateway_settings(settings: Settings) -> None:
    """The gateway's start-up checks (streams.cli.startup): an open relay, the production URL,
    the strategy it routes by."""
    from ..capture.gateway import check_gateway

    check_gateway(settings)


def cmd_gateway(args: argparse.Namespace, settings: Settings) -> int:
    from ..capture.gateway import build_gateway, run_gateway

    # no check here: an unreachable cluster is no reason not to serve (the gateway spills);
    # its own start still stops on bad credentials, TLS or topics, naming the setting
    bootstrap = resolve_bootstrap(settings, check=False)
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})}
    )
    build_gateway(settings)  # bad settings fail here, before anything listens
    from ..topics import Topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    # with a schema registry: its subjects checked here; its producer writes the wire format
    subjects(settings, [topics.agent_events, topics.user_feedback])

    def ready(url: str) -> None:
        print(
            f"trajstream gateway on {url} ({settings.gateway.mode} mode); agents use "
            f"base_url={url}/calls/<call_id>/v1",
            flush=True,
        )

    loop = event_loop()
    try:
        loop.run_until_complete(run_gateway(settings, ready=ready))
    finally:
        loop.close()
    return 0
