"""The JSON wire format of consuming: the fetch, ack, nack, extend and unlock answers, and the
parameter names of ``/message``, ``/ack``, ``/nack``, ``/extend`` and ``/unlock``.

On the way out a record is UTF-8 text, or base64 when asked for or when it is not valid UTF-8.
Only the wire modules know the camelCase field names.
"""

from __future__ import annotations

import base64
from typing import Any

from ..broker import Record
from ..config import Settings
from ..core.errors import invalid
from ..core.fetch import Fetched, FetchParams, FetchStatus, parse_tag_filter
from ..core.nack import Failed
from ..core.names import InternalTopics, check_name, check_public_topic
from ..core.retry import attempt_of
from ..core.schemas import KINDS, Decoded
from ..core.views import QueueRow
from ..store import (
    AckOutcome,
    AckResult,
    Credential,
    ExtendOutcome,
    ExtendResult,
    UnlockOutcome,
    UnlockResult,
    now_ms,
)
from .http import Params
from .numbers import json_int
from .produce_wire import MAX_DUE

#: The parameters of /message, and of /ack and /unlock: anything else is refused, since a typo
#: (``maxx=5``) would otherwise lock a queue with the default batch size.
FETCH_PARAMS = frozenset({"consumer", "topic", "clientId", "max", "max_bytes", "wait_ms", "encoding",
                          "requestId", "tag"})
#: The largest ``max_bytes`` (a 32-bit signed integer, as Kafka's ``fetch.max.bytes``).
MAX_BYTES = (1 << 31) - 1
#: The most topics one ``/message`` names: each costs a choose script per look.
MAX_FETCH_TOPICS = 16
BATCH_PARAMS = frozenset({"requestId"})
ACK_PARAMS = frozenset({"requestId", "failed"})
NACK_PARAMS = frozenset({"requestId", "failed", "delayMs"})


def fetch_request(p: Params, s: Settings, address: str, credential: Credential | None,
                  internal: InternalTopics) -> tuple[FetchParams, str]:
    """``/message``'s parameters: what to fetch, and the encoding of the answer's records."""
    encoding = p.get("encoding")
    if encoding is None:
        encoding = "utf8"
    elif not isinstance(encoding, str) or (encoding not in ("utf8", "base64")
                                           and encoding not in KINDS):  # ``encoding=`` too
        raise invalid("invalid_encoding", "encoding must be 'utf8' or 'base64' (or, with a "
                      "schema registry, 'avro', 'protobuf', 'jsonschema')")
    rid = p.get("requestId")  # absent or empty: no piggy-backed ack
    if rid is None:
        rid = ""
    if not isinstance(rid, str):
        raise invalid("invalid_request_id", "requestId must be a string")
    topics = fetch_topics(p.get("topic"), internal)
    return FetchParams(
        consumer=check_name(p.get("consumer"), "consumer"),
        client_id=check_name(p.get("clientId"), "clientId", required=False),
        topic=topics[0],
        also_topics=topics[1:],
        max_messages=p.integer("max", s.default_max_messages, 1, s.max_messages),
        max_bytes=p.integer("max_bytes", 0, 1, MAX_BYTES),
        wait_ms=p.integer("wait_ms", 0, 0, s.max_wait_ms),
        address=address,
        ack_request_id=rid,
        credential=credential,
        tags=parse_tag_filter(_text(p.get("tag"), "invalid_tag", "tag")),
    ), encoding


def fetch_topics(v: Any, internal: InternalTopics) -> tuple[str, ...]:
    """``topic``: one name, or several separated by commas (one spelling in a query string and
    a body); each a public topic, none twice, at most :data:`MAX_FETCH_TOPICS`."""
    if not isinstance(v, str) or "," not in v:
        return (check_public_topic(v, internal),)
    names = v.split(",")
    if len(names) > MAX_FETCH_TOPICS:
        raise invalid("invalid_topic", f"topic takes 1 to {MAX_FETCH_TOPICS} topics")
    topics = tuple(check_public_topic(t, internal) for t in names)
    if len(set(topics)) != len(topics):
        raise invalid("invalid_topic", "a topic is named twice")
    return topics


def _text(v: Any, code: str, name: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise invalid(code, f"{name} must be a string")
    return v


def request_id(p: Params) -> str:
    """The ``requestId`` of /ack, /nack and /unlock: required, a string."""
    rid = p.get("requestId")
    if rid is None or rid == "":
        raise invalid("missing_request_id", "requestId is required")
    if not isinstance(rid, str):
        raise invalid("invalid_request_id", "requestId must be a string")
    return rid


def nack_request(p: Params) -> tuple[dict[int, int | None] | None, int | None]:
    """The body fields of /nack (and of /ack, without ``delayMs``): the failed offsets, each
    with its own wait or None, and the wait of all of them (``delayMs``)."""
    return parse_failed(p.body.get("failed")), parse_delay_ms(p.body.get("delayMs"))


_ACK_MESSAGE = {
    AckOutcome.COMMITTED: "offsets committed",
    AckOutcome.ALREADY_COMMITTED: "this batch was already committed; nothing changed",
    AckOutcome.LOCK_LOST: "another fetch took the queue (this batch's lock expired or was "
                          "unlocked); the batch will be (or was) redelivered there",
    AckOutcome.OFFSET_RESET: "an operator reset this queue's offsets after the batch was "
                             "fetched; nothing changed",
    AckOutcome.OFFSET_MISMATCH: "the committed offset no longer matches this batch; nothing changed",
    AckOutcome.UNKNOWN: "no such queue for this consumer (expired clientId or deleted consumer)",
}


def parse_failed(v: Any) -> dict[int, int | None] | None:
    """``failed``: the offsets of a batch that failed, each an integer or ``{"offset": n,
    "delayMs": ms}`` (its own wait before the retry); None when not given."""
    if v is None:
        return None
    if not isinstance(v, list) or len(v) > 100_000:
        raise invalid("invalid_failed", "failed must be an array of offsets or "
                      "{offset, delayMs} objects")
    out: dict[int, int | None] = {}
    for item in v:
        delay: int | None = None
        if isinstance(item, dict):
            if set(item) - {"offset", "delayMs"}:
                raise invalid("invalid_failed", "an item of failed takes offset and delayMs")
            delay = parse_delay_ms(item.get("delayMs"), "failed[].delayMs")
            item = item.get("offset")
        offset = json_int(item)
        if offset is None or offset < 0:
            raise invalid("invalid_failed", "failed[].offset must be a non-negative integer")
        out[offset] = delay
    return out


def parse_delay_ms(v: Any, name: str = "delayMs") -> int | None:
    """A retry's own wait (ms), 0 up to the year 9999; None when not given."""
    if v is None:
        return None
    ms = json_int(v)
    if ms is None or not 0 <= ms <= MAX_DUE - now_ms():  # the produce rule: see _due
        raise invalid("invalid_delay", f"{name} must be an integer number of milliseconds, "
                      "0 or more (due no later than year 9999)")
    return ms


def failed_body(f: Failed) -> dict[str, Any]:
    """A nack's (or an ack with failed offsets') answer: the ack's fields, and where each
    failed record went."""
    body = ack_body(f.ack)
    if f.retry_topic or f.dead_letter_topic:
        body["retried"] = [{"offset": r.offset, "attempt": r.attempt, "deliverAt": r.deliver_at}
                           for r in f.retried]
        body["deadLettered"] = f.dead
        body["retryTopic"] = f.retry_topic
        body["deadLetterTopic"] = f.dead_letter_topic
    return body


def ack_body(r: AckResult) -> dict[str, Any]:
    body: dict[str, Any] = {"result": r.result.value, "committedOffset": r.committed,
                            "message": _ACK_MESSAGE[r.result]}
    if r.result is AckOutcome.COMMITTED:
        body["lock"] = r.lock_state.value
    return body


def fetched_body(f: Fetched, broker: str, encoding: str, topics: tuple[str, ...] = (),
                 decoded: list[Decoded | str] | None = None) -> dict[str, Any]:
    """``/message``'s answer; ``topics``: the topics of a fetch that named several (``topic``
    is then the one the batch came from); ``decoded``: the records decoded with their schemas
    (``encoding`` a Schema Registry format), or why one could not be."""
    body: dict[str, Any]
    b = f.batch
    if b is None:
        body = {"status": f.status.value, "topic": f.topic, "messages": []}
        if f.status is FetchStatus.RATE_LIMITED:
            body["retryAfterMs"] = f.retry_after_ms
    else:
        messages = encode_records(b.records, encoding, retried=b.topic != f.topic,
                                  decoded=decoded)
        body = {
            "status": f.status.value, "requestId": b.request_id, "broker": broker,
            "topic": f.topic, "queue": b.queue, "offset": b.offset, "nextOffset": b.next_offset,
            "backlog": b.backlog,
            "redelivered": b.redelivered_at(now_ms()),  # as late as the answer: see redelivered_at
            "lockTimeoutMs": b.lock_timeout_ms, "messages": messages,
        }
        if b.topic != f.topic:
            body["retryTopic"] = b.topic
        if b.skipped is not None:
            body["skipped"] = {"from": b.skipped.start, "to": b.skipped.end,
                               "reason": b.skipped.reason.value}
    if f.ack is not None:
        body["ack"] = ack_body(f.ack)
    if len(topics) > 1:
        body["topics"] = list(topics)
    return body


def encode_records(records: list[Record], encoding: str, retried: bool = False,
                   decoded: list[Decoded | str] | None = None) -> list[dict[str, Any]]:
    """Records as JSON: UTF-8 text, or base64 per record when asked or when not valid UTF-8;
    with ``decoded`` (a Schema Registry format), key and value as their schemas decode them,
    with the schema ids, or, for a record that did not decode, base64 and ``schemaError``.
    ``attempt`` is 1 unless the records come from a retry topic (``retried``)."""
    out = []
    b64 = encoding == "base64"
    k: Any
    v: Any
    h: list[list[str | None]] | tuple[()]
    for i, r in enumerate(records):
        key, value, headers = r.key, r.value, r.headers
        enc = "base64" if b64 else "utf8"
        schema: dict[str, Any] | None = None
        d = decoded[i] if decoded is not None else None
        if isinstance(d, tuple):
            (kid, k), (vid, v) = d
            try:
                h = [[n, hv.decode() if hv is not None else None] for n, hv in headers]
                enc, schema = encoding, {"keySchemaId": kid, "valueSchemaId": vid}
            except UnicodeDecodeError:
                d = "a header is not UTF-8 text"
        if isinstance(d, str):
            enc, schema = "base64", {"schemaError": d}
        elif d is None and not b64:
            try:
                k = key.decode() if key is not None else None
                v = value.decode() if value is not None else None
                h = [[n, hv.decode() if hv is not None else None] for n, hv in headers] \
                    if headers else ()  # an empty tuple is no new GC-tracked object: _record
            except UnicodeDecodeError:
                enc = "base64"
        if enc == "base64":
            k = _b64(key)
            v = _b64(value)
            h = [[n, _b64(hv)] for n, hv in headers]
        rec = {"offset": r.offset, "timestamp": r.timestamp, "key": k, "value": v,
               "headers": h, "encoding": enc, "attempt": attempt_of(r) if retried else 1}
        if schema is not None:
            rec.update(schema)
        if r.tag is not None:
            rec["tag"] = r.tag
        out.append(rec)
    return out


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def with_ack_error(r: AckResult, body: dict[str, Any]) -> dict[str, Any]:
    """An ack's answer (``ack_body``, ``failed_body``) with the ``error`` a batch that was not
    (or no longer) committable adds: its code is the outcome (``unknown_queue`` for none)."""
    if r.result not in (AckOutcome.COMMITTED, AckOutcome.ALREADY_COMMITTED):
        body["error"] = {"code": r.result.value if r.result is not AckOutcome.UNKNOWN
                         else "unknown_queue", "message": body["message"]}
    return body


_EXTEND_REFUSED = {
    ExtendOutcome.ALREADY_COMMITTED: "this batch is committed; there is no lock to extend",
    ExtendOutcome.LOCK_LOST: _ACK_MESSAGE[AckOutcome.LOCK_LOST],
    ExtendOutcome.OFFSET_RESET: _ACK_MESSAGE[AckOutcome.OFFSET_RESET],
    ExtendOutcome.OFFSET_MISMATCH: _ACK_MESSAGE[AckOutcome.OFFSET_MISMATCH],
    ExtendOutcome.NOT_LOCKED: "this batch was handed back (/unlock); it will be redelivered",
    ExtendOutcome.UNKNOWN: _ACK_MESSAGE[AckOutcome.UNKNOWN],
}


def extend_body(r: ExtendResult) -> dict[str, Any]:
    """``/extend``'s answer: the new lock timeout, or why the batch's lock is not held (its code
    is the outcome, ``unknown_queue`` for none, as ``with_ack_error`` names them)."""
    body: dict[str, Any] = {"result": r.result.value, "committedOffset": r.committed}
    if r.result is ExtendOutcome.EXTENDED:
        body["lockTimeoutMs"] = r.timeout_ms
    else:
        body["error"] = {"code": r.result.value if r.result is not ExtendOutcome.UNKNOWN
                         else "unknown_queue", "message": _EXTEND_REFUSED[r.result]}
    return body


def unlock_body(r: UnlockResult) -> dict[str, Any]:
    body: dict[str, Any] = {"result": r.result.value, "committedOffset": r.committed}
    if r.result in (UnlockOutcome.LOCK_LOST, UnlockOutcome.UNKNOWN):
        lost = r.result is UnlockOutcome.LOCK_LOST
        body["error"] = {"code": "lock_lost" if lost else "unknown_queue",
                         "message": "this batch no longer holds the queue's lock"
                         if lost else "no such queue for this consumer"}
    return body


def queues_body(consumer: str, client_id: str, timeout_ms: int, rows: list[QueueRow]) -> dict[str, Any]:
    """``GET /consumers/{c}/queues`` (and a clientId's): each queue's offsets and lock."""
    return {"consumer": consumer, "clientId": client_id or None, "consumeTimeoutMs": timeout_ms,
            "queues": [{
                "topic": r.topic, "queue": r.queue,
                "maxOffset": r.max_offset, "committedOffset": r.committed, "backlog": r.backlog,
                "locked": r.locked(timeout_ms), "lockAgeMs": r.lock_age_ms, "lockToken": r.token,
                "lastAccessMs": r.last_access_ms, "lastAccessAgeMs": r.last_access_age_ms,
                "lastClientAddress": r.address,
            } for r in rows]}


def clients_body(consumer: str, idle_expiry_ms: int, clients: list[tuple[str, int]],
                 now: int) -> dict[str, Any]:
    """``GET /consumers/{c}/clients``: a broadcast consumer's clientIds and when each was seen."""
    return {"consumer": consumer, "idleExpiryMs": idle_expiry_ms,
            "clients": [{"clientId": c, "lastSeenMs": ts, "idleMs": now - ts} for c, ts in clients]}
