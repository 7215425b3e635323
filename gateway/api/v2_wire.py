"""The Confluent REST Proxy v2 wire format (docs/rest-v2.md): media types, produce requests and
answers, consumer-instance requests, records out, and the v2 error body.

Only this module and ``api/v2.py`` know the v2 names (``error_code``, ``instance_id``,
``base_uri``, the ``vnd.kafka`` media types). Statuses and error codes follow kafka-rest's
``Errors.java`` (docs/design/rest-v2-clients.md, section 7).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, NamedTuple

import orjson
from starlette.responses import Response

from ..broker import QUEUE_ID, BrokerUnavailable, OutgoingMessage, ProduceError, QueueInfo
from ..core.errors import TooLarge, invalid
from ..core.fetch import Fetched
from ..core.instances import Format, Instance
from ..core.produce import Produced
from ..core.schemas import Decoded, SchemaSpec, schema_spec
from ..core.topics import Topic
from .errors import ApiError
from .http import JSON
from .numbers import json_int
from .produce_wire import partition_number

#: The v2 media type of answers, and of requests that carry no records.
V2 = "application/vnd.kafka.v2+json"
_EMBEDDED = ("binary", "json", "avro", "jsonschema", "protobuf")
_SCHEMA_FIELDS = {"key_schema", "key_schema_id", "value_schema", "value_schema_id"}
_RECORD_FIELDS = {"key", "value", "partition"}
#: Fields of ``POST /consumers/{group}`` (Confluent's, the Strimzi bridge's
#: ``enable.auto.commit``, and ``max.poll.records``).
_CREATE_FIELDS = {"name", "id", "format", "auto.offset.reset", "auto.commit.enable",
                  "enable.auto.commit", "fetch.min.bytes", "responseMinBytes",
                  "consumer.request.timeout.ms", "requestWaitMs", "max.poll.records"}
_RESETS = {"earliest": "earliest", "smallest": "earliest", "latest": "latest",
           "largest": "latest"}


class V2JSON(JSON):
    media_type = V2


def media_types(header: str | None) -> list[str]:
    """The media types of a Content-Type or Accept header, parameters dropped, lower case."""
    return [t.split(";", 1)[0].strip().lower() for t in (header or "").split(",") if t.strip()]


def embedded(media: str) -> str | None:
    """``json`` of ``application/vnd.kafka.json.v2+json``; None for another type."""
    if media.startswith("application/vnd.kafka.") and media.endswith(".v2+json"):
        fmt = media[len("application/vnd.kafka."):-len(".v2+json")]
        return fmt if fmt in _EMBEDDED else None
    return None


def produce_format(content_type: str | None, registry: bool) -> Format:
    """The embedded format of a produce request: ``json``, ``binary``, or (with a schema
    ``registry``) ``avro``, ``protobuf``, ``jsonschema``; else ``415``."""
    types = media_types(content_type)
    fmt = embedded(types[0]) if types else None
    if fmt is not None and (registry or fmt in ("json", "binary")):
        return Format(fmt)
    hint = f"{fmt!r} needs a schema registry, which this gateway has not (set " \
        "schema_registry_url: MQGW_SCHEMA_REGISTRY_URL)" if fmt else \
        "produce takes application/vnd.kafka.{json,binary,avro,protobuf,jsonschema}.v2+json"
    raise ApiError(415, "unsupported_media_type", f"Content-Type {types[0] if types else 'none'}: "
                   f"{hint}")


def check_request_type(content_type: str | None) -> None:
    """A consumer request's Content-Type: any v2 type (an embedded one too, as Confluent takes
    them), ``application/json``, or none; else ``415``."""
    types = media_types(content_type)
    if types and types[0] not in (V2, "application/json") and embedded(types[0]) is None:
        raise ApiError(415, "unsupported_media_type", f"Content-Type {types[0]}: send "
                       f"{V2} (or application/json)")


def records_format(accept: str | None) -> Format | None:
    """The format an ``Accept`` header reads records in: ``binary`` for the binary type or
    plain v2 (as Confluent), the embedded format of another v2 type, None for anything
    (``*/*``, JSON, none: the instance's own)."""
    for media in media_types(accept):
        if media == V2:
            return Format.BINARY
        fmt = embedded(media)
        if fmt is not None:
            return Format(fmt)
    return None


def records_type(fmt: Format) -> str:
    return f"application/vnd.kafka.{fmt.value}.v2+json"


# -- produce -----------------------------------------------------------------------------------
def parse_produce(body: Any, fmt: Format, queue: str | None,
                  max_batch: int) -> list[OutgoingMessage]:
    """``{"records": [{"key", "value", "partition"}], <schema fields>}`` of a ``binary`` or
    ``json`` produce as broker messages; ``queue``: the path's partition, which a record's own
    ``partition`` overrides."""
    return [OutgoingMessage(_payload(r.get("value"), fmt, i, "value"),
                            _payload(r.get("key"), fmt, i, "key"), queue=q)
            for i, (r, q) in enumerate(_records(body, queue, max_batch))]


def parse_schema_produce(body: Any, queue: str | None, max_batch: int,
                         ) -> tuple[SchemaSpec | None, SchemaSpec | None, list[RawRecord]]:
    """An ``avro``, ``protobuf`` or ``jsonschema`` produce: the key's and the value's schema
    (``*_schema``: its text; ``*_schema_id``: a registered id), and the records' JSON keys,
    values and queues, to be encoded with them (core/schemas.py)."""
    records = _records(body, queue, max_batch)
    return (_schema_spec(body, "key"), _schema_spec(body, "value"),
            [RawRecord(r.get("key"), r.get("value"), q) for r, q in records])


class RawRecord(NamedTuple):
    key: Any
    value: Any
    queue: str | None


def _schema_spec(body: dict[str, Any], side: str) -> SchemaSpec | None:
    return schema_spec(body.get(f"{side}_schema"), body.get(f"{side}_schema_id"),
                       f"{side}_schema", f"{side}_schema_id")


def _records(body: Any, queue: str | None, max_batch: int) -> list[tuple[dict[str, Any], str | None]]:
    """The records of a produce body, each with the queue it names (or the path's)."""
    if not isinstance(body, dict):
        raise invalid("invalid_body", "request body must be a JSON object")
    extra = set(body) - {"records"} - _SCHEMA_FIELDS
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    records = body.get("records")
    if not isinstance(records, list) or not records:
        raise invalid("invalid_records", "records must be a non-empty array")
    if len(records) > max_batch:
        raise TooLarge("too_many_messages", f"at most {max_batch} records per request",
                       limit=max_batch)
    out = []
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise invalid("invalid_message", f"records[{i}] must be an object", index=i)
        extra = set(r) - _RECORD_FIELDS
        if extra:
            raise invalid("unknown_field", f"records[{i}]: unknown field(s): "
                          f"{', '.join(sorted(extra))}", index=i)
        p = r.get("partition")
        out.append((r, partition_param(p, f"records[{i}].partition") if p is not None else queue))
    return out


def partition_param(p: Any, where: str = "partition") -> str:
    """A partition as a queue id: a number (Kafka), or a queue id string (RocketMQ's)."""
    n = json_int(p) if not isinstance(p, str) else (int(p) if p.isdigit() else None)
    if n is not None:
        if not partition_number(n):
            raise invalid("invalid_partition", f"{where} must be an integer >= 0")
        return str(n)
    if isinstance(p, str) and QUEUE_ID.fullmatch(p):
        return p
    raise invalid("invalid_partition", f"{where} must be a partition number (or a queue id)")


def _payload(v: Any, fmt: Format, i: int, name: str) -> bytes | None:
    if v is None:
        return None
    if fmt is Format.JSON:  # any JSON value, stored as its JSON text
        return orjson.dumps(v)
    if not isinstance(v, str):
        raise invalid("invalid_base64", f"records[{i}].{name} must be a base64 string or null",
                      index=i)
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise invalid("invalid_base64", f"records[{i}].{name} is not valid base64",
                      index=i) from None


#: The v2 ``error_code`` of a record the broker did not take (kafka-rest: 50002 for a
#: non-retriable Kafka error, 50003 for a retriable one).
_PRODUCE_ERRORS = {ProduceError.UNKNOWN_TOPIC: 40401, ProduceError.UNKNOWN_PARTITION: 40402}


def produced_body(p: Produced, key_schema_id: int | None = None,
                  value_schema_id: int | None = None) -> dict[str, Any]:
    offsets: list[dict[str, Any]] = []
    for r in p.results:
        if r.error_code:
            code = _PRODUCE_ERRORS.get(r.error_code, 50002 if r.error_code.permanent else 50003)
            offsets.append({"partition": None, "offset": None, "error_code": code,
                            "error": r.error or r.error_code.value})
        else:
            offsets.append({"partition": partition_json(r.queue), "offset": r.offset,
                            "error_code": None, "error": None})
    return {"key_schema_id": key_schema_id, "value_schema_id": value_schema_id,
            "offsets": offsets}


def partition_json(queue: str) -> int | str:
    """A queue id as a v2 ``partition``: a number on Kafka, RocketMQ's queue id as it is."""
    return int(queue) if queue.isdigit() else queue


# -- topics ------------------------------------------------------------------------------------
def partition_body(q: QueueInfo) -> dict[str, Any]:
    return {"partition": partition_json(q.queue), "leader": q.leader,
            "replicas": [{"broker": b, "leader": b == q.leader, "in_sync": b in q.in_sync}
                         for b in q.replicas]}


def topic_body(t: Topic) -> dict[str, Any]:
    return {"name": t.name, "configs": {}, "partitions": [partition_body(q) for q in t.queues]}


def find_partition(t: Topic, queue: str) -> QueueInfo:
    for q in t.queues:
        if q.queue == queue:
            return q
    raise ApiError(404, "unknown_partition", f"topic {t.name!r} has no partition {queue}")


def offsets_body(q: QueueInfo) -> dict[str, Any]:
    return {"beginning_offset": q.low, "end_offset": q.high}


# -- consumer instances --------------------------------------------------------------------------
def create_request(body: dict[str, Any]) -> dict[str, Any]:
    """``POST /consumers/{group}``'s body as :meth:`InstanceService.create`'s arguments."""
    extra = set(body) - _CREATE_FIELDS
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))} (this "
                      f"gateway takes {', '.join(sorted(_CREATE_FIELDS))})")
    name = body.get("id") or body.get("name")  # ``id``, the older name, wins as in Confluent
    fmt = body.get("format", "binary")
    if not isinstance(fmt, str) or fmt.lower() not in _EMBEDDED:
        raise invalid("invalid_format", f"format {fmt!r}: one of {', '.join(_EMBEDDED)}")
    reset = body.get("auto.offset.reset")
    if reset is not None and (not isinstance(reset, str) or reset.lower() not in _RESETS):
        raise invalid("invalid_consumer_config", "auto.offset.reset must be earliest or latest")
    commit = body.get("auto.commit.enable", body.get("enable.auto.commit", "true"))  # Strimzi's name
    if isinstance(commit, str):
        commit = commit.lower()
    if commit not in ("true", "false", True, False):
        raise invalid("invalid_consumer_config", "auto.commit.enable must be true or false")
    min_bytes = _int_field(body, "fetch.min.bytes", "responseMinBytes", -1, 10_000_000)
    del min_bytes  # taken and checked for compatibility; a fetch answers what is there
    return {"name": name, "fmt": Format(fmt.lower()),
            "reset": _RESETS[reset.lower()] if isinstance(reset, str) else "",
            "auto_commit": commit in ("true", True),
            "wait_ms": _int_field(body, "consumer.request.timeout.ms", "requestWaitMs", 0,
                                  2**31 - 1),
            "max_records": _int_field(body, "max.poll.records", "", 1, 2**31 - 1)}


def _int_field(body: dict[str, Any], name: str, alias: str, lo: int, hi: int) -> int | None:
    v = body.get(name, body.get(alias) if alias else None)
    if v is None:
        return None
    n = json_int(v) if not isinstance(v, str) else (int(v) if v.lstrip("-").isdigit() else None)
    if n is None or not lo <= n <= hi:
        raise invalid("invalid_consumer_config", f"{name} must be an integer from {lo} to {hi}")
    return n


def created_body(inst: Instance, base_url: str) -> dict[str, Any]:
    return {"instance_id": inst.name,
            "base_uri": f"{base_url.rstrip('/')}/consumers/{inst.consumer}/instances/{inst.name}"}


def topics_request(body: dict[str, Any]) -> list[Any]:
    if "topic_pattern" in body:
        raise invalid("topic_pattern_unsupported", "subscribe by a list of topics ('topics'); "
                      "this gateway has no pattern subscriptions")
    extra = set(body) - {"topics"}
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    topics = body.get("topics")
    if not isinstance(topics, list):
        raise invalid("invalid_topics", "topics must be an array of topic names")
    return topics


def offsets_request(body: dict[str, Any], field: str) -> list[tuple[str, str, int]] | None:
    """``{"offsets": [{"topic", "partition", "offset", "metadata"?}]}`` (``field`` offsets), or
    ``{"partitions": [{"topic", "partition"}]}`` (offset -1); None for an empty body."""
    if not body:
        return None
    items = body.get(field)
    if not isinstance(items, list) or set(body) - {field}:
        raise invalid(f"invalid_{field}", f"give {{\"{field}\": [...]}}")
    out: list[tuple[str, str, int]] = []
    for i, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("topic"), str):
            raise invalid(f"invalid_{field}", f"{field}[{i}] must be an object with a topic")
        offset = -1
        if field == "offsets":
            offset = json_int(it.get("offset")) if it.get("offset") is not None else None  # type: ignore[assignment]
            if offset is None or offset < 0:
                raise invalid("invalid_offsets", f"offsets[{i}].offset must be an integer >= 0")
        out.append((it["topic"], partition_param(it.get("partition"),
                                                 f"{field}[{i}].partition"), offset))
    return out


def committed_body(rows: list[tuple[str, str, int]]) -> dict[str, Any]:
    return {"offsets": [{"topic": t, "partition": partition_json(q), "offset": o, "metadata": ""}
                        for t, q, o in rows]}


def records_body(f: Fetched, fmt: Format, decoded: list[Decoded] | None = None) -> bytes:
    """The records of a fetch as v2 JSON: binary ones base64, json ones the JSON they hold,
    those of a Schema Registry format as ``decoded`` (core/instances.py)."""
    b = f.batch
    if b is None:
        return b"[]"
    part = partition_json(b.queue)
    out = []
    for i, r in enumerate(b.records):
        if decoded is not None:
            (_, key), (_, value) = decoded[i]
        else:
            key, value = _out(r.key, fmt, f, part, r.offset), _out(r.value, fmt, f, part, r.offset)
        out.append({"topic": f.topic, "key": key, "value": value, "partition": part,
                    "offset": r.offset})
    return orjson.dumps(out)


def _out(v: bytes | None, fmt: Format, f: Fetched, part: Any, offset: int) -> Any:
    if v is None:
        return None
    if fmt is Format.BINARY:
        return base64.b64encode(v).decode()
    try:
        return orjson.loads(v)
    except orjson.JSONDecodeError:
        raise invalid("json_conversion", f"the record at {f.topic} partition {part} offset "
                      f"{offset} is not JSON: read this consumer's records as binary (format: "
                      "binary)") from None


# -- errors --------------------------------------------------------------------------------------
#: The v2 ``error_code`` (and the status, where kafka-rest's differs) of a gateway error code.
_CODES: dict[str, tuple[int, int]] = {
    "unknown_topic": (404, 40401), "unknown_partition": (404, 40402),
    "unknown_queue": (404, 40402), "unknown_instance": (404, 40403),
    "instance_exists": (409, 40902), "not_subscribed": (409, 40903),
    "assignments_unsupported": (409, 40903), "commit_failed": (409, 40903),
    "sharded_consumer": (409, 40903),
    "format_mismatch": (406, 40601), "json_conversion": (422, 42203),
    "invalid_consumer_config": (422, 42204), "invalid_format": (422, 42204),
    "invalid_json": (400, 400), "rate_limited": (429, 42901),
    # the Schema Registry formats (kafka-rest's key and value schema missing, invalid schema;
    # an incompatible schema keeps the registry's own 409)
    "key_schema_missing": (422, 42201), "value_schema_missing": (422, 42202),
    "invalid_schema": (422, 42205), "unknown_schema": (422, 42205),
    "schema_kind_mismatch": (422, 42205), "incompatible_schema": (409, 409),
}
_BY_STATUS = {400: (422, 422), 401: (401, 40101), 403: (403, 40301), 429: (429, 42901),
              500: (500, 50002)}


def error_response(gateway: Response, exc: BaseException) -> Response:
    """The gateway's own error answer (api/errors.py) in the v2 shape: ``{"error_code",
    "message"}``, plus ``code``, the gateway's machine-readable code (clients of the v2 API
    ignore fields they do not know). Invalid input is a ``422`` as in kafka-rest."""
    err = orjson.loads(bytes(gateway.body)).get("error", {})
    code = err.get("code", "http_error")
    status, error_code = _CODES.get(code) or _BY_STATUS.get(gateway.status_code) or (
        gateway.status_code, gateway.status_code)
    if gateway.status_code == 503:
        status, error_code = 503, 50302 if isinstance(exc, BrokerUnavailable) else 50301
    headers = {k: v for k, v in gateway.headers.items()
               if k.lower() not in ("content-type", "content-length")}
    return V2JSON({"error_code": error_code, "message": err.get("message", ""), "code": code},
                  status_code=status, headers=headers)
