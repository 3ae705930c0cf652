"""The exception tree of trajstream.

Every error the package raises on purpose derives from :class:`TrajstreamError`, so a
caller can catch one class. Library errors are wrapped with ``raise ... from exc``.
Whether an operation may be retried is data on the class (``retriable``)::

    TrajstreamError
    ├── ConfigError            a setting is missing or invalid (names the setting)
    ├── RecordError            a record cannot be decoded or validated (goes to dead letters)
    │   ├── DecodeError        bytes are not a known Avro single-object record
    │   ├── ValidationError    decoded, but violates the model's rules
    │   └── JudgeAnswerError   the judge's answer holds no usable score
    ├── RewardError            a reward function raised or returned a non-finite value
    ├── ServiceError           an HTTP service answered with an error (status, body)
    │   ├── TrinityError       the training backend
    │   │   ├── TrinityRejected    4xx: the request itself is wrong, never retried
    │   │   ├── TrinityUnavailable 5xx, 408, 429, timeout, connection error: retried
    │   │   └── TrinityGaveUp      unavailable for longer than the retry policy allows
    │   └── JudgeError         the LLM judge's endpoint
    │       ├── JudgeRejected      4xx: never retried
    │       ├── JudgeUnavailable   5xx, 408, 429, timeout, connection error: retried
    │       └── JudgeGaveUp        unavailable for longer than the retry policy allows
    ├── GatewayError           the gateway answers a request with an error (``status``)
    │   ├── BadRequest         a request it refuses (4xx in OpenAI's shape), recorded nowhere
    │   ├── ApiRequestError    not a valid Responses / Messages request (400, naming ``param``)
    │   ├── ApiRefused         a request answered with an error body of its own API
    │   └── UpstreamFailed     the upstream model timed out (504) or the connection failed (502)
    ├── ReplayError            a replay cannot run or finish (an empty range, Trinity gone)
    ├── ExportError            an export could not be written
    ├── HandoverPatchError     the faust-streaming hand-over patch does not fit the installed one
    ├── BrokerError            the local Kafka broker could not be fetched, started or reached
    ├── ProduceError           an input file has invalid lines, or publishing failed
    └── SchemaRegistryError    the schema registry could not be reached or refused a request
        └── SchemaRefused      a schema or a subject's compatibility level refused at start

May import: the standard library only.
"""

from __future__ import annotations

__all__ = [
    "ApiRefused",
    "ApiRequestError",
    "BadRequest",
    "BrokerError",
    "ConfigError",
    "DecodeError",
    "ExportError",
    "GatewayError",
    "HandoverPatchError",
    "JudgeAnswerError",
    "JudgeError",
    "JudgeGaveUp",
    "JudgeRejected",
    "JudgeUnavailable",
    "ProduceError",
    "RecordError",
    "ReplayError",
    "RewardError",
    "SchemaRefused",
    "SchemaRegistryError",
    "ServiceError",
    "ServiceGaveUp",
    "TrajstreamError",
    "TrinityError",
    "TrinityGaveUp",
    "TrinityRejected",
    "TrinityUnavailable",
    "UpstreamFailed",
    "ValidationError",
]


class TrajstreamError(Exception):
    """Root of every error raised by trajstream."""

    retriable: bool = False


class ConfigError(TrajstreamError):
    """A setting is missing or invalid; the message names the setting."""


class RecordError(TrajstreamError):
    """A record cannot be used; it goes to the dead-letter topic with this reason."""


class DecodeError(RecordError):
    """The bytes are not a record of any known schema."""


class ValidationError(RecordError):
    """The record decoded, but its content breaks the model's rules."""


class RewardError(TrajstreamError):
    """A reward function raised, or returned NaN or infinity."""


class JudgeAnswerError(RecordError):
    """The judge answered, but its answer holds no usable score (a verdict without one)."""


class ServiceError(TrajstreamError):
    """An HTTP service (Trinity, the LLM judge) answered with an error, or could not be
    reached: ``status`` and ``body`` of its answer, when there was one. ``retriable`` says
    whether the same request may succeed later (:func:`streams.io.retrying.retrying`)."""

    def __init__(self, message: str, *, status: int | None = None, body: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = body


class ServiceGaveUp(ServiceError):
    """A service stayed unavailable for longer than the retry policy allows; ``attempts``
    made, ``body`` of the last answer."""

    def __init__(self, reason: str, attempts: int, *, body: str | None = None) -> None:
        super().__init__(reason, body=body)
        self.attempts = attempts


class TrinityError(ServiceError):
    """The training backend answered with an error."""


class TrinityRejected(TrinityError):
    """Trinity rejected the request (4xx). Retrying the same request cannot help."""


class TrinityUnavailable(TrinityError):
    """Trinity failed or could not be reached (5xx, timeout, connection). Retry later."""

    retriable = True


class TrinityGaveUp(ServiceGaveUp, TrinityError):
    """Trinity stayed unavailable for longer than the retry policy allows."""


class JudgeError(ServiceError):
    """The LLM judge's endpoint answered with an error."""


class JudgeRejected(JudgeError):
    """The judge's endpoint rejected the request (4xx). Retrying the same request cannot help."""


class JudgeUnavailable(JudgeError):
    """The judge failed or could not be reached (5xx, 408, 429, timeout, connection)."""

    retriable = True


class JudgeGaveUp(ServiceGaveUp, JudgeError):
    """The judge stayed unavailable for longer than the retry policy allows."""


class GatewayError(TrajstreamError):
    """The gateway answers a request with an error: ``status`` is the HTTP status it sends."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class BadRequest(GatewayError):
    """A request the gateway refuses (4xx, OpenAI's error shape, naming ``param``); nothing
    of it is recorded."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message, status=status)
        self.param = param


class ApiRequestError(GatewayError):
    """A request body that is not a valid request of its API, Responses or Messages (answered
    400, naming ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, status=400)
        self.param = param


class ApiRefused(GatewayError):
    """A Responses or Messages request answered with ``body``, an error in that API's own
    shape, and recorded nowhere."""

    def __init__(self, status: int, body: dict[str, object]) -> None:
        super().__init__(str(body), status=status)
        self.body = body


class UpstreamFailed(GatewayError):
    """The upstream model (Trinity or production) did not answer in time (504) or failed on
    the connection (502); ``type_`` is the error type the client is told."""

    def __init__(self, status: int, message: str, type_: str) -> None:
        super().__init__(message, status=status)
        self.type_ = type_


class ReplayError(TrajstreamError):
    """A replay cannot run or finish (an empty range, Trinity gone for too long)."""


class ExportError(TrajstreamError):
    """An export could not be written (the target is not a writable directory)."""


class HandoverPatchError(TrajstreamError):
    """The hand-over patch of faust-streaming does not fit the installed faust-streaming."""


class BrokerError(TrajstreamError):
    """The local Kafka broker could not be fetched, started, reached or stopped."""


class ProduceError(TrajstreamError):
    """Events could not be published (invalid input lines, or the broker refused)."""


class SchemaRegistryError(TrajstreamError):
    """The schema registry (``kafka.schema_registry``) could not be reached, or answered with
    an error."""


class SchemaRefused(SchemaRegistryError, ConfigError):
    """A schema the writers need cannot be used: the registry refused it as incompatible, or
    a subject's compatibility level is weaker than BACKWARD (a deployment must fix it before
    starting: a configuration error, exit code 2)."""
