"""The pipeline's sections: Trinity, selection, assembly, rewards and the judge, windows,
commits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from .sections import PositiveFloat, PositiveInt, Section


class TrinitySettings(Section):
    url: str = Field(
        default="http://127.0.0.1:8010",
        pattern=r"^https?://",
        description="Trinity's explorer in serve mode (or the stand-in); no credentials in it",
    )

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        # aiohttp/httpx would send them, or fail on every request; they do not belong in a
        # setting that is printed by `trajstream settings` and logged
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "a URL with credentials (user:password@) is not accepted; put the credentials "
                "in front of Trinity (a proxy) or remove them"
            )
        return v

    timeout_s: PositiveFloat = Field(default=10.0, description="one request's timeout")
    max_connections: PositiveInt = Field(default=16, description="connections to Trinity")
    retry_max_age_s: PositiveFloat = Field(
        default=3600.0, description="give up on a feedback (dead letter) after retrying this long"
    )
    ca_file: Path | None = Field(
        default=None, description="PEM file of the CAs to trust for an https url"
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="extra request headers, e.g. Authorization (values are secret)",
    )

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return v
        if not str(info.data.get("url", "")).startswith("https://"):
            raise ValueError("only used with an https:// url (trinity.url)")
        v = v.expanduser()
        if not v.is_file():
            raise ValueError(f"no such file: {v}")
        return v


class SelectionSettings(Section):
    strategy: str = Field(
        default="any(marked,sampling)",
        min_length=1,
        description="which calls train: sampling[:rate], marked[:ttl], any(...), all(...), "
        "per-agent(...), per-model(...), or a plugin (package.module:Class or an entry point)",
    )
    rate: float = Field(
        default=0.1, ge=0.0, le=1.0, description="the fraction of calls `sampling` selects"
    )
    mark_ttl_s: PositiveFloat = Field(
        default=60.0,
        description="a training mark older than this when its call ends is not honoured",
    )


class AssemblySettings(Section):
    max_steps: PositiveInt = Field(
        default=256, description="a call with more steps closes as oversized"
    )
    max_bytes: PositiveInt = Field(
        default=900_000,
        description="a larger call closes as oversized; at most kafka.max_record_bytes less "
        "RECORD_HEADROOM, so the stored call and its trajectory fit in one record",
    )
    abandon_after_s: PositiveFloat = Field(
        default=600.0, description="a call without its END is closed as abandoned after this"
    )
    late_retention_s: PositiveFloat = Field(
        default=900.0, description="how long a closed call is remembered to record late events"
    )
    tick_s: PositiveFloat = Field(
        default=5.0, description="how often the leader publishes clock ticks to <p>.ticks"
    )
    max_future_s: PositiveFloat = Field(
        default=300.0,
        description="an event, user feedback or tick dated further ahead of the clock is a "
        "dead letter (it would otherwise move a clock)",
    )


MAX_RUBRIC_BYTES = 64 * 1024


class JudgeSettings(Section):
    """The built-in LLM judge (``streams.rewards:judge``): an OpenAI-compatible endpoint."""

    url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="base URL of the judge's OpenAI-compatible API, up to /v1 "
        "(https://api.openai.com/v1); requests go to <url>/chat/completions",
    )
    model: str | None = Field(default=None, min_length=1, description="the judge model")
    rubric_file: Path | None = Field(
        default=None,
        description="a text file with the rubric, sent as the system message; it must ask for "
        'the answer {"score": 0..1, "reason": "..."}',
    )
    api_key: SecretStr | None = Field(
        default=None, description="sent as a bearer token; never logged"
    )
    timeout_s: PositiveFloat = Field(default=60.0, description="one request's timeout")
    max_connections: PositiveInt = Field(default=8, description="concurrent judge requests")
    retry_base_s: PositiveFloat = Field(default=1.0, description="first retry backoff")
    retry_cap_s: PositiveFloat = Field(default=30.0, description="longest retry backoff")
    max_age_s: PositiveFloat = Field(
        default=900.0,
        description="a judge request still unanswered this long after the reward stage made "
        "it (5xx, timeouts) becomes a dead letter",
    )
    max_prompt_chars: int = Field(
        default=20_000,
        ge=1000,
        le=200_000,
        description="the rendered trajectory is cut to this many characters (so that a judge "
        "request fits in one Kafka record)",
    )
    keep_verdicts_s: PositiveFloat = Field(
        default=3600.0,
        description="the reward stage keeps a call's verdict this long (a redelivered "
        "trajectory reuses it); <prefix>.verdicts keeps them all",
    )
    replay_missing: Literal["ask", "dead_letter"] = Field(
        default="ask",
        description="what `trajstream replay` does for a call with no verdict on "
        "<prefix>.verdicts: ask the judge (and record the verdict there), or a dead letter",
    )

    @field_validator("url")
    @classmethod
    def _judge_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            raise ValueError("a URL with credentials is not accepted; use reward.judge.api_key")
        return v.rstrip("/")

    @field_validator("rubric_file")
    @classmethod
    def _rubric(cls, v: Path | None) -> Path | None:
        if v is None:
            return v
        v = v.expanduser()
        if not v.is_file():
            raise ValueError(f"no such file: {v}")
        try:
            text = v.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {v}: {exc}") from exc
        if not text.strip():
            raise ValueError(f"{v} is empty")
        if len(text.encode()) > MAX_RUBRIC_BYTES:
            raise ValueError(
                f"{v} is larger than {MAX_RUBRIC_BYTES} bytes (it goes into every judge request)"
            )
        return v

    @property
    def configured(self) -> bool:
        return None not in (self.url, self.model, self.rubric_file)

    def missing(self) -> list[str]:
        """The settings a judge reward needs that are not set."""
        return [
            f"reward.judge.{name} [TRAJSTREAM_REWARD__JUDGE__{name.upper()}]"
            for name in ("url", "model", "rubric_file")
            if getattr(self, name) is None
        ]


class RewardSettings(Section):
    function: str = Field(
        default="streams.rewards:success",
        min_length=1,
        description="the reward function: package.module:function or an entry point "
        "(group trajstream.rewards); `composite` combines reward.weights",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="composite: reward function name -> weight (normalised to sum to 1)",
    )
    feedback_grace_s: float = Field(
        default=0.0,
        ge=0.0,
        description="how long a reward that wants user feedback waits for it",
    )
    score_incomplete: bool = Field(
        default=False, description="also reward trajectories closed as abandoned or oversized"
    )
    step_discount: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="gamma: step i of n gets reward * gamma ** (n - 1 - i) (off: every step "
        "gets the trajectory's reward, unless the function returns step_rewards)",
    )
    train_mixed: bool = Field(
        default=False,
        description="send the reward of a mixed call (routed to the policy, answered in part by "
        "production) for the steps Trinity answered in full; off: such calls are scored and "
        "counted, never sent to /feedback (their later steps answer another model)",
    )
    judge: JudgeSettings = Field(default_factory=JudgeSettings)


class WindowSettings(Section):
    size_s: PositiveInt = Field(default=60, description="tumbling window size, whole seconds")
    grace_s: float = Field(default=10.0, ge=0.0, description="lateness a window allows")
    drift_fraction: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="a drift alert when a window's mean falls below this fraction of the "
        "trailing mean",
    )
    drift_history: int = Field(
        default=5, ge=2, description="the earlier windows of the trailing mean"
    )


class CommitSettings(Section):
    interval_s: PositiveFloat = Field(
        default=300.0,
        description="commits fall due at the end of aligned intervals of this many seconds",
    )
    min_batch: PositiveInt = Field(
        default=1,
        description="acknowledged trajectories a commit needs; a smaller batch carries over",
    )
    commit_empty: bool = Field(
        default=False, description="also commit at the end of an interval without feedback"
    )
    tick_s: PositiveFloat = Field(
        default=1.0, description="how often the leader publishes ticks to the ledger"
    )
    hold_on_drift: bool = Field(
        default=False,
        description="a drift alert holds commits until a later window of its agent and model "
        "recovers, or `trajstream commits resume`",
    )
