"""The commands of the workshop: ``trajstream broker``, ``standin``, ``demo`` and ``simulate``
(the local Kafka, the Trinity stand-in, the whole loop, simulated traffic; :mod:`streams.devtools`).

May import: anything in the package but :mod:`streams.cli` (the devtools lazily, per command).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

from ..cli_support import ensure_topics, resolve_bootstrap
from ..errors import ConfigError
from ..settings import Settings

DEFAULT_HEAP = "512m"  # the local broker's Java heap (-Xmx)

__all__ = [
    "add_broker",
    "add_demo",
    "add_simulate",
    "add_standin",
    "cmd_broker",
    "cmd_demo",
    "cmd_simulate",
    "cmd_standin",
]


def add_broker(sub: Any) -> None:
    p = sub.add_parser("broker", help="the local Kafka broker or cluster (fetched with Maven)")
    p.add_argument("action", choices=["start", "stop", "status", "run"])
    p.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="start/run: a cluster of N brokers (a KRaft controller quorum of N; 3 for "
        "replication factor 3 with min.insync.replicas 2)",
    )
    p.add_argument("--port", type=int, default=None, help="listener port (start: 9092 if free)")
    p.add_argument(
        "--heap",
        default=None,
        help="start/run, one broker: the broker's Java heap, as -Xmx takes it (default 512m; a "
        "broker kept up for long, with many topics, may need more: e.g. 2g)",
    )
    p.add_argument(
        "--sasl-ssl",
        action="store_true",
        help="run: also listen with SASL_SSL (a CA made at start, PLAIN and SCRAM users) and "
        "print the settings that connect to it",
    )
    p.set_defaults(func=cmd_broker)


def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from ..devtools import broker

    if args.sasl_ssl and args.action != "run":
        raise ConfigError("--sasl-ssl is for `trajstream broker run` (a foreground broker)")
    if args.brokers < 1:
        raise ConfigError(f"--brokers must be at least 1, not {args.brokers}")
    if args.sasl_ssl and args.brokers > 1:
        raise ConfigError("--sasl-ssl runs one broker: leave out --brokers")
    heap = args.heap or DEFAULT_HEAP
    if not re.fullmatch(r"[1-9][0-9]*[kKmMgG]", heap):
        raise ConfigError(f"--heap must be a size as -Xmx takes it (512m, 2g), not {heap!r}")
    if args.heap is not None and args.brokers > 1:
        raise ConfigError("--heap sets one broker's heap: leave out --brokers")
    if args.action == "start":
        state = broker.start_detached(
            settings.cache_dir, port=args.port, brokers=args.brokers, heap=heap
        )
        if args.port is None and state.port != broker.DEFAULT_DETACHED_PORT:
            print(
                f"port {broker.DEFAULT_DETACHED_PORT} is busy; using {state.port}", file=sys.stderr
            )
        if len(state.nodes) != args.brokers:
            print(
                f"a local broker of {len(state.nodes)} node(s) is running already; stop it "
                f"first for one of {args.brokers}",
                file=sys.stderr,
            )
        print(state.bootstrap_servers)
        return 0
    if args.action == "stop":
        stopped = broker.stop_detached(settings.cache_dir)
        print("stopped" if stopped else "no local broker was running")
        return 0
    if args.action == "status":
        running = broker.status(settings.cache_dir)
        if running is None:
            print("not running")
            return 1
        pids = ", ".join(str(n.pid) for n in running.nodes)
        print(f"running: {running.bootstrap_servers} (pid {pids}, Kafka {running.kafka_version})")
        return 0
    # run: in the foreground until interrupted
    if args.brokers > 1:
        with broker.LocalCluster(settings.cache_dir, brokers=args.brokers) as cluster:
            print(cluster.bootstrap_servers, flush=True)
            try:
                while True:
                    asyncio.run(asyncio.sleep(3600))
            except KeyboardInterrupt:
                pass
        return 0
    with broker.LocalBroker(
        settings.cache_dir, port=args.port or 0, sasl_ssl=args.sasl_ssl, heap=heap
    ) as b:
        print(b.start(), flush=True)
        if args.sasl_ssl:
            assert b.data_dir is not None
            secret = b.data_dir / "tls" / "sasl-password"
            print(
                "# SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512):\n"
                f"TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS={b.sasl_ssl_bootstrap_servers}\n"
                "TRAJSTREAM_KAFKA__SECURITY__PROTOCOL=SASL_SSL\n"
                "TRAJSTREAM_KAFKA__SECURITY__MECHANISM=SCRAM-SHA-512\n"
                f"TRAJSTREAM_KAFKA__SECURITY__USERNAME={b.sasl_username}\n"
                f'TRAJSTREAM_KAFKA__SECURITY__PASSWORD="$(cat {secret})"\n'
                f"TRAJSTREAM_KAFKA__SECURITY__SSL_CAFILE={b.ca_file}",
                flush=True,
            )
        try:
            while True:
                asyncio.run(asyncio.sleep(3600))
        except KeyboardInterrupt:
            pass
    return 0


def add_standin(sub: Any) -> None:
    p = sub.add_parser("standin", help="run the Trinity stand-in server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    p.add_argument(
        "--journal",
        type=Path,
        default=None,
        help="keep what it served, rewarded and committed in this file, and read it back at "
        "start (a stand-in killed and started again goes on where it was)",
    )
    p.add_argument(
        "--sync-interval",
        type=int,
        default=0,
        help="every this many /commit requests advance the model version by one, as Trinity's "
        "explorer syncs new weights (default 0: the version stays 0)",
    )
    p.set_defaults(func=cmd_standin)


def cmd_standin(args: argparse.Namespace, settings: Settings) -> int:
    from ..devtools.standin import StandIn

    if args.sync_interval < 0:
        raise SystemExit("--sync-interval must be 0 or more")
    StandIn(journal=args.journal, sync_interval=args.sync_interval).run(args.host, args.port)
    return 0


def add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the whole loop locally and print a summary")
    p.add_argument("--calls", type=int, default=120, help="agent calls to simulate")
    p.add_argument("--agents", type=int, default=3, help="simulated agents")
    p.add_argument(
        "--rollout",
        action="store_true",
        help="gateway.rollout on, production scripted to fail more than the policy: the "
        "comparison and the policy's promotion (try --agents 1 --calls 400)",
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from ..devtools.demo import run_demo

    return run_demo(settings, calls=args.calls, agents=args.agents, rollout=args.rollout)


def add_simulate(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="drive simulated agent traffic (LLM steps served by trinity.url's chat endpoint)",
    )
    p.add_argument("--calls", type=int, default=100)
    p.add_argument(
        "--rate", type=float, default=0.0, help="calls per second (0: as fast as possible)"
    )
    p.add_argument("--marked", type=float, default=0.15, help="fraction of explicitly marked calls")
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace, settings: Settings) -> int:
    import random

    from rich.progress import Progress

    from ..capture.sdk import TrajstreamProducer
    from ..devtools.traffic import AGENTS, simulate_call
    from ..io.trinity import TrinityClient

    bootstrap = resolve_bootstrap(settings)
    ensure_topics(settings, bootstrap)
    rng = random.Random(args.seed)
    agents = list(AGENTS)

    async def drive() -> None:
        async with (
            TrajstreamProducer.from_settings(settings, bootstrap) as producer,
            TrinityClient.from_settings(settings.trinity) as trinity,
        ):
            with Progress() as progress:
                task = progress.add_task("agent calls", total=args.calls)
                for i in range(args.calls):
                    await simulate_call(
                        producer,
                        trinity,
                        rng,
                        agent=agents[i % len(agents)],
                        mark=rng.random() < args.marked,
                        fail=rng.random() < 0.1,
                        rating=float(rng.randint(1, 5)) if rng.random() < 0.4 else None,
                    )
                    progress.advance(task)
                    if args.rate > 0:
                        await asyncio.sleep(1.0 / args.rate)

    asyncio.run(drive())
    print(f"simulated {args.calls} agent calls (chat served by {settings.trinity.url})")
    return 0
