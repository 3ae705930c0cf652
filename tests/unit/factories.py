"""Builders of realistic records for the unit tests: one call, its steps, its trajectory.

Plain functions with keyword overrides, so a table-driven test states only what matters to it.
Every timestamp is derived from :data:`T0`; nothing here reads the clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from streams.models import (
    AgentCall,
    AgentRollout,
    AvroModel,
    AwaitingReward,
    CallPhase,
    CallStatus,
    ChatMessage,
    ClosedCall,
    CommitHold,
    CommitRecord,
    CommitResume,
    Comparison,
    Completion,
    DeadLetter,
    DriftAlert,
    FeedbackAck,
    FeedbackKind,
    JudgeRequest,
    JudgeVerdict,
    LedgerState,
    OpenCallEvent,
    PendingCommit,
    PendingEvent,
    PendingEvents,
    RewardedTrajectory,
    RoutingOverride,
    RoutingShare,
    Selection,
    SelectionDecision,
    StepKind,
    StoredVerdict,
    Tick,
    ToolCall,
    TrainingMark,
    Trajectory,
    UserFeedback,
    WindowAccumulator,
    WindowSummary,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def mark(**kw: Any) -> TrainingMark:
    fields: dict[str, Any] = {"marked_at": T0, "labels": ["gold"], "metadata": {"team": "search"}}
    fields.update(kw)
    return TrainingMark(**fields)


def start(call_id: str = "call-1", **kw: Any) -> AgentCall:
    fields: dict[str, Any] = {
        "event_id": f"{call_id}/start",
        "call_id": call_id,
        "phase": CallPhase.START,
        "event_time": T0,
        "agent_id": "agent-7",
        "agent_name": "researcher",
        "agent_version": "1.2.0",
        "conversation_id": "conv-1",
        "input_messages": [
            ChatMessage(role="system", content="You are helpful."),
            ChatMessage(role="user", content="What is the capital of France?"),
        ],
    }
    fields.update(kw)
    return AgentCall(**fields)


def end(call_id: str = "call-1", **kw: Any) -> AgentCall:
    fields: dict[str, Any] = {
        "event_id": f"{call_id}/end",
        "call_id": call_id,
        "phase": CallPhase.END,
        "event_time": at(3),
        "agent_name": "researcher",
        "output": "Paris.",
        "status": CallStatus.OK,
    }
    fields.update(kw)
    return AgentCall(**fields)


def step(call_id: str = "call-1", seq: int = 0, **kw: Any) -> Completion:
    kind = kw.get("kind", StepKind.LLM)
    fields: dict[str, Any] = {
        "event_id": f"{call_id}/step/{seq}",
        "call_id": call_id,
        "seq": seq,
        "event_time": at(1 + seq / 10),
        "kind": kind,
    }
    if kind is StepKind.LLM:
        fields.update(
            provider_name="openai",
            request_model="qwen-7b",
            response_model="qwen-7b-0601",
            response_id=f"chatcmpl-{call_id}-{seq}",
            finish_reasons=["stop"],
            input_tokens=120,
            output_tokens=30,
            output_messages=[ChatMessage(role="assistant", content=f"step {seq}")],
            latency_ms=250.5,
        )
    else:
        fields.update(operation_name="execute_tool", tool_name="search", latency_ms=12.0)
    fields.update(kw)
    return Completion(**fields)


def feedback(call_id: str = "call-1", **kw: Any) -> UserFeedback:
    fields: dict[str, Any] = {
        "event_id": f"{call_id}/fb",
        "call_id": call_id,
        "event_time": at(10),
        "kind": FeedbackKind.RATING,
        "rating": 4.0,
    }
    fields.update(kw)
    return UserFeedback(**fields)


def trajectory(call_id: str = "call-1", **kw: Any) -> Trajectory:
    fields: dict[str, Any] = {
        "trajectory_id": call_id,
        "call_id": call_id,
        "task_id": f"task-{call_id}",
        "agent_name": "researcher",
        "output": "Paris.",
        "status": CallStatus.OK,
        "steps": [step(call_id, 0), step(call_id, 1, kind=StepKind.TOOL), step(call_id, 2)],
        "selection": Selection(selected=True, strategy="sampling(1)", reason="sampled"),
        "started_at": T0,
        "ended_at": at(3),
    }
    fields.update(kw)
    return Trajectory(**fields)


def rewarded(trajectory_id: str = "call-1", reward: float = 0.5, **kw: Any) -> RewardedTrajectory:
    fields: dict[str, Any] = {
        "trajectory_id": trajectory_id,
        "call_id": trajectory_id,
        "task_id": f"task-{trajectory_id}",
        "msg_ids": [f"chatcmpl-{trajectory_id}-0"],
        "reward": reward,
        "reward_fn": "streams.rewards:success",
        "agent_name": "researcher",
        "model": "qwen-7b-0601",
        "event_time": T0,
    }
    fields.update(kw)
    return RewardedTrajectory(**fields)


def ack(trajectory_id: str = "call-1", reward: float = 0.5, **kw: Any) -> FeedbackAck:
    return FeedbackAck(rewarded=rewarded(trajectory_id, reward, **kw), acked_at=T0)


def sample_records() -> dict[type[AvroModel], AvroModel]:
    """One realistic, fully populated instance of every record model."""
    the_mark = mark(task_id="task-42", run_id=3)
    traj = trajectory(
        mark=the_mark,
        run_id=3,
        input_messages=[ChatMessage(role="tool", content="{}", name="search")],
        feedback=[
            feedback(),
            feedback(event_id="fb-2", kind=FeedbackKind.THUMBS, rating=None, thumbs_up=True),
        ],
        closed_reason="ended",
        upstream="trinity",
        policy_version=7,
    )
    records: dict[type[AvroModel], AvroModel] = {
        ToolCall: ToolCall(id="call_1", name="search", arguments='{"q": "paris"}'),
        ChatMessage: ChatMessage(
            role="tool", content="42 results", name="search", tool_call_id="call_1"
        ),
        TrainingMark: the_mark,
        AgentCall: end(
            mark=the_mark,
            step_count=3,
            attributes={"tenant": "acme", "env": "prod"},
            error_type=None,
            agent_id="agent-7",
            conversation_id="conv-1",
        ),
        Completion: step(
            seq=5,
            tool_calls=["search", "fetch"],
            tool_call_details=[
                ToolCall(id="call_1", name="search", arguments='{"q": "paris"}'),
                ToolCall(id="call_2", name="fetch", arguments="{}"),
            ],
            upstream="trinity",
            policy_version=7,
        ),
        UserFeedback: feedback(
            response_id="chatcmpl-call-1-0",
            kind=FeedbackKind.CORRECTION,
            rating=None,
            correction="Paris, France.",
            preferred_response_id="chatcmpl-x",
            user_id="u-1",
            comment="close",
            rating_min=0.0,
            rating_max=10.0,
        ),
        Selection: Selection(selected=False, strategy="marked(ttl=60s)", reason="expired"),
        Trajectory: traj,
        RewardedTrajectory: rewarded(
            components={"success": 1.0, "latency": 0.25},
            labels=["gold"],
            metadata={"k": "v"},
            run_id=2,
            upstream="mixed",
            policy_version=7,
        ),
        FeedbackAck: FeedbackAck(rewarded=rewarded(), acked_at=at(5), attempts=3),
        Tick: Tick(at=at(7.123), source="worker-1", final=True),
        WindowSummary: WindowSummary(
            window_start=T0,
            window_end=at(60),
            agent_name="researcher",
            model="qwen",
            count=3,
            mean=0.5,
            min=0.1,
            max=0.9,
            stddev=0.3,
            success_rate=2 / 3,
            late=1,
            emitted_at=at(75),
            upstream="trinity",
            policy_version=7,
        ),
        CommitRecord: CommitRecord(
            commit_seq=7,
            interval_start=T0,
            interval_end=at(300),
            feedback_count=12,
            reward_mean=0.4,
            reward_min=0.0,
            reward_max=1.0,
            trinity_response='{"ok": true}',
            final=True,
        ),
        DeadLetter: DeadLetter(
            reason="corrupt body",
            error_type="DecodeError",
            stage="decode",
            source_topic="trajstream.agent-events",
            source_partition=2,
            source_offset=991,
            key=b"call-1",
            payload=b"\xc3\x01\x00\xff",
            failed_at=at(1),
            worker="w-1",
        ),
        PendingEvents: PendingEvents(
            call_id="call-1",
            partition=3,
            first_seen=T0,
            events=[
                PendingEvent(event_id="e1", kind=0, size=10, data=b"\xc3\x01start"),
                PendingEvent(event_id="e2", kind=2, seq=0, size=12, data=b"\xc3\x01step"),
                PendingEvent(event_id="e3", kind=1, step_count=1, size=9, data=b"\xc3\x01end"),
            ],
        ),
        OpenCallEvent: OpenCallEvent(
            call_id="call-1",
            partition=3,
            first_seen=T0,
            event_id="e2",
            kind=2,
            seq=0,
            size=12,
            data=b"\xc3\x01step",
        ),
        AwaitingReward: AwaitingReward(
            call_id="call-1",
            partition=1,
            trajectory=traj,
            feedback=[feedback()],
            since=at(4),
            ready=True,
            judge_requested_at=at(4),
        ),
        LedgerState: LedgerState(
            next_seq=4,
            batch_start=at(1),
            batch_count=2,
            batch_sum=1.5,
            batch_min=0.5,
            batch_max=1.0,
            recent_ids=["a", "b"],
            last_commit=T0,
            watermark=at(2),
            last_event=at(3),
            windows=[
                WindowAccumulator(
                    agent_name="researcher",
                    model="qwen",
                    window_start=T0,
                    count=2,
                    mean=0.75,
                    m2=0.125,
                    min=0.5,
                    max=1.0,
                    successes=1,
                    upstream="trinity",
                    policy_version=7,
                ),
                WindowAccumulator(agent_name="-", model="-", window_start=at(60)),
            ],
            closed_until={"researcher|qwen": 1767225600000},
            late={"researcher|qwen": 2},
            applied_offset=41,
            pending_commit=PendingCommit(
                seq=4,
                step_before=7,
                interval_start=at(1),
                interval_end=at(5),
                count=2,
                reward_sum=1.5,
                reward_min=0.5,
                reward_max=1.0,
            ),
            trailing={"researcher|qwen": [0.5, 0.75]},
            holds=[
                CommitHold(
                    agent_name="researcher",
                    model="qwen",
                    threshold=0.6,
                    window_start=T0,
                    mean=0.2,
                    since=at(61),
                    reason="rollback",
                )
            ],
            arm_windows=[
                WindowAccumulator(
                    agent_name="researcher",
                    model="*",
                    window_start=T0,
                    count=4,
                    mean=0.5,
                    m2=0.2,
                    min=0.0,
                    max=1.0,
                    successes=3,
                    upstream="production",
                )
            ],
            rollout=[
                AgentRollout(
                    agent_name="researcher",
                    share=0.2,
                    version=3,
                    wins=1,
                    losses=0,
                    pinned=True,
                    rolled_back=False,
                    updated_at=at(62),
                )
            ],
        ),
        SelectionDecision: SelectionDecision(
            call_id="call-1",
            agent_name="researcher",
            model="qwen",
            selection=Selection(selected=False, strategy="sampling(0.1)", reason="not-sampled"),
            closed_reason="ended",
            steps=3,
            marked=False,
            ended_at=at(3),
            decided_at=at(4),
        ),
        ClosedCall: ClosedCall(call_id="call-1", partition=2, closed_at=at(4), reason="ended"),
        DriftAlert: DriftAlert(
            agent_name="researcher",
            model="qwen",
            window_start=T0,
            window_end=at(60),
            mean=0.2,
            trailing_mean=0.8,
            trailing_windows=3,
            fraction=0.8,
            raised_at=at(61),
        ),
        CommitResume: CommitResume(
            agent_name="researcher",
            model=None,
            requested_at=at(70),
            requested_by="ops",
            reason="checked the drop",
        ),
        JudgeRequest: JudgeRequest(
            call_id="call-1",
            trajectory_id="traj-1",
            model="judge-model",
            rubric="Score how well the agent answered.",
            prompt="## prompt\nuser: hi",
            prompt_hash="ab" * 32,
            requested_at=at(5),
        ),
        JudgeVerdict: JudgeVerdict(
            call_id="call-1",
            trajectory_id="traj-1",
            score=0.75,
            reason="answered, a bit long",
            judge_model="judge-model",
            prompt_hash="ab" * 32,
            raw_answer='{"score": 0.75, "reason": "answered, a bit long"}',
            attempts=2,
            requested_at=at(5),
            judged_at=at(6),
        ),
    }
    verdict = records[JudgeVerdict]
    assert isinstance(verdict, JudgeVerdict)
    records[StoredVerdict] = StoredVerdict(partition=2, stored_at=at(7), verdict=verdict)
    records.update(_span_records())
    records.update(_rollout_records())
    return records


def comparison(**kw: Any) -> Comparison:
    fields: dict[str, Any] = {
        "agent_name": "researcher",
        "span": "window",
        "window_start": T0,
        "window_end": at(60),
        "policy_count": 40,
        "policy_mean": 0.7,
        "policy_stddev": 0.2,
        "production_count": 160,
        "production_mean": 0.5,
        "production_stddev": 0.25,
        "difference": 0.2,
        "lower": 0.12,
        "upper": 0.28,
        "level": 0.95,
        "df": 70.3,
        "verdict": "better",
        "emitted_at": at(75),
    }
    fields.update(kw)
    return Comparison(**fields)


def _rollout_records() -> dict[type[AvroModel], AvroModel]:
    """Samples of the comparison and rollout records."""
    evidence = comparison(
        policy_version=7, policy_fallbacks=2, policy_mixed=1, fallback_rate=3 / 43
    )
    return {
        Comparison: evidence,
        RoutingShare: RoutingShare(
            agent_name="researcher",
            share=0.3,
            previous_share=0.2,
            version=4,
            effective_at=at(80),
            decided_at=at(75),
            action="promote",
            reason="better with confidence for 2 windows",
            evidence=[evidence, comparison(span="trailing", windows=3)],
            requested_by="",
            policy_version=7,
        ),
        RoutingOverride: RoutingOverride(
            agent_name="researcher",
            share=0.1,
            requested_at=at(90),
            requested_by="ops",
            reason="hold it there",
        ),
    }


def _span_records() -> dict[type[AvroModel], AvroModel]:
    """Samples of the span-resolution records (OTLP, otlp.resolve = trace)."""
    from streams.models import HeldSpan, SpanLink, TraceFragment, TraceHead, TraceSpan

    agent = TraceSpan(
        span_id="a" * 16,
        role="agent",
        call_id="t" * 32 + "-" + "a" * 16,
        start=start("t" * 32 + "-" + "a" * 16),
        end=end("t" * 32 + "-" + "a" * 16),
    )
    chat = TraceSpan(
        span_id="b" * 16, parent_id="c" * 16, role="llm", step=step("t" * 32 + "-" + "b" * 16)
    )
    plain = TraceSpan(span_id="c" * 16, parent_id="a" * 16)
    link = SpanLink(span_id="b" * 16, parent_id="c" * 16, role="llm", emitted=True)
    held = HeldSpan(span_id="b" * 16, at=at(3), size=120)
    return {
        TraceSpan: chat,
        TraceFragment: TraceFragment(
            trace_id="t" * 32, received_at=at(4), spans=[chat, plain, agent]
        ),
        SpanLink: link,
        HeldSpan: held,
        TraceHead: TraceHead(
            trace_id="t" * 32,
            partition=1,
            first_seen=at(1),
            last_seen=at(4),
            links=[link, SpanLink(span_id="c" * 16, parent_id="a" * 16)],
            held=[held],
            ends=[HeldSpan(span_id="a" * 16, at=at(9), size=300)],
        ),
    }
