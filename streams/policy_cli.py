"""``trajstream compare`` and ``trajstream routing``: the policy against production, and its share.

``compare`` prints the comparisons the ledger owner published on ``<p>.comparisons`` (or, with
``--replay``, recomputes them and the rollout's decisions from the closed windows on
``<p>.windows`` with the current settings, writing nothing). ``routing show`` prints each
agent's share from ``<p>.routing``; ``routing set`` and ``routing resume`` publish a
:class:`~streams.models.RoutingOverride` on the ledger topic, which the ledger owner applies (an
operator action: whoever may write ``<p>.ledger``).

Registered on the main parser by :func:`add_commands`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from .settings import Settings

__all__ = ["add_commands"]

EXAMPLES = """examples:
  trajstream compare --agent support                 the published comparisons of one agent
  trajstream compare --agent support --since 2h --json
  trajstream compare --agent support --policy-version 7   what policy version 7 answered
  trajstream compare --replay                        recompute from <p>.windows (current settings)
  TRAJSTREAM_COMPARE__LEVEL=0.99 trajstream compare --replay    the same traffic at 99 %
"""


def cmd_compare(args: argparse.Namespace, settings: Settings) -> int:
    from .cli_support import resolve_bootstrap
    from .models import utcnow
    from .observe.policy import read_policy, render, replay_decisions
    from .observe.reader import TopicReader
    from .runtime.config import ledger_config_of
    from .runtime.replay_options import parse_time
    from .topics import Topics

    bootstrap = resolve_bootstrap(settings)
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    since = parse_time(args.since, utcnow()) if args.since else None

    async def read() -> Any:
        async with TopicReader(bootstrap, security=settings.kafka.security) as reader:
            return await read_policy(reader, topics, inputs=args.replay)

    view, windows, alerts = asyncio.run(read())
    if args.replay:
        view = replay_decisions(windows, alerts, ledger_config_of(settings))
    view = view.of(args.agent, since, args.policy_version)
    if args.json:
        print(json.dumps(view.to_json(), indent=2))
        return 0
    from rich.console import Console

    render(view, Console(), title="replayed: " if args.replay else "")
    return 0


def cmd_routing_show(args: argparse.Namespace, settings: Settings) -> int:
    from .cli_support import resolve_bootstrap
    from .observe.policy import read_policy
    from .observe.reader import TopicReader
    from .topics import Topics

    bootstrap = resolve_bootstrap(settings)
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)

    async def read() -> Any:
        async with TopicReader(bootstrap, security=settings.kafka.security) as reader:
            return await read_policy(reader, topics)

    view, _, _ = asyncio.run(read())
    latest: dict[str, Any] = {}
    for change in view.routing:
        if args.agent in (None, change.agent_name):
            if change.version >= getattr(latest.get(change.agent_name), "version", -1):
                latest[change.agent_name] = change
    if args.json:
        print(json.dumps({a: c.model_dump(mode="json") for a, c in sorted(latest.items())}))
        return 0
    state = "on" if settings.gateway.rollout.enabled else "off"
    print(f"gateway.rollout is {state} in these settings")
    if not latest:
        print("no routing share on the topic yet")
    for agent, c in sorted(latest.items()):
        print(
            f"{agent}: share {c.share:g} (v{c.version}, {c.action}, from "
            f"{c.effective_at.isoformat()}){' by ' + c.requested_by if c.requested_by else ''}"
            f"{': ' + c.reason if c.reason else ''}"
        )
    return 0


def _publish_override(settings: Settings, agent: str, share: float | None, args: Any) -> None:
    from .cli_support import resolve_bootstrap, subjects
    from .codec import SchemaRegistry
    from .io.kafka import producer
    from .models import RoutingOverride, utcnow
    from .topics import Topics

    bootstrap = resolve_bootstrap(settings)
    record = RoutingOverride(
        agent_name=agent,
        share=share,
        requested_at=utcnow(),
        requested_by=args.by,
        reason=args.reason,
    )
    topic = Topics(settings.kafka.topic_prefix, settings.kafka.partitions).ledger
    subjects(settings, [topic])

    async def publish() -> None:
        client = producer(bootstrap, settings.kafka.security)
        await client.start()
        try:
            await client.send_and_wait(
                topic, SchemaRegistry.default().encode(record), key=agent.encode(), partition=0
            )
        finally:
            await client.stop()

    asyncio.run(publish())


def cmd_routing_set(args: argparse.Namespace, settings: Settings) -> int:
    from .errors import ConfigError

    if not 0.0 <= args.share <= 1.0:
        raise ConfigError(f"--share must be between 0 and 1, got {args.share}")
    _publish_override(settings, args.agent, args.share, args)
    print(f"asked the ledger to pin the policy's share of {args.agent} at {args.share:g}")
    return 0


def cmd_routing_resume(args: argparse.Namespace, settings: Settings) -> int:
    _publish_override(settings, args.agent, None, args)
    print(
        f"asked the ledger to resume the rollout of {args.agent} (unpin, end a rollback and "
        "its commit hold)"
    )
    return 0


def add_commands(sub: Any) -> None:
    """Add ``compare`` and ``routing`` to the main parser's subcommands."""
    p = sub.add_parser(
        "compare",
        help="the policy against production per agent and window: means, counts, the "
        "difference and its confidence interval",
        description="Print the comparisons of the policy (calls Trinity answered) with "
        "production (calls production answered), scored alike, per agent and reward window (and "
        "per policy version, for a window several versions answered) and over a trailing span "
        "(Welch's t interval at compare.level), with the calls routed to the policy that fell "
        "back to production beside them, and the rollout's routing changes. Reads the topics; "
        "writes nothing.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--agent", default=None, help="only this agent (default: every agent)")
    p.add_argument(
        "--since", default=None, help="windows ending from then on: 2h, 7d or an ISO time"
    )
    p.add_argument(
        "--replay",
        action="store_true",
        help="recompute from the closed windows (<p>.windows) with the current compare.* and "
        "gateway.rollout.* settings instead of reading what was published",
    )
    p.add_argument(
        "--policy-version",
        type=int,
        default=None,
        metavar="N",
        help="only policy version N: the windows it answered alone, its own comparison of a "
        "window several versions answered, and the routing changes that judged it",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "routing", help="the policy's share of each agent's traffic (gateway.rollout)"
    )
    routing = p.add_subparsers(dest="routing_command", required=True, metavar="ACTION")
    q = routing.add_parser("show", help="each agent's share in force, from <p>.routing")
    q.add_argument("--agent", default=None)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_routing_show)
    q = routing.add_parser("set", help="pin an agent's share (no automatic change until resumed)")
    q.add_argument("--agent", required=True)
    q.add_argument("--share", type=float, required=True, help="between 0 and 1")
    q.add_argument("--reason", default="", help="recorded with the change")
    q.add_argument("--by", default="", help="who asks, recorded with the change")
    q.set_defaults(func=cmd_routing_set)
    q = routing.add_parser(
        "resume",
        help="resume the automatic rollout of an agent: unpin, end a rollback and its commit hold",
    )
    q.add_argument("--agent", required=True)
    q.add_argument("--reason", default="")
    q.add_argument("--by", default="")
    q.set_defaults(func=cmd_routing_resume)
