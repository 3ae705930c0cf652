"""``trajstream demo``: the whole loop on local parts, with progress and a summary.

It starts what is not configured (the local Kafka broker), two stand-ins (one as Trinity, one
as the production model), the gateway in route mode in front of them, and one worker process,
drives realistic agent traffic through the gateway with the official ``openai`` client (several
agents and models, multi-step calls with tool calls, explicitly marked calls, failed calls, user
ratings sent to ``/feedback``; selected calls are answered by Trinity, the others by
production), waits until every selected call was fed back and committed, and prints a
summary read back from the topics, checked against what the stand-in received. Everything it
started is stopped, also on failure or Ctrl-C.

May import: anything in the package; a dev tool, never imported by the product.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..capture.gateway import build_gateway
from ..codec import SchemaRegistry
from ..core.arms import UNTRAINED
from ..core.select import build_strategy
from ..models import (
    AvroModel,
    CommitRecord,
    Comparison,
    DeadLetter,
    RewardedTrajectory,
    RoutingShare,
    Trajectory,
    WindowSummary,
)
from ..settings import Settings
from ..topics import Topics
from .standin import StandIn
from .traffic import AGENTS, SimulatedCall, simulate_gateway_call

__all__ = ["run_demo"]

console = Console()

DEMO_SETTINGS = {
    "TRAJSTREAM_SELECTION__STRATEGY": "any(marked,sampling)",
    "TRAJSTREAM_SELECTION__RATE": "0.25",
    "TRAJSTREAM_REWARD__FUNCTION": "composite",
    "TRAJSTREAM_REWARD__WEIGHTS": '{"streams.rewards:success": 0.5, '
    '"streams.rewards:user_rating": 0.3, '
    '"streams.rewards:latency_efficiency": 0.2}',
    "TRAJSTREAM_REWARD__FEEDBACK_GRACE_S": "3",
    "TRAJSTREAM_ASSEMBLY__TICK_S": "1",
    "TRAJSTREAM_COMMIT__INTERVAL_S": "5",
    "TRAJSTREAM_WINDOWS__SIZE_S": "10",
    "TRAJSTREAM_WINDOWS__GRACE_S": "8",
    "TRAJSTREAM_OBSERVE__PORT": "0",  # the demo's worker serves no metrics (the port may be busy)
}


ROLLOUT = {
    "enabled": True,
    "initial_share": 0.2,
    "step": 0.2,
    "max_share": 0.6,
    "promote_after": 1,
    "apply_delay_s": 1.0,
}
"""``--rollout``: the policy's share starts at 0.2 and rises by 0.2 per window it wins."""

ROLLOUT_SETTINGS = {
    **{f"TRAJSTREAM_GATEWAY__ROLLOUT__{k.upper()}": str(v).lower() for k, v in ROLLOUT.items()},
    "TRAJSTREAM_COMPARE__MIN_COUNT": "5",
    "TRAJSTREAM_WINDOWS__SIZE_S": "10",
    "TRAJSTREAM_WINDOWS__GRACE_S": "8",  # rewards wait for feedback up to 3 s: not late
}


def run_demo(
    settings: Settings, *, calls: int = 120, agents: int = 3, rollout: bool = False
) -> int:
    try:
        return asyncio.run(
            _demo(
                settings,
                calls=calls,
                agents=max(1, min(agents, len(AGENTS))),
                rollout=rollout,
            )
        )
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; everything the demo started was stopped[/]")
        return 130


async def _demo(settings: Settings, *, calls: int, agents: int, rollout: bool = False) -> int:
    prefix = f"demo-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
    async with AsyncExitStack() as stack:
        bootstrap = settings.bootstrap_servers
        if bootstrap:
            console.print(f"Kafka: [bold]{bootstrap}[/] (configured)")
        else:
            from .broker import LocalBroker

            with console.status(
                "Starting the local Kafka broker (first run fetches it with Maven)..."
            ):
                broker = LocalBroker(settings.cache_dir)
                stack.callback(broker.stop)
                bootstrap = await asyncio.to_thread(broker.start, 120)
            console.print(f"Kafka: [bold]{bootstrap}[/] (local broker, stopped at the end)")

        standin = StandIn()
        url = await standin.start("127.0.0.1", 0)
        stack.push_async_callback(standin.stop)
        console.print(f"Trinity stand-in: [bold]{url}[/]")
        production = StandIn(model="production-model")
        production_url = await production.start("127.0.0.1", 0)
        stack.push_async_callback(production.stop)
        console.print(f"Production model (a second stand-in): [bold]{production_url}[/]")

        tmp = Path(tempfile.mkdtemp(prefix="trajstream-demo-"))
        gateway = build_gateway(
            settings.model_copy(
                update={
                    "kafka": settings.kafka.model_copy(
                        update={"bootstrap_servers": bootstrap, "topic_prefix": prefix}
                    ),
                    "trinity": settings.trinity.model_copy(update={"url": url}),
                    "selection": settings.selection.model_copy(
                        update={
                            "strategy": DEMO_SETTINGS["TRAJSTREAM_SELECTION__STRATEGY"],
                            "rate": float(DEMO_SETTINGS["TRAJSTREAM_SELECTION__RATE"]),
                        }
                    ),
                    "gateway": settings.gateway.model_copy(
                        update={
                            "mode": "route",
                            "production_url": f"{production_url}/v1",
                            "spill_dir": tmp / "spill",
                            "rollout": settings.gateway.rollout.model_copy(
                                update=ROLLOUT if rollout else {}
                            ),
                        }
                    ),
                }
            )
        )
        gateway_url = await gateway.start("127.0.0.1", 0)
        stack.push_async_callback(gateway.stop)
        console.print(f"Gateway: [bold]{gateway_url}[/] (route mode; agents use the openai client)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
        env.update(DEMO_SETTINGS)
        if rollout:
            env.update(ROLLOUT_SETTINGS)
        env.update(
            TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
            TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
            TRAJSTREAM_APP_ID=prefix,
            TRAJSTREAM_TRINITY__URL=url,
            TRAJSTREAM_DATA_DIR=str(tmp / "data"),
            TRAJSTREAM_CACHE_DIR=str(settings.cache_dir),
        )
        log_path = tmp / "worker.log"
        with log_path.open("wb") as log_file:
            worker = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block
                [sys.executable, "-m", "streams.cli", "worker"],
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        stack.callback(_stop_process, worker)
        console.print(f"Worker: pid {worker.pid}, topics {prefix}.*, log {log_path}")

        # the worker's selection, computed here with the same pure strategy
        strategy = build_strategy(
            DEMO_SETTINGS["TRAJSTREAM_SELECTION__STRATEGY"],
            rate=float(DEMO_SETTINGS["TRAJSTREAM_SELECTION__RATE"]),
        )
        sims = await _drive(gateway_url, calls, agents, rollout)
        if not await gateway.publisher.flush(60):
            console.print("[red]the gateway could not publish everything to Kafka[/]")
        # the calls Trinity answers: the gateway's route (with --rollout, the share in force)
        expected = [
            s for s in sims if (s.upstream == "trinity" if rollout else _selected(strategy, s))
        ]
        wanted = {m for s in expected for m in s.msg_ids}
        ok = await _wait_committed(standin, wanted, worker, log_path)
        # every call the gateway routed is scored, the production-answered ones for the
        # comparison (streams.core.arms), so every call becomes one trajectory
        topics = await _read_back(bootstrap, Topics(prefix, settings.kafka.partitions), len(sims))
        _stop_process(worker)
        return _summary(sims, expected, standin, topics, ok, rollout)
    return 1  # pragma: no cover - unreachable


def _selected(strategy: Any, sim: SimulatedCall) -> bool:
    """What the worker will decide, computed here with the same pure strategy."""
    from ..core.select import CallView
    from ..models import AgentCall, CallPhase, TrainingMark, utcnow

    now = utcnow()
    mark = TrainingMark(marked_at=now) if sim.marked else None
    end = AgentCall(
        event_id="x",
        call_id=sim.call_id,
        phase=CallPhase.END,
        event_time=now,
        agent_name=sim.agent,
        mark=mark,
    )
    return bool(strategy.decide(CallView(sim.call_id, None, end, sim.model)).selected)


async def _drive(
    gateway_url: str, calls: int, agents: int, rollout: bool = False
) -> list[SimulatedCall]:
    rng = random.Random(42)

    def fails(upstream: str) -> bool:  # --rollout: the policy fails less than production
        return rng.random() < (0.05 if upstream == "trinity" else 0.6)

    names = list(AGENTS)[:agents]
    sims: list[SimulatedCall] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    async with httpx.AsyncClient(timeout=30) as http:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("agent calls (openai client -> gateway)", total=calls)
            for i in range(calls):
                sims.append(
                    await simulate_gateway_call(
                        gateway_url,
                        http,
                        rng,
                        agent=names[i % len(names)],
                        mark=rng.random() < 0.15,
                        fail=fails if rollout else rng.random() < 0.12,
                        rating=float(rng.randint(1, 5)) if rng.random() < 0.4 else None,
                    )
                )
                progress.advance(task)
                await asyncio.sleep(rng.uniform(0.0, 0.05))
    return sims


async def _wait_committed(
    standin: StandIn,
    wanted: set[str],
    worker: subprocess.Popen[bytes],
    log_path: Path,
    timeout: float = 180.0,
) -> bool:
    state = standin.state
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        fed = progress.add_task("msg_ids fed back", total=len(wanted))
        committed = progress.add_task("msg_ids committed", total=len(wanted))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            applied = {m for f in state.feedback for m in f.applied}
            progress.update(fed, completed=len(applied & wanted))
            progress.update(committed, completed=len(set(state.trained) & wanted))
            if set(state.trained) >= wanted:
                return True
            if worker.poll() is not None:
                console.print(f"[red]the worker exited ({worker.returncode}); see {log_path}[/]")
                return False
            await asyncio.sleep(0.3)
    console.print(f"[red]timed out waiting for commits; see {log_path}[/]")
    return False


async def _read_back(
    bootstrap: str, topics: Topics, trajectories: int
) -> dict[str, list[AvroModel]]:
    """Read the output topics; waits briefly for the reward windows to close."""
    codec = SchemaRegistry.default()
    names = {
        "trajectories": topics.trajectories,
        "rewarded": topics.rewarded,
        "windows": topics.windows,
        "commits": topics.commits,
        "dead_letters": topics.dead_letters,
        "comparisons": topics.comparisons,
        "routing": topics.routing,
    }
    out: dict[str, list[AvroModel]] = {}
    consumer = AIOKafkaConsumer(
        *names.values(),
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    by_topic: dict[str, list[AvroModel]] = {t: [] for t in names.values()}
    deadline = time.monotonic() + 60
    with console.status("Reading the output topics (waiting for the last reward windows)..."):
        try:
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for tp, msgs in batch.items():
                    by_topic[tp.topic].extend(codec.decode(m.value) for m in msgs)
                windowed = sum(w.count for w in by_topic[topics.windows])  # type: ignore[attr-defined]
                if len(by_topic[topics.trajectories]) >= trajectories and windowed >= trajectories:
                    break
        finally:
            await consumer.stop()
    for key, topic in names.items():
        out[key] = by_topic[topic]
    return out


def _summary(
    sims: list[SimulatedCall],
    expected: list[SimulatedCall],
    standin: StandIn,
    topics: dict[str, list[AvroModel]],
    ok: bool,
    rollout: bool = False,
) -> int:
    state = standin.state
    events = sum(
        s.events if s.events is not None else 2 + 2 * len(s.msg_ids) - 1 + (s.rating is not None)
        for s in sims
    )
    by_trinity = sum(s.upstream == "trinity" for s in sims)
    trajectories = [t for t in topics["trajectories"] if isinstance(t, Trajectory)]
    trained = [t for t in trajectories if t.upstream not in UNTRAINED]
    compared = [t for t in trajectories if t.upstream == "production"]
    rewarded = [r for r in topics["rewarded"] if isinstance(r, RewardedTrajectory)]
    windows = [w for w in topics["windows"] if isinstance(w, WindowSummary)]
    commits = [c for c in topics["commits"] if isinstance(c, CommitRecord)]
    letters = [d for d in topics["dead_letters"] if isinstance(d, DeadLetter)]
    acked = [f for f in state.feedback if f.status == 200]
    reasons = Counter(t.selection.reason for t in trained)

    table = Table(title="trajstream demo", show_header=True)
    table.add_column("stage")
    table.add_column("count", justify="right")
    table.add_column("detail")
    table.add_row(
        "agent calls",
        str(len(sims)),
        f"{sum(s.status.value == 'ERROR' for s in sims)} failed, "
        f"{sum(s.marked for s in sims)} marked, {sum(s.rating is not None for s in sims)} rated",
    )
    table.add_row(
        "answered by",
        str(len(sims)),
        f"Trinity {by_trinity} calls, production {len(sims) - by_trinity} calls (the gateway's "
        "route, decided at each call's first request)",
    )
    table.add_row("events in", str(events), "call start/end, LLM and tool steps, user ratings")
    table.add_row(
        "selected", str(len(expected)), ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
    )
    table.add_row(
        "trajectories",
        str(len(trajectories)),
        f"{sum(len(t.steps) for t in trajectories)} steps; {len(trained)} trained, "
        f"{len(compared)} production's (scored for the comparison, not sent to Trinity)",
    )
    mean = sum(r.reward for r in rewarded) / len(rewarded) if rewarded else 0.0
    table.add_row("rewards", str(len(rewarded)), f"mean {mean:.3f}")
    table.add_row(
        "feedback acknowledged",
        str(len(acked)),
        f"{sum(len(f.applied) for f in acked)} msg_ids rewarded at the stand-in",
    )
    not_sent = sum(1 for c in commits if not c.sent)
    table.add_row(
        "commits",
        str(len(commits)),
        (
            f"{not_sent} recorded but not sent (nothing left at Trinity, or held); "
            if not_sent
            else ""
        )
        + f"stand-in: {sum(1 for c in state.commits if c.status == 200)} commits, "
        f"{len(state.trained)} experiences trained, explore step {state.explore_step}",
    )
    table.add_row("dead letters", str(len(letters)), "")
    console.print(table)

    wtable = Table(title="rewards per window", show_header=True)
    for col in (
        "window start",
        "agent",
        "model",
        "upstream",
        "count",
        "mean",
        "min",
        "max",
        "success",
    ):
        wtable.add_column(col)
    for w in sorted(windows, key=lambda w: (w.window_start, w.agent_name, w.upstream or "")):
        wtable.add_row(
            w.window_start.strftime("%H:%M:%S"),
            w.agent_name,
            w.model,
            (w.upstream or "-") + ("" if w.policy_version is None else f" v{w.policy_version}"),
            str(w.count),
            f"{w.mean:.3f}",
            f"{w.min:.3f}",
            f"{w.max:.3f}",
            f"{w.success_rate:.0%}",
        )
    console.print(wtable)

    from ..observe.policy import PolicyView, render

    view = PolicyView(
        [c for c in topics["comparisons"] if isinstance(c, Comparison)],
        [r for r in topics["routing"] if isinstance(r, RoutingShare)],
    )
    render(view, console)
    checks = {
        "every selected call became one trajectory": len(trained) == len(expected),
        "every production call scored, none trained": len(compared) == len(sims) - by_trinity,
        "one feedback per trajectory at the stand-in": len(acked) == len(expected),
        "every msg_id of the selected calls trained": set(state.trained)
        == {m for s in expected for m in s.msg_ids},
        "the gateway sent exactly the selected calls to Trinity": {
            s.call_id for s in sims if s.upstream == "trinity"
        }
        == {s.call_id for s in expected},
        # a batch an earlier commit already drained is recorded with sent: false, not sent
        "commits sent = commits received": sum(1 for c in commits if c.sent)
        == sum(1 for c in state.commits if c.status == 200),
        "feedback in commits = feedback acknowledged": sum(c.feedback_count for c in commits)
        == len(acked),
        "rewards in windows = rewards": sum(w.count for w in windows) == len(rewarded),
        "no dead letters": not letters,
    }
    if rollout:
        checks["the policy won a window with confidence"] = any(
            c.verdict == "better" for c in view.comparisons
        )
        checks["the rollout promoted the policy"] = any(r.action == "promote" for r in view.routing)
    for what, good in checks.items():
        console.print(f"  {'[green]ok[/]' if good else '[red]MISMATCH[/]'}  {what}")
    good = ok and all(checks.values())
    console.print(
        "[bold green]The summary agrees with what the stand-in received.[/]"
        if good
        else "[bold red]The summary does not agree with the stand-in.[/]"
    )
    return 0 if good else 1


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass
