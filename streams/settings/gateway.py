"""The gateway's sections: its client keys, the comparison of policy and production, the
rollout, the gateway itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    NoDecode,
)

from .sections import PositiveFloat, PositiveInt, Section


class GatewayKey(Section):
    """A client credential of the gateway: a bearer key, optionally naming its agent and rate."""

    key: SecretStr = Field(description="the bearer token a client sends; never logged")
    agent: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="the agent name recorded for this key's calls (X-Trajstream-Agent-Name "
        "is then ignored)",
    )
    rate_per_s: PositiveFloat | None = Field(
        default=None,
        description="requests a second this key may make (a bucket of one second's worth); "
        "past it: 429",
    )

    @field_validator("key")
    @classmethod
    def _not_blank(cls, v: SecretStr) -> SecretStr:
        if len(v.get_secret_value().strip()) < 8:
            raise ValueError("a key must be at least 8 characters")
        return v


class CompareSettings(Section):
    """The comparison of the policy with production (:mod:`streams.core.compare`)."""

    level: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="confidence level of the difference's interval"
    )
    min_count: int = Field(
        default=10, ge=2, description="calls each arm needs in a window for a verdict"
    )
    trailing_windows: PositiveInt = Field(
        default=10, description="windows pooled in the trailing comparison"
    )


class RolloutSettings(Section):
    """Promotion and rollback of the policy (``gateway.rollout``, :mod:`streams.core.rollout`)."""

    enabled: bool = Field(
        default=False,
        description="the ledger owner moves each agent's policy share on <p>.routing and the "
        "gateway routes by it",
    )
    initial_share: float = Field(
        default=0.05, ge=0.0, le=1.0, description="an agent's first share"
    )
    step: float = Field(default=0.1, gt=0.0, le=1.0, description="share added per promotion")
    max_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="the most share promotions reach"
    )
    floor: float = Field(default=0.0, ge=0.0, le=1.0, description="share after a rollback")
    promote_after: PositiveInt = Field(
        default=3, description="consecutive windows the policy must win with confidence"
    )
    rollback_after: PositiveInt = Field(
        default=1, description="consecutive windows lost with confidence that roll it back"
    )
    apply_delay_s: float = Field(
        default=5.0,
        ge=0.0,
        description="a change applies to calls starting this long after it is decided",
    )
    max_fallback_rate: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="no promotion while more of the calls routed to the policy than this "
        "fell back to production (in whole or in part) in the window that would promote it",
    )

    @model_validator(mode="after")
    def _ordered(self) -> RolloutSettings:
        if not self.floor <= self.initial_share <= self.max_share:
            raise ValueError(
                "gateway.rollout needs floor <= initial_share <= max_share, got "
                f"{self.floor} / {self.initial_share} / {self.max_share}"
            )
        return self


class BreakerSettings(Section):
    """The circuit breaker in front of the policy (``gateway.breaker``,
    :mod:`streams.capture.breaker`): each gateway process stops sending requests to Trinity
    while it fails, and probes it again after a cool-down."""

    failures: PositiveInt = Field(
        default=5, description="consecutive failed requests to Trinity that open the breaker"
    )
    failure_rate: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="or: this share of the requests of the last window_s failed (once there "
        "were min_requests)",
    )
    window_s: PositiveFloat = Field(
        default=30.0, description="the window of failure_rate, in seconds"
    )
    min_requests: PositiveInt = Field(
        default=20, description="requests in window_s before failure_rate may open it"
    )
    cooldown_s: PositiveFloat = Field(
        default=10.0,
        description="how long it stays open (at least the Retry-After Trinity answered with) "
        "before probing",
    )
    max_cooldown_s: PositiveFloat = Field(
        default=300.0, description="the longest cool-down, whatever Retry-After says"
    )
    probes: PositiveInt = Field(
        default=3,
        description="half-open: requests let through to Trinity; this many answered close it, "
        "one failure opens it again",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BreakerSettings:
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError(
                "gateway.breaker.max_cooldown_s must be at least cooldown_s, got "
                f"{self.max_cooldown_s:g} < {self.cooldown_s:g}"
            )
        return self


class GatewaySettings(Section):
    """The OpenAI-compatible gateway (``trajstream gateway``)."""

    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)

    host: str = Field(
        default="127.0.0.1",
        description="listen address (other than loopback: needs api_keys or allow_anonymous)",
    )
    api_keys: Annotated[list[GatewayKey], NoDecode] = Field(
        default_factory=list,
        description="client credentials checked on every route (a JSON list of keys, or of "
        '{"key", "agent", "rate_per_s"}); empty: only a loopback host unless allow_anonymous',
    )
    allow_anonymous: bool = Field(
        default=False,
        description="serve without api_keys on a host other than loopback (anyone who reaches "
        "it spends the production key)",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="listen port")
    mode: Literal["route", "shadow"] = Field(
        default="route",
        description="route: selected calls answered by Trinity; shadow: production answers all, "
        "selected requests also go to Trinity, whose answer is recorded",
    )
    production_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="base URL of the production model, up to /v1 (https://api.openai.com/v1)",
    )
    production_api_key: SecretStr | None = Field(
        default=None, description="sent to production as a bearer token; never logged"
    )
    trinity_model: str | None = Field(
        default=None, description="model name sent to Trinity instead of the agent's"
    )
    connect_timeout_s: PositiveFloat = Field(
        default=5.0, description="an upstream connection not open within this: 504"
    )
    timeout_s: PositiveFloat = Field(
        default=120.0, description="an upstream silent this long (no byte): 504"
    )
    policy_timeout_s: PositiveFloat = Field(
        default=10.0,
        description="Trinity's first byte (a streamed answer's first chunk, a non-streamed "
        "answer whole) not there within this: production answers instead",
    )
    policy_version_poll_s: PositiveFloat = Field(
        default=5.0,
        description="how often Trinity's /metrics is read for the policy's version (in the "
        "background; each read bounded by policy_timeout_s)",
    )
    max_body_bytes: PositiveInt = Field(default=8 * 1024 * 1024, description="larger: 413")
    max_connections: PositiveInt = Field(default=256, description="per upstream")
    durability: Literal["buffered", "acked"] = Field(
        default="buffered",
        description="buffered: answer at once, records queued (a killed process loses what is "
        "in memory); acked: answer once the broker acknowledged the request's records",
    )
    ack_timeout_s: PositiveFloat = Field(
        default=5.0,
        description="acked: a broker slower than this answers 503 (the records stay queued)",
    )
    recorder: Literal["process", "loop"] = Field(
        default="process",
        description="process: records are built, encoded and sent to Kafka by a child process "
        "of the gateway (off the serving loop); loop: by a task on the serving loop",
    )
    buffer_records: PositiveInt = Field(
        default=10_000, description="records kept in memory for Kafka; past that: spill_dir"
    )
    spill_dir: Path = Field(
        default=Path(".cache/trajstream/gateway-spill"),
        description="where records past buffer_records are spilled",
    )
    flush_timeout_s: PositiveFloat = Field(
        default=10.0, description="on stop: how long to try the broker before spilling the rest"
    )
    max_open_calls: PositiveInt = Field(
        default=100_000, description="calls remembered per process for step counts"
    )
    count_steps: bool = Field(
        default=True,
        description="END carries the steps this process recorded: needs call-sticky replicas",
    )
    anthropic_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="base URL of Anthropic's API, without /v1 (https://api.anthropic.com): the "
        "production upstream of /v1/messages; unset, only calls routed to Trinity are answered",
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None, description="sent to anthropic_url as x-api-key; never logged"
    )
    responses_calls: PositiveInt = Field(
        default=10_000,
        description="calls whose Responses API items are kept for previous_response_id "
        "(least recently used dropped; a response past 2048 items or 8 MB is not kept)",
    )

    @field_validator("production_url", "anthropic_url")
    @classmethod
    def _no_trailing_slash(cls, v: str | None) -> str | None:
        return v.rstrip("/") if v else v

    @field_validator("api_keys", mode="before")
    @classmethod
    def _plain_keys(cls, v: Any) -> Any:
        """A key alone stands for ``{"key": ...}``; a string is a JSON list or comma-separated
        keys (the environment variable)."""
        if isinstance(v, str | SecretStr):
            text = (v.get_secret_value() if isinstance(v, SecretStr) else v).strip()
            if text.startswith("["):
                try:
                    v = json.loads(text)
                except ValueError:
                    raise ValueError("not a JSON list of keys") from None
            else:
                v = [part.strip() for part in text.split(",") if part.strip()]
        if isinstance(v, list):
            return [{"key": k} if isinstance(k, str | SecretStr) else k for k in v]
        return v

    @field_validator("api_keys")
    @classmethod
    def _distinct_keys(cls, v: list[GatewayKey]) -> list[GatewayKey]:
        if len({k.key.get_secret_value() for k in v}) != len(v):
            raise ValueError("the same key is listed twice")
        return v

    @field_validator("spill_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()
