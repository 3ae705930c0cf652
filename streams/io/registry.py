"""The schema registry edge: register the writers' schemas at start, check compatibility, look
up a reader's unknown schema ids.

Any registry that serves Confluent's REST API: Confluent Schema Registry, Karapace, Apicurio
Registry's ``/apis/ccompat/v7``. Subjects follow the topic name strategy, one subject per
topic's values (``<topic>-value``), which every Kafka tool looks up by default. A topic that
carries several record types (``<p>.agent-events``: AgentCall and Completion; ``<p>.ledger``;
``<p>.replayed``) registers a union of them in the order of
:meth:`streams.topics.Topics.value_types` (Confluent's advice for several event types in one
topic): one schema per topic, so a sink sees one schema and does not roll a file per record.

At start, :func:`connect` does, for every topic the process writes:

1. the subject's compatibility level (``GET /config/<subject>?defaultToGlobal=true``; the
   global level for a subject that does not exist yet) must be BACKWARD, BACKWARD_TRANSITIVE,
   FULL or FULL_TRANSITIVE, so that readers of older records keep reading them; anything else
   is refused with :class:`~streams.errors.SchemaRefused` naming the subject and how to set it;
2. the schema is registered (``POST /subjects/<subject>/versions``; the same schema again gets
   its id back); a schema the registry refuses as incompatible is refused at start with the
   registry's own message (and its compatibility check's messages when it gives them).

The ids found make the process's :class:`streams.wire.TopicFraming`, and the codec gets the
registry's ``GET /schemas/ids/<id>`` as its lookup for ids it has not seen (records of another
version's writers), cached: ids are immutable.

Why httpx and not a registry client library: ``python-schema-registry-client`` pins
``httpx<0.29``, pulls jsonschema and anyio, its faust extra needs faust-streaming < 0.12 (this
project runs 0.15.3), and its schema wrapper takes a schema to be a record (a topic's union is
a list); confluent-kafka's ``AsyncSchemaRegistryClient`` is async and complete but ships
librdkafka (a second Kafka client, unused) and its bearer auth requires Confluent Cloud's
logical-cluster header. Four endpoints are needed, with this project's TLS and secret
handling; they are here. The lookup is synchronous (the codec decodes synchronously): it runs
once per unknown id, with ``timeout_s``.

May import: httpx, :mod:`streams.codec`, the top-level modules (errors, settings, topics, wire).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ..codec import SchemaRegistry
from ..errors import SchemaRefused, SchemaRegistryError
from ..settings import SchemaRegistrySettings
from ..topics import Topics
from ..wire import TopicFraming, confluent_prefix
from .kafka import use_framing

__all__ = [
    "ACCEPTED_LEVELS",
    "Registered",
    "RegistryClient",
    "aconnect",
    "connect",
    "subject_of",
]

log = logging.getLogger(__name__)

ACCEPTED_LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def subject_of(topic: str) -> str:
    """The subject of a topic's values (the topic name strategy)."""
    return f"{topic}-value"


class RegistryClient:
    """The few calls of Confluent's schema registry API that trajstream makes.

    ``transport`` replaces the network (``httpx.MockTransport`` in unit tests).
    """

    def __init__(
        self, settings: SchemaRegistrySettings, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.settings = settings
        self.url = settings.url
        headers = {"Accept": CONTENT_TYPE}
        auth: httpx.Auth | None = None
        if settings.username is not None and settings.password is not None:
            auth = httpx.BasicAuth(settings.username, settings.password.get_secret_value())
        if settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {settings.bearer_token.get_secret_value()}"
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            auth=auth,
            timeout=httpx.Timeout(settings.timeout_s),
            verify=_verify(settings),
            transport=transport,
        )
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    # -- the calls ---------------------------------------------------------------------------

    def compatibility(self, subject: str) -> str:
        """The subject's compatibility level; the global one while the subject is new."""
        status, body = self._call(
            "GET", f"/config/{_q(subject)}", params={"defaultToGlobal": "true"}
        )
        if status == 404:
            status, body = self._call("GET", "/config")
        if status != 200:
            raise self._error(f"reading the compatibility level of {subject}", status, body)
        level = body.get("compatibilityLevel") or body.get("compatibility")
        if not isinstance(level, str):
            raise SchemaRegistryError(
                f"schema registry at {self.url}: no compatibility level for {subject} in {body}"
            )
        return level

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (idempotent); its id. An incompatible schema
        raises :class:`SchemaRefused` with the registry's message."""
        status, body = self._call(
            "POST",
            f"/subjects/{_q(subject)}/versions",
            json_body={"schema": schema, "schemaType": "AVRO"},
        )
        if status == 409:
            details = self._incompatibility(subject, schema)
            message = _message(body)
            raise SchemaRefused(
                f"the schema registry at {self.url} refused the schema of subject {subject} as "
                f"incompatible with its latest version: {message}"
                + (f" ({'; '.join(details)})" if details else "")
                + ". Evolve the schema compatibly (new fields optional, with defaults), or "
                "register it under a new topic prefix"
            )
        if status not in (200, 201) or not isinstance(body.get("id"), int):
            raise self._error(f"registering the schema of {subject}", status, body)
        schema_id = int(body["id"])
        with self._lock:
            self._schemas.setdefault(schema_id, schema)
        return schema_id

    def _incompatibility(self, subject: str, schema: str) -> list[str]:
        try:
            status, body = self._call(
                "POST",
                f"/compatibility/subjects/{_q(subject)}/versions/latest",
                params={"verbose": "true"},
                json_body={"schema": schema, "schemaType": "AVRO"},
            )
        except SchemaRegistryError:
            return []
        messages = body.get("messages") if status == 200 else None
        return [str(m) for m in messages] if isinstance(messages, list) else []

    def schema_text(self, schema_id: int) -> str:
        """The schema registered under ``schema_id`` (cached: ids never change)."""
        with self._lock:
            known = self._schemas.get(schema_id)
        if known is not None:
            return known
        status, body = self._call("GET", f"/schemas/ids/{schema_id}")
        if status != 200 or not isinstance(body.get("schema"), str):
            raise self._error(f"looking up schema id {schema_id}", status, body)
        if body.get("schemaType", "AVRO") != "AVRO":
            raise SchemaRegistryError(f"schema id {schema_id} is a {body['schemaType']} schema")
        text = str(body["schema"])
        with self._lock:
            self._schemas[schema_id] = text
        return text

    # -- plumbing ----------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json_body: Any = None,
    ) -> tuple[int, dict[str, Any]]:
        try:
            response = self._http.request(
                method,
                self.url + path,
                params=params,
                content=None if json_body is None else json.dumps(json_body).encode(),
                headers={"Content-Type": CONTENT_TYPE} if json_body is not None else None,
            )
        except httpx.HTTPError as exc:
            raise SchemaRegistryError(
                f"the schema registry at {self.url} (kafka.schema_registry.url) did not answer: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = {"message": response.text[:500]}
        return response.status_code, body if isinstance(body, dict) else {"body": body}

    def _error(self, what: str, status: int, body: dict[str, Any]) -> SchemaRegistryError:
        hint = ""
        if status in (401, 403):
            hint = (
                ": check kafka.schema_registry.username/password "
                "[TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__PASSWORD] or bearer_token"
            )
        return SchemaRegistryError(
            f"schema registry at {self.url}: {what} failed with HTTP {status}: {_message(body)}"
            + hint
        )


@dataclass
class Registered:
    """What :func:`connect` set up: the client, the subjects' ids, the writers' framing."""

    client: RegistryClient
    ids: dict[str, int]  # subject -> schema id
    framing: TopicFraming | None  # None: kafka.schema_registry.framing = "single-object"

    def close(self) -> None:
        self.client.close()


def connect(
    settings: SchemaRegistrySettings | None,
    *,
    topics: Topics,
    writes: Iterable[str] = (),
    codec: SchemaRegistry | None = None,
    transport: httpx.BaseTransport | None = None,
    install: bool = False,
) -> Registered | None:
    """Check and register the subjects of the topics ``writes`` names, and let ``codec`` (the
    process's default) read the wire format through the registry. None without a registry
    (``kafka.schema_registry`` unset): behaviour as before, single-object encoding only.

    ``install`` (what a command's process does, not a library): every producer that
    :func:`streams.io.kafka.producer` builds in this process from now on writes the wire
    format; otherwise the caller applies :attr:`Registered.framing` itself (as the SDK does)."""
    if settings is None:
        return None
    codec = codec or SchemaRegistry.default()
    client = RegistryClient(settings, transport)
    types = topics.value_types()
    ids: dict[str, int] = {}
    prefixes: dict[str, dict[bytes, bytes]] = {}
    try:
        for topic in dict.fromkeys(writes):
            names = types[topic]
            subject = subject_of(topic)
            level = client.compatibility(subject)
            if level.upper() not in ACCEPTED_LEVELS:
                raise SchemaRefused(
                    f"schema registry subject {subject}: compatibility level {level}, but "
                    f"trajstream needs BACKWARD or stricter ({', '.join(ACCEPTED_LEVELS)}) so "
                    "that readers of older records keep reading them; set it with "
                    f"PUT {settings.url}/config/{subject} "
                    '{"compatibility": "BACKWARD"} (or the registry\'s global level)'
                )
            schema_id = client.register(subject, codec.registration_schema(names))
            ids[subject] = schema_id
            union = len(names) > 1
            prefixes[topic] = {
                codec.fingerprint_of_name(name): confluent_prefix(
                    schema_id, index if union else None
                )
                for index, name in enumerate(names)
            }
    except BaseException:
        client.close()
        raise
    codec.use_schema_lookup(client.schema_text)
    if ids:
        log.info(
            "schema registry %s: %s",
            settings.url,
            ", ".join(f"{subject} id {i}" for subject, i in ids.items()),
        )
    framing = TopicFraming(prefixes) if settings.framing == "confluent" else None
    if install:
        use_framing(framing)  # every producer this process builds from now on
    return Registered(client, ids, framing)


async def aconnect(
    settings: SchemaRegistrySettings | None,
    *,
    topics: Topics,
    writes: Iterable[str] = (),
    codec: SchemaRegistry | None = None,
) -> Registered | None:
    """:func:`connect` from async code (its HTTP calls run in a thread)."""
    if settings is None:
        return None
    return await asyncio.to_thread(
        connect, settings, topics=topics, writes=list(writes), codec=codec
    )


def _verify(settings: SchemaRegistrySettings) -> ssl.SSLContext | bool:
    if not settings.url.startswith("https://"):
        return True
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None
        )
        if settings.ssl_certfile is not None:
            context.load_cert_chain(
                str(settings.ssl_certfile),
                str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
                settings.ssl_key_password.get_secret_value()
                if settings.ssl_key_password
                else None,
            )
    except (OSError, ssl.SSLError) as exc:
        raise SchemaRegistryError(
            f"the TLS files of kafka.schema_registry cannot be used: {exc}"
        ) from exc
    return context


def _q(subject: str) -> str:
    return quote(subject, safe="")


def _message(body: dict[str, Any]) -> str:
    message = body.get("message") or body.get("error") or body
    return str(message)[:1000]
