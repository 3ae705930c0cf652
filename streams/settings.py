"""One settings object for the whole application.

Read from, in order of precedence: keyword arguments, environment variables prefixed
``TRAJSTREAM_`` (nested with ``__``, e.g. ``TRAJSTREAM_COMMIT__INTERVAL_S=60``), a config file
(TOML or YAML) named by ``--config`` or else ``TRAJSTREAM_CONFIG``, then defaults. The standard
``KAFKA_BOOTSTRAP_SERVERS`` variable is honoured for the broker too. A bad value fails at start
with :class:`~streams.errors.ConfigError` naming the setting and the environment variable.

May import: pydantic, pydantic-settings, :mod:`streams.errors`.
"""

from __future__ import annotations

import json
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import pydantic
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from .errors import ConfigError

__all__ = [
    "FAUST_ENV_OVERRIDES",
    "JudgeSettings",
    "KafkaSecuritySettings",
    "SchemaRegistrySettings",
    "Settings",
    "TrinitySettings",
    "check_faust_environment",
    "load_settings",
]

PositiveFloat = pydantic.PositiveFloat
PositiveInt = pydantic.PositiveInt


class _Section(BaseModel):
    """A section of the settings; a misspelt key in a config file is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSecuritySettings(_Section):
    """How every Kafka client of trajstream authenticates: TLS and/or SASL.

    Validated field by field, in this order, so that an error names the setting to fix.
    OAUTHBEARER is not offered: aiokafka needs a token provider object for it (code, not a
    setting).
    """

    protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )
    mechanism: SaslMechanism | None = Field(
        default=None,
        validate_default=True,
        description="SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_* protocols)",
    )
    username: str | None = Field(default=None, validate_default=True)
    password: SecretStr | None = Field(default=None, validate_default=True)
    ssl_cafile: Path | None = Field(
        default=None, description="PEM file of the CAs to trust; unset: the system's CAs"
    )
    ssl_certfile: Path | None = Field(default=None, description="client certificate (PEM, mTLS)")
    ssl_keyfile: Path | None = Field(
        default=None, validate_default=True, description="client private key (PEM)"
    )
    ssl_key_password: SecretStr | None = Field(
        default=None, description="password of an encrypted ssl_keyfile"
    )
    ssl_check_hostname: bool = True

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @field_validator("mechanism")
    @classmethod
    def _mechanism(cls, v: str | None, info: ValidationInfo) -> str | None:
        protocol = info.data.get("protocol", "PLAINTEXT")
        if protocol.startswith("SASL_") and v is None:
            raise ValueError(
                f"required with protocol {protocol}: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
            )
        if not protocol.startswith("SASL_") and v is not None:
            raise ValueError(f"protocol {protocol} does not use SASL: set protocol SASL_SSL")
        return v

    @field_validator("username", "password")
    @classmethod
    def _credentials(cls, v: Any, info: ValidationInfo) -> Any:
        protocol = info.data.get("protocol", "PLAINTEXT")
        if protocol.startswith("SASL_") and (v is None or not _secret(v)):
            raise ValueError(f"required with protocol {protocol}")
        return v

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _file(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return v
        protocol = info.data.get("protocol", "PLAINTEXT")
        if protocol not in ("SSL", "SASL_SSL"):
            raise ValueError(f"protocol {protocol} does not use TLS: set protocol SSL or SASL_SSL")
        v = v.expanduser()
        if not v.is_file():
            raise ValueError(f"no such file: {v}")
        if info.field_name == "ssl_keyfile" and info.data.get("ssl_certfile") is None:
            raise ValueError("a key without ssl_certfile: set both")
        return v


def _secret(v: Any) -> str:
    return v.get_secret_value() if isinstance(v, SecretStr) else str(v)


Compatibility = Literal[
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
]


class SchemaRegistrySettings(_Section):
    """A Confluent-compatible schema registry (Confluent Schema Registry, Karapace, Apicurio's
    ``/apis/ccompat/v7``): where the writers register the records' schemas, and where readers
    look up the schema of a record in Confluent's wire format.

    Credentials: HTTP basic auth (``username`` + ``password``) or a bearer token, never both.
    TLS as for Kafka: ``ssl_cafile`` to trust a private CA, a client certificate and key for a
    registry that authenticates clients by TLS.
    """

    url: str = Field(
        pattern=r"^https?://",
        description="base URL of the registry's Confluent-compatible API "
        "(https://registry.example.com, or <apicurio>/apis/ccompat/v7)",
    )
    username: str | None = Field(default=None, description="HTTP basic auth user")
    password: SecretStr | None = Field(
        default=None, validate_default=True, description="HTTP basic auth password (secret)"
    )
    bearer_token: SecretStr | None = Field(
        default=None,
        validate_default=True,
        description="sent as Authorization: Bearer (secret); instead of username/password",
    )
    ssl_cafile: Path | None = Field(default=None, description="PEM file of the CAs to trust")
    ssl_certfile: Path | None = Field(default=None, description="client certificate (PEM, mTLS)")
    ssl_keyfile: Path | None = Field(
        default=None, validate_default=True, description="client private key (PEM)"
    )
    ssl_key_password: SecretStr | None = Field(
        default=None, description="password of an encrypted ssl_keyfile"
    )
    timeout_s: PositiveFloat = Field(default=10.0, description="one request's timeout")
    framing: Literal["confluent", "single-object"] = Field(
        default="confluent",
        description="what the writers write: Confluent's wire format, or still the single-object "
        "encoding (registering and checking the schemas: the first step of a rolling switch)",
    )

    @field_validator("url")
    @classmethod
    def _registry_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "a URL with credentials is not accepted; use kafka.schema_registry.username "
                "and password (or bearer_token)"
            )
        return v.rstrip("/")

    @field_validator("password")
    @classmethod
    def _basic(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if (v is None) != (info.data.get("username") is None):
            raise ValueError("basic auth needs both kafka.schema_registry.username and password")
        return v

    @field_validator("bearer_token")
    @classmethod
    def _bearer(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if v is not None and info.data.get("username") is not None:
            raise ValueError("either a bearer token or username/password, not both")
        return v

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _tls_file(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return v
        if not str(info.data.get("url", "")).startswith("https://"):
            raise ValueError("only used with an https:// url (kafka.schema_registry.url)")
        v = v.expanduser()
        if not v.is_file():
            raise ValueError(f"no such file: {v}")
        if info.field_name == "ssl_keyfile" and info.data.get("ssl_certfile") is None:
            raise ValueError("a key without ssl_certfile: set both")
        return v


class KafkaSettings(_Section):
    bootstrap_servers: str | None = Field(
        default=None,
        description=(
            "host:port[,host:port]; unset: the local broker started by `trajstream broker start`"
        ),
    )
    topic_prefix: str = Field(default="trajstream", pattern=r"^[A-Za-z0-9._-]+$")
    partitions: PositiveInt = Field(default=4, description="partitions of the keyed topics")
    replication_factor: PositiveInt = 1
    max_record_bytes: PositiveInt = Field(
        default=1_000_000,
        description="the largest record a worker writes (its producer's max.request.size; keep "
        "it at most the brokers' message.max.bytes)",
    )
    security: KafkaSecuritySettings = Field(default_factory=KafkaSecuritySettings)
    min_insync_replicas: PositiveInt | None = Field(
        default=None,
        description="min.insync.replicas of the topics trajstream creates (with acks=all, a "
        "write fails rather than land on fewer replicas); unset: 2 with replication_factor "
        ">= 3, else 1",
    )
    schema_registry: SchemaRegistrySettings | None = Field(
        default=None,
        description="a Confluent-compatible schema registry: records are registered there and "
        "written in Confluent's wire format; unset: Avro single-object encoding only",
    )

    @field_validator("min_insync_replicas")
    @classmethod
    def _min_insync(cls, v: int | None, info: ValidationInfo) -> int | None:
        replication = info.data.get("replication_factor", 1)
        if v is not None and v > replication:
            raise ValueError(
                f"{v} is more than kafka.replication_factor ({replication}): every write "
                "would fail; lower it or raise the replication factor"
            )
        return v

    @property
    def min_insync(self) -> int:
        """The ``min.insync.replicas`` the topics get."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return 2 if self.replication_factor >= 3 else 1


class TrinitySettings(_Section):
    url: str = Field(default="http://127.0.0.1:8010", pattern=r"^https?://")

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

    timeout_s: PositiveFloat = 10.0
    max_connections: PositiveInt = 16
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


class SelectionSettings(_Section):
    strategy: str = Field(default="any(marked,sampling)", min_length=1)
    rate: float = Field(default=0.1, ge=0.0, le=1.0)
    mark_ttl_s: PositiveFloat = 60.0


class AssemblySettings(_Section):
    max_steps: PositiveInt = 256
    max_bytes: PositiveInt = Field(
        default=900_000,
        description="a larger call closes as oversized; at most kafka.max_record_bytes less "
        "RECORD_HEADROOM, so the stored call and its trajectory fit in one record",
    )
    abandon_after_s: PositiveFloat = 600.0
    late_retention_s: PositiveFloat = Field(
        default=900.0, description="how long a closed call is remembered to record late events"
    )
    tick_s: PositiveFloat = 5.0
    max_future_s: PositiveFloat = Field(
        default=300.0,
        description="an event, user feedback or tick dated further ahead of the clock is a "
        "dead letter (it would otherwise move a clock)",
    )


MAX_RUBRIC_BYTES = 64 * 1024


class JudgeSettings(_Section):
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


class RewardSettings(_Section):
    function: str = Field(default="streams.rewards:success", min_length=1)
    weights: dict[str, float] = Field(default_factory=dict)
    feedback_grace_s: float = Field(default=0.0, ge=0.0)
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
    judge: JudgeSettings = Field(default_factory=JudgeSettings)


class WindowSettings(_Section):
    size_s: PositiveInt = Field(default=60, description="tumbling window size, whole seconds")
    grace_s: float = Field(default=10.0, ge=0.0)
    drift_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    drift_history: int = Field(default=5, ge=2)


class CommitSettings(_Section):
    interval_s: PositiveFloat = 300.0
    min_batch: PositiveInt = 1
    commit_empty: bool = False
    tick_s: PositiveFloat = 1.0
    hold_on_drift: bool = Field(
        default=False,
        description="a drift alert holds commits until a later window of its agent and model "
        "recovers, or `trajstream commits resume`",
    )


class GatewayKey(_Section):
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


class CompareSettings(_Section):
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


class RolloutSettings(_Section):
    """Promotion and rollback of the policy (``gateway.rollout``, :mod:`streams.core.rollout`)."""

    enabled: bool = Field(
        default=False,
        description="the ledger owner moves each agent's policy share on <p>.routing and the "
        "gateway routes by it",
    )
    initial_share: float = Field(default=0.05, ge=0.0, le=1.0)
    step: float = Field(default=0.1, gt=0.0, le=1.0, description="share added per promotion")
    max_share: float = Field(default=0.5, ge=0.0, le=1.0)
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

    @model_validator(mode="after")
    def _ordered(self) -> RolloutSettings:
        if not self.floor <= self.initial_share <= self.max_share:
            raise ValueError(
                "gateway.rollout needs floor <= initial_share <= max_share, got "
                f"{self.floor} / {self.initial_share} / {self.max_share}"
            )
        return self


class GatewaySettings(_Section):
    """The OpenAI-compatible gateway (``trajstream gateway``)."""

    rollout: RolloutSettings = Field(default_factory=RolloutSettings)

    host: str = "127.0.0.1"
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
    port: int = Field(default=8000, ge=0, le=65535)
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
    connect_timeout_s: PositiveFloat = 5.0
    timeout_s: PositiveFloat = Field(
        default=120.0, description="an upstream silent this long (no byte): 504"
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
    buffer_records: PositiveInt = Field(
        default=10_000, description="records kept in memory for Kafka; past that: spill_dir"
    )
    spill_dir: Path = Path(".cache/trajstream/gateway-spill")
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


class OtlpSettings(_Section):
    host: str = Field(
        default="127.0.0.1", min_length=1, description="`trajstream otlp` listens here"
    )
    port: int = Field(default=4318, ge=0, le=65535, description="4318 is OTLP/HTTP's usual port")
    max_body_bytes: PositiveInt = Field(
        default=16 * 1024 * 1024, description="larger export requests are refused (413)"
    )
    publish_timeout_s: PositiveFloat = Field(
        default=5.0, description="answer 503 (the exporter retries) when Kafka is slower"
    )
    missing_parent: Literal["agent", "own"] = Field(
        default="agent",
        description="a step span whose parent is not in its export: part of that parent's "
        "agent call (agent), or a call of its own (own: for agents with no invoke_agent spans)",
    )
    resolve: Literal["export", "trace"] = Field(
        default="trace",
        description="where a step span's call is found: by the workers' span-resolution stage "
        "over the whole trace (trace: the ingest publishes every span's parent link to "
        "<p>.spans, keyed by trace id), or among the ancestors in its own export (export: the "
        "ingest publishes agent events; `trajstream otlp` only, the gateway's /v1/traces "
        "always maps per export)",
    )
    settle_s: PositiveFloat = Field(
        default=5.0,
        description="trace: how long the span-resolution stage holds an agent call's END so "
        "that children exported after their agent span still join it",
    )
    orphan_after_s: PositiveFloat = Field(
        default=600.0,
        description="trace: how long a step waits for its ancestors (at least the longest agent "
        "run: an agent span is exported when it ends); then an LLM step is a call of its own, "
        "a tool step a late event",
    )
    retention_s: PositiveFloat = Field(
        default=900.0,
        description="trace: how long the links of a trace with agent calls are kept after its "
        "last span, so that a late child finds its call (and is recorded as late, not as a "
        "call of its own)",
    )


class ObserveSettings(_Section):
    host: str = Field(
        default="0.0.0.0",  # a scraper reaches the worker from outside its host or pod
        min_length=1,
        description="address of the worker's /metrics, /healthz and /readyz server",
    )
    port: int = Field(
        default=9640,
        ge=0,
        le=65535,
        description="port of that server; 0 turns it off (one port per worker on a host)",
    )
    lag_interval_s: PositiveFloat = Field(
        default=10.0, description="how often the worker samples its consumer lag"
    )
    status_page: bool = Field(
        default=False,
        description="also serve the status page (/, /calls/..., /status.json) on that port",
    )


class Settings(BaseSettings):
    """Every setting of trajstream, with its environment variable in brackets in the README."""

    model_config = SettingsConfigDict(
        env_prefix="TRAJSTREAM_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    app_id: str = Field(default="trajstream", pattern=r"^[A-Za-z0-9._-]+$")
    cache_dir: Path = Path(".cache/trajstream")
    data_dir: Path = Path(".cache/trajstream/worker")
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    stop_timeout_s: PositiveFloat = Field(
        default=15.0,
        description="a worker's graceful stop (final commit, flush) gets this long after "
        "SIGTERM; then it exits at once, committing nothing unconfirmed",
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    trinity: TrinitySettings = Field(default_factory=TrinitySettings)
    selection: SelectionSettings = Field(default_factory=SelectionSettings)
    assembly: AssemblySettings = Field(default_factory=AssemblySettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    windows: WindowSettings = Field(default_factory=WindowSettings)
    commit: CommitSettings = Field(default_factory=CommitSettings)
    compare: CompareSettings = Field(default_factory=CompareSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)

    otlp: OtlpSettings = Field(default_factory=OtlpSettings)

    observe: ObserveSettings = Field(default_factory=ObserveSettings)
    config: Path | None = Field(default=None, validation_alias=AliasChoices("TRAJSTREAM_CONFIG"))

    @field_validator("cache_dir", "data_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        # --config (load_settings(config)) wins over TRAJSTREAM_CONFIG
        path = _CONFIG_FILE.get("path") or os.environ.get("TRAJSTREAM_CONFIG")
        if path:
            suffix = Path(path).suffix.lower()
            if suffix == ".toml":
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
            elif suffix in (".yaml", ".yml"):
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    @property
    def bootstrap_servers(self) -> str | None:
        return self.kafka.bootstrap_servers or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None


_CONFIG_FILE: dict[str, str] = {}


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings, turning any invalid value into a ConfigError that names it."""
    _CONFIG_FILE.clear()
    if config is not None:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        if path.suffix.lower() not in (".toml", ".yaml", ".yml"):
            raise ConfigError(f"config file {path}: use a .toml or .yaml file")
        _CONFIG_FILE["path"] = str(path)
    env_config = None if config is not None else os.environ.get("TRAJSTREAM_CONFIG")
    if env_config and not Path(env_config).is_file():
        raise ConfigError(f"TRAJSTREAM_CONFIG={env_config}: no such file")
    if env_config and Path(env_config).suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"TRAJSTREAM_CONFIG={env_config}: use a .toml or .yaml file")
    _check_env_names(os.environ)
    try:
        settings = Settings(**overrides)
    except pydantic.ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc
    check_together(settings)
    if config is not None:  # the file read, whatever TRAJSTREAM_CONFIG says
        settings.config = Path(config)
    return settings


RECORD_HEADROOM = 64 * 1024
"""Bytes a record needs beside a call's events: a trajectory's own fields, a dead letter's
reason, Avro framing."""


def check_together(settings: Settings) -> None:
    """Settings that are each valid but not together."""
    room = settings.kafka.max_record_bytes - RECORD_HEADROOM
    if settings.assembly.max_bytes > room:
        raise ConfigError(
            f"bad setting assembly.max_bytes [TRAJSTREAM_ASSEMBLY__MAX_BYTES]: "
            f"{settings.assembly.max_bytes} does not fit in one Kafka record: an open call and "
            f"its trajectory are stored as one, and kafka.max_record_bytes "
            f"[TRAJSTREAM_KAFKA__MAX_RECORD_BYTES] is {settings.kafka.max_record_bytes} "
            f"({RECORD_HEADROOM} of them are kept for the record's own fields); use at most "
            f"{room}, or raise kafka.max_record_bytes (and the brokers' message.max.bytes)"
        )


_NOT_SETTINGS = {"TRAJSTREAM_CONFIG", "TRAJSTREAM_VENV"}  # read by load_settings / ./dev


def _check_env_names(environ: Mapping[str, str]) -> None:
    """A misspelt variable would be ignored silently; name it instead."""
    for key in environ:
        if not key.startswith("TRAJSTREAM_") or key in _NOT_SETTINGS:
            continue
        path = key[len("TRAJSTREAM_") :].lower().split("__")
        fields: Mapping[str, Any] | None = Settings.model_fields
        for part in path:
            if fields is None or part not in fields:
                raise ConfigError(f"unknown setting {key}: no such setting {'.'.join(path)}")
            annotation = fields[part].annotation
            # an optional section (``SchemaRegistrySettings | None``) nests like a section
            for member in typing.get_args(annotation) or (annotation,):
                if isinstance(member, type) and issubclass(member, BaseModel):
                    annotation = member
            nested = isinstance(annotation, type) and issubclass(annotation, BaseModel)
            fields = annotation.model_fields if nested else None


_SECRET_NAMES = {"password", "ssl_key_password", "headers", "bearer_token"}


def _describe(exc: pydantic.ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        dotted = ".".join(loc) or "settings"
        env = "TRAJSTREAM_" + "__".join(p.upper() for p in loc)
        value = err.get("input")
        if isinstance(value, str):
            value = re.sub(r"//[^/@\s]*@", "//***@", value)  # never echo URL credentials
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        if (
            isinstance(value, SecretStr)
            or any(p in _SECRET_NAMES for p in loc)
            or any("api_key" in str(part) for part in loc)
        ):
            shown = ""  # never echo a secret
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"bad setting {dotted} [{env}]: {msg}{shown}")
    return "; ".join(lines)


# Faust reads these environment variables in faust.App's settings and lets them win over the
# values the worker passes (faust/types/settings/base.py ``_init_settings``): each would
# override a trajstream setting, or a value trajstream's guarantees rest on, without a word.
FAUST_ENV_OVERRIDES: dict[str, str] = {
    "BROKER_URL": "kafka.bootstrap_servers",
    "BROKER_CONSUMER_URL": "kafka.bootstrap_servers",
    "BROKER_PRODUCER_URL": "kafka.bootstrap_servers",
    "TOPIC_PARTITIONS": "kafka.partitions",
    "TOPIC_REPLICATION_FACTOR": "kafka.replication_factor",
    "APP_DATADIR": "data_dir",
    "APP_STORE": "the table store (fixed: memory, tables live in changelog topics)",
    "TABLE_STANDBY_REPLICAS": "standby replicas (fixed: 0)",
    "CONSUMER_AUTO_OFFSET_RESET": "the offset reset (fixed: earliest, nothing is skipped)",
    "PRODUCER_ACKS": "producer acks (fixed: all)",
    "BROKER_COMMIT_INTERVAL": "the offset commit interval (fixed: 1 s)",
    "APP_WEB_ENABLED": "Faust's web server (fixed: off)",
    "PROCESSING_GUARANTEE": "the processing guarantee (fixed: at-least-once)",
    "APP_ENV_PREFIX": "the names of Faust's environment variables",
}


def check_faust_environment(environ: Mapping[str, str]) -> None:
    """Refuse to start a worker when a Faust environment variable would override a setting.

    Refusing (rather than removing the variable) keeps the deployment's environment honest: the
    operator learns which variable to drop. Faust variables that override nothing trajstream
    sets (e.g. ``BROKER_SESSION_TIMEOUT``) are left to Faust.
    """
    found = [name for name in FAUST_ENV_OVERRIDES if environ.get(name) is not None]
    if found:
        details = "; ".join(f"{name} would override {FAUST_ENV_OVERRIDES[name]}" for name in found)
        raise ConfigError(
            f"Faust environment variable set: {details}. Unset it and use the trajstream "
            "setting (TRAJSTREAM_..., see `trajstream settings`)"
        )
