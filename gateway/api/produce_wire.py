"""The JSON wire format of producing: ``POST /produce`` in, its results and ``DELETE
/delayed/{id}``'s answer out.

Values, keys and header values are UTF-8 text by default, or base64 bytes when the message
(or the whole request) says ``"encoding": "base64"``. Only the wire modules (this one,
``consume_wire``, ``admin_wire``, ``registry_wire``) know the camelCase field names.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, NamedTuple

from ..broker import QUEUE_ID, OutgoingMessage
from ..core.delay import Cancelled, Delayed
from ..core.errors import TooLarge, invalid
from ..core.fetch import TAG
from ..core.names import check_name, check_topic
from ..core.produce import Produced
from ..core.schemas import KINDS, SchemaSpec, schema_spec
from ..core.timeparse import MIN_EPOCH_MS, parse_rfc3339
from ..schemas import Kind
from .http import queue_json
from .numbers import json_int

#: Kafka's field widths (int32 partition, int64 timestamp): larger JSON integers are refused here,
#: before any record of the batch is handed to the producer.
MAX_PARTITION = 2**31 - 1
MAX_TIMESTAMP = 2**63 - 1
_DELAY_FIELDS = {"delayMs", "deliverAt"}
_MESSAGE_FIELDS = {"value", "key", "headers", "partition", "queue", "tag", "timestamp",
                   "encoding"} | _DELAY_FIELDS
#: The latest due time accepted: 9999-12-31T23:59:59.999Z. There is no maximum delay short of it
#: (the wheel loops on its top level); anything later is a mistake, not a plan.
MAX_DUE = 253_402_300_799_999
_ENCODINGS = ("utf8", "base64")
#: A request's schema (``"encoding": "avro"``, ``"protobuf"``, ``"jsonschema"``): by text or id.
_SCHEMA_FIELDS = {"keySchema", "keySchemaId", "valueSchema", "valueSchemaId"}


class SchemaProduce(NamedTuple):
    """A produce whose keys and values are JSON values to encode with schemas from the Schema
    Registry (core/schemas.py) before they are sent: the messages carry none yet."""

    kind: Kind
    key: SchemaSpec | None
    value: SchemaSpec | None
    keys: list[Any]
    values: list[Any]
MAX_HEADERS = 64



def partition_number(n: int | None) -> bool:
    """Whether ``n`` is a partition number: Kafka's int32, from 0 (every route's rule)."""
    return n is not None and 0 <= n <= MAX_PARTITION


def parse_produce(body: Any, max_batch: int, now: int) -> tuple[
        str, str, list[OutgoingMessage], list[int | None] | None, SchemaProduce | None]:
    """Returns (topic, producer name or '', messages, due times, schemas): each message's due
    time (unix ms) if it is delayed past ``now``, else None; None for all when none is
    delayed; ``schemas`` for a request whose ``encoding`` is a Schema Registry format."""
    if not isinstance(body, dict):
        raise invalid("invalid_body", "request body must be a JSON object")
    topic = check_topic(body.get("topic"))
    producer = check_name(body.get("producer"), "producer", required=False)
    default_enc = body.get("encoding", "utf8")
    kind = KINDS.get(default_enc) if isinstance(default_enc, str) else None
    if kind is None and default_enc not in _ENCODINGS:
        raise invalid("invalid_encoding", "encoding must be 'utf8' or 'base64' (or, with a "
                      "schema registry, 'avro', 'protobuf', 'jsonschema')")
    schema_fields = _SCHEMA_FIELDS if kind is not None else set()
    if "messages" in body:
        raw = body["messages"]
        if not isinstance(raw, list) or not raw:
            raise invalid("invalid_messages", "messages must be a non-empty array")
        if len(raw) > max_batch:
            raise TooLarge("too_many_messages", f"at most {max_batch} messages per request",
                           limit=max_batch)
        extra = set(body) - {"topic", "producer", "messages", "encoding"} - _DELAY_FIELDS \
            - schema_fields
        default_due = _due(body, now, "")
    else:
        raw = [{k: v for k, v in body.items() if k in _MESSAGE_FIELDS and k != "encoding"}]
        extra = set(body) - _MESSAGE_FIELDS - {"topic", "producer"} - schema_fields
        default_due = None
    if extra:  # before missing_value: of {"vaule": ...} the typo is what to name
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    if "messages" not in body and "value" not in body:
        raise invalid("missing_value", "give 'value' (one message) or 'messages' (a batch)")
    messages = [_message(m, i, default_enc, kind is not None) for i, m in enumerate(raw)]
    dues = [_due(m, now, f"messages[{i}]." if "messages" in body else "", default_due)
            for i, m in enumerate(raw)]
    schemas = None
    if kind is not None:
        schemas = SchemaProduce(
            kind, schema_spec(body.get("keySchema"), body.get("keySchemaId"), "keySchema",
                              "keySchemaId"),
            schema_spec(body.get("valueSchema"), body.get("valueSchemaId"), "valueSchema",
                        "valueSchemaId"),
            [m.get("key") for m in raw], [m.get("value") for m in raw])
    return topic, producer, messages, dues if any(d is not None for d in dues) else None, schemas


def _due(m: dict[str, Any], now: int, where: str, default: int | None = None) -> int | None:
    """The due time ``delayMs`` or ``deliverAt`` asks for (unix ms), None if not delayed (none
    given, 0, or a time already past: written at once)."""
    has_delay, has_at = m.get("delayMs") is not None, m.get("deliverAt") is not None
    if has_delay and has_at:
        raise invalid("conflicting_delay", f"{where}delayMs and {where}deliverAt: give one")
    if has_delay:
        ms = json_int(m["delayMs"])
        if ms is None or ms < 0 or ms > MAX_DUE - now:
            raise invalid("invalid_delay", f"{where}delayMs must be an integer number of "
                              f"milliseconds, 0 or more (due no later than year 9999)")
        return now + ms if ms > 0 else None
    if has_at:
        at = _instant(m["deliverAt"], where)
        return at if at > now else None
    return default


def _instant(v: Any, where: str) -> int:
    """``deliverAt`` as unix ms: an integer (ms since the epoch, not seconds) or an RFC 3339
    date-time (``2026-11-25T20:00:00Z``; the grammar and leap seconds: core/timeparse.py)."""
    if isinstance(v, str):
        try:
            ms = parse_rfc3339(v)
        except ValueError as e:
            raise invalid("invalid_deliver_at", f"{where}deliverAt must be ms since the epoch "
                              f"or an RFC 3339 date-time, e.g. 2026-11-25T20:00:00Z: {e}") from None
    else:
        n = json_int(v)
        if n is None:
            raise invalid("invalid_deliver_at", f"{where}deliverAt must be ms since the epoch "
                              "or an RFC 3339 date-time")
        if 0 <= n < MIN_EPOCH_MS:  # the threshold's reasoning: core/timeparse.py
            in_ms = f" (that time in milliseconds is {n * 1000})" if n * 1000 >= MIN_EPOCH_MS else ""
            raise invalid("deliver_at_in_seconds", f"{where}deliverAt takes milliseconds since "
                              f"the epoch: {n} is below {MIN_EPOCH_MS} (1973-03-03 in ms), so it "
                              f"looks like seconds{in_ms}. To produce at once, leave deliverAt out.",
                              minimum=MIN_EPOCH_MS)
        ms = n
    if not 0 <= ms <= MAX_DUE:
        hint = " (a number this large looks like micro- or nanoseconds)" if ms > MAX_DUE else ""
        raise invalid("invalid_deliver_at", f"{where}deliverAt must be between 1970 and the "
                          f"end of year 9999, in milliseconds{hint}")
    return ms


def _message(m: Any, i: int, default_enc: str, schemas: bool = False) -> OutgoingMessage:
    """A message; with ``schemas`` its key and value are left out (JSON values, encoded later)
    and its headers are UTF-8 text."""
    if not isinstance(m, dict):
        raise invalid("invalid_message", f"messages[{i}] must be an object", index=i)
    extra = set(m) - _MESSAGE_FIELDS
    if extra:
        raise invalid("unknown_field", f"messages[{i}]: unknown field(s): {', '.join(sorted(extra))}",
                          index=i)
    if schemas and "encoding" in m:
        raise invalid("invalid_encoding", f"messages[{i}].encoding: the request's encoding "
                      f"({default_enc}) is every message's", index=i)
    enc = "utf8" if schemas else m.get("encoding", default_enc)
    if enc not in _ENCODINGS:
        raise invalid("invalid_encoding", f"messages[{i}].encoding must be 'utf8' or 'base64'", index=i)
    value = None if schemas else _bytes(m.get("value"), enc, i, "value")
    key = None if schemas else _bytes(m.get("key"), enc, i, "key")
    headers: list[tuple[str, bytes]] = []
    raw_h = m.get("headers")
    if raw_h is not None:
        pairs: Any = raw_h.items() if isinstance(raw_h, dict) else raw_h
        if not isinstance(pairs, (list, type({}.items()))):
            raise invalid("invalid_headers", f"messages[{i}].headers must be an object or "
                              "a list of [name, value] pairs", index=i)
        pair: Any
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)):
                raise invalid("invalid_headers", f"messages[{i}].headers: each header is "
                                  "[name, value] with a string name", index=i)
            hv = _bytes(pair[1], enc, i, f"headers[{pair[0]}]")
            headers.append((pair[0], hv if hv is not None else b""))
        if len(headers) > MAX_HEADERS:
            raise TooLarge("too_many_headers", f"messages[{i}] has more than {MAX_HEADERS} headers",
                           index=i, limit=MAX_HEADERS)
    partition = _optional_int(m, "partition")
    if partition is not None and not partition_number(partition):
        raise invalid("invalid_partition", f"messages[{i}].partition must be an integer >= 0", index=i)
    queue = m.get("queue")
    if queue is not None:
        if partition is not None:
            raise invalid("invalid_queue", f"messages[{i}]: give 'partition' or 'queue', not both",
                          index=i)
        if not isinstance(queue, str) or not QUEUE_ID.fullmatch(queue):
            raise invalid("invalid_queue", f"messages[{i}].queue must be a queue id as /message "
                          "answers it (1-64 characters of letters, digits, '.', '_', '-')", index=i)
    tag = m.get("tag")
    if tag is not None and (not isinstance(tag, str) or not TAG.fullmatch(tag)):
        raise invalid("invalid_tag", f"messages[{i}].tag must be 1-128 characters without '|' or "
                      "control characters", index=i)
    ts = _optional_int(m, "timestamp")
    if ts is not None and not 0 <= ts <= MAX_TIMESTAMP:
        raise invalid("invalid_timestamp", f"messages[{i}].timestamp must be ms since the epoch",
                          index=i)
    return OutgoingMessage(value, key, headers, str(partition) if partition is not None else queue,
                           ts, tag=tag)


def _optional_int(m: dict[str, Any], name: str) -> int | None:
    """An integer field of a record; absent or ``null`` is None ("not given", as for ``key`` and
    ``headers``), a non-integer is refused here (-1 is out of every field's range, so the
    caller's range check names the field)."""
    v = m.get(name)
    if v is None:
        return None
    n = json_int(v)
    return -1 if n is None else n


def _bytes(v: Any, enc: str, i: int, name: str) -> bytes | None:
    if v is None:
        return None
    if not isinstance(v, str):
        kind = name if name in ("value", "key") else "headers"
        raise invalid(f"invalid_{kind}",
                          f"messages[{i}].{name} must be a string or null", index=i)
    if enc == "utf8":
        return v.encode()
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise invalid("invalid_base64", f"messages[{i}].{name} is not valid base64", index=i) from None


def produced_body(p: Produced, delayed: dict[int, Delayed] | None = None,
                  schema_ids: tuple[int | None, int | None] | None = None) -> dict[str, Any]:
    """Per record its ``offset`` and its queue: ``partition``, a number, on Kafka; ``queue``,
    RocketMQ's ``<broker>.<n>``, where the queue id is not a number. A delayed record
    (``delayed``, by index) has its ``delayId`` and ``deliverAt`` instead. ``schema_ids``: the
    key's and value's schema ids of a Schema Registry produce."""
    out: list[dict[str, Any]] = []
    for i, r in enumerate(p.results):
        d = delayed.get(i) if delayed else None
        if d is not None:
            out.append({"delayId": d.delay_id, "deliverAt": d.deliver_at})
        elif r.error_code:
            out.append({"error": {"code": r.error_code, "message": r.error}})
        else:
            out.append({**queue_json(r.queue), "offset": r.offset})
    body = {"topic": p.topic, "failed": p.failed, "results": out}
    if schema_ids is not None:
        body["keySchemaId"], body["valueSchemaId"] = schema_ids
    return body



def cancelled_body(c: Cancelled) -> dict[str, Any]:
    return {"result": "cancelled", "delayId": c.delay_id, "deliverAt": c.deliver_at, "topic": c.topic,
            "alreadyCancelled": c.already}
