"""The Kafka sections: the cluster, its security, the schema registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
)

from .sections import PositiveFloat, PositiveInt, Section, secret_value

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSecuritySettings(Section):
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
    username: str | None = Field(
        default=None, validate_default=True, description="SASL user (SASL_* protocols)"
    )
    password: SecretStr | None = Field(
        default=None, validate_default=True, description="SASL password (secret)"
    )
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
    ssl_check_hostname: bool = Field(
        default=True,
        description="check the broker certificate's host name (the chain is verified either way)",
    )

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
        if protocol.startswith("SASL_") and (v is None or not secret_value(v)):
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


Compatibility = Literal[
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
]


class SchemaRegistrySettings(Section):
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


class KafkaSettings(Section):
    bootstrap_servers: str | None = Field(
        default=None,
        description=(
            "host:port[,host:port]; unset: the local broker started by `trajstream broker start`"
        ),
    )
    topic_prefix: str = Field(
        default="trajstream",
        pattern=r"^[A-Za-z0-9._-]+$",
        description="prefix of every topic (<p> in the topic names)",
    )
    partitions: PositiveInt = Field(default=4, description="partitions of the keyed topics")
    replication_factor: PositiveInt = Field(
        default=1, description="replication factor of the topics trajstream creates"
    )
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
