"""The JSON wire format of the data API: produce requests in, fetch/ack bodies out.

Values, keys and header values are UTF-8 text by default, or base64 bytes when the message
(or the whole request) says ``"encoding": "base64"``; on the way out a record that is not
valid UTF-8 is sent as base64. Only this module knows the camelCase field names.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..broker import OutgoingMessage, Record
from ..core.auth import KeyRecord
from ..core.consume import Fetched, FetchStatus
from ..core.deadletters import DeadPage, RedriveTarget
from ..core.delay import Cancelled, Delayed
from ..core.errors import TooLarge, bad_request
from ..core.nack import Failed
from ..core.names import check_name, check_topic
from ..core.produce import Produced
from ..core.reset import ResetRequest, ResetResult
from ..core.retry import attempt_of
from ..core.timeparse import MIN_EPOCH_MS, parse_rfc3339
from ..store import AckOutcome, AckResult, now_ms
from .numbers import json_int

#: Kafka's field widths (int32 partition, int64 timestamp): larger JSON integers are refused here,
#: before any record of the batch is handed to the producer.
MAX_PARTITION = 2**31 - 1
MAX_TIMESTAMP = 2**63 - 1
_DELAY_FIELDS = {"delayMs", "deliverAt"}
_MESSAGE_FIELDS = {"value", "key", "headers", "partition", "timestamp", "encoding"} | _DELAY_FIELDS
#: The latest due time accepted: 9999-12-31T23:59:59.999Z. There is no maximum delay short of it
#: (the wheel loops on its top level); anything later is a mistake, not a plan.
MAX_DUE = 253_402_300_799_999
_ENCODINGS = ("utf8", "base64")
MAX_HEADERS = 64


def parse_produce(body: Any, max_batch: int, now: int) -> tuple[str, str, list[OutgoingMessage],
                                                                list[int | None] | None]:
    """Returns (topic, producer name or '', messages, due times): each message's due time
    (unix ms) if it is delayed past ``now``, else None; None for all when none is delayed."""
    if not isinstance(body, dict):
        raise bad_request("invalid_body", "request body must be a JSON object")
    topic = check_topic(body.get("topic"))
    producer = check_name(body.get("producer"), "producer", required=False)
    default_enc = body.get("encoding", "utf8")
    if default_enc not in _ENCODINGS:
        raise bad_request("invalid_encoding", "encoding must be 'utf8' or 'base64'")
    if "messages" in body:
        raw = body["messages"]
        if not isinstance(raw, list) or not raw:
            raise bad_request("invalid_messages", "messages must be a non-empty array")
        if len(raw) > max_batch:
            raise TooLarge("too_many_messages", f"at most {max_batch} messages per request",
                           limit=max_batch)
        extra = set(body) - {"topic", "producer", "messages", "encoding"} - _DELAY_FIELDS
        default_due = _due(body, now, "")
    else:
        raw = [{k: v for k, v in body.items() if k in _MESSAGE_FIELDS}]
        extra = set(body) - _MESSAGE_FIELDS - {"topic", "producer"}
        default_due = None
    if extra:  # before missing_value: of {"vaule": ...} the typo is what to name
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    if "messages" not in body and "value" not in body:
        raise bad_request("missing_value", "give 'value' (one message) or 'messages' (a batch)")
    messages = [_message(m, i, default_enc) for i, m in enumerate(raw)]
    dues = [_due(m, now, f"messages[{i}]." if "messages" in body else "", default_due)
            for i, m in enumerate(raw)]
    return topic, producer, messages, dues if any(d is not None for d in dues) else None


def _due(m: dict[str, Any], now: int, where: str, default: int | None = None) -> int | None:
    """The due time ``delayMs`` or ``deliverAt`` asks for (unix ms), None if not delayed (none
    given, 0, or a time already past: written at once)."""
    has_delay, has_at = m.get("delayMs") is not None, m.get("deliverAt") is not None
    if has_delay and has_at:
        raise bad_request("conflicting_delay", f"{where}delayMs and {where}deliverAt: give one")
    if has_delay:
        ms = json_int(m["delayMs"])
        if ms is None or ms < 0 or ms > MAX_DUE - now:
            raise bad_request("invalid_delay", f"{where}delayMs must be an integer number of "
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
            raise bad_request("invalid_deliver_at", f"{where}deliverAt must be ms since the epoch "
                              f"or an RFC 3339 date-time, e.g. 2026-11-25T20:00:00Z: {e}") from None
    else:
        n = json_int(v)
        if n is None:
            raise bad_request("invalid_deliver_at", f"{where}deliverAt must be ms since the epoch "
                              "or an RFC 3339 date-time")
        if 0 <= n < MIN_EPOCH_MS:  # the threshold's reasoning: core/timeparse.py
            in_ms = f" (that time in milliseconds is {n * 1000})" if n * 1000 >= MIN_EPOCH_MS else ""
            raise bad_request("deliver_at_in_seconds", f"{where}deliverAt takes milliseconds since "
                              f"the epoch: {n} is below {MIN_EPOCH_MS} (1973-03-03 in ms), so it "
                              f"looks like seconds{in_ms}. To produce at once, leave deliverAt out.",
                              minimum=MIN_EPOCH_MS)
        ms = n
    if not 0 <= ms <= MAX_DUE:
        hint = " (a number this large looks like micro- or nanoseconds)" if ms > MAX_DUE else ""
        raise bad_request("invalid_deliver_at", f"{where}deliverAt must be between 1970 and the "
                          f"end of year 9999, in milliseconds{hint}")
    return ms


def _message(m: Any, i: int, default_enc: str) -> OutgoingMessage:
    if not isinstance(m, dict):
        raise bad_request("invalid_message", f"messages[{i}] must be an object", index=i)
    extra = set(m) - _MESSAGE_FIELDS
    if extra:
        raise bad_request("unknown_field", f"messages[{i}]: unknown field(s): {', '.join(sorted(extra))}",
                          index=i)
    enc = m.get("encoding", default_enc)
    if enc not in _ENCODINGS:
        raise bad_request("invalid_encoding", f"messages[{i}].encoding must be 'utf8' or 'base64'", index=i)
    value = _bytes(m.get("value"), enc, i, "value")
    key = _bytes(m.get("key"), enc, i, "key")
    headers: list[tuple[str, bytes]] = []
    raw_h = m.get("headers")
    if raw_h is not None:
        pairs: Any = raw_h.items() if isinstance(raw_h, dict) else raw_h
        if not isinstance(pairs, (list, type({}.items()))):
            raise bad_request("invalid_headers", f"messages[{i}].headers must be an object or "
                              "a list of [name, value] pairs", index=i)
        pair: Any
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)):
                raise bad_request("invalid_headers", f"messages[{i}].headers: each header is "
                                  "[name, value] with a string name", index=i)
            hv = _bytes(pair[1], enc, i, f"headers[{pair[0]}]")
            headers.append((pair[0], hv if hv is not None else b""))
        if len(headers) > MAX_HEADERS:
            raise TooLarge("too_many_headers", f"messages[{i}] has more than {MAX_HEADERS} headers",
                           index=i, limit=MAX_HEADERS)
    partition = _optional_int(m, "partition")
    if partition is not None and not 0 <= partition <= MAX_PARTITION:
        raise bad_request("invalid_partition", f"messages[{i}].partition must be an integer >= 0", index=i)
    ts = _optional_int(m, "timestamp")
    if ts is not None and not 0 <= ts <= MAX_TIMESTAMP:
        raise bad_request("invalid_timestamp", f"messages[{i}].timestamp must be ms since the epoch",
                          index=i)
    return OutgoingMessage(value, key, headers, str(partition) if partition is not None else None, ts)


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
        raise bad_request(f"invalid_{kind}",
                          f"messages[{i}].{name} must be a string or null", index=i)
    if enc == "utf8":
        return v.encode()
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("invalid_base64", f"messages[{i}].{name} is not valid base64", index=i) from None




def produced_body(p: Produced, delayed: dict[int, Delayed] | None = None) -> dict[str, Any]:
    """Per record its ``partition`` and ``offset``: the partition is the queue id as a number,
    which every Kafka queue id is. (A broker with non-numeric queue ids would get the id as a
    string here; the RocketMQ adapter will settle the field's name and type.) A delayed record
    (``delayed``, by index) has its ``delayId`` and ``deliverAt`` instead."""
    out: list[dict[str, Any]] = []
    for i, r in enumerate(p.results):
        d = delayed.get(i) if delayed else None
        if d is not None:
            out.append({"delayId": d.delay_id, "deliverAt": d.deliver_at})
        elif r.error_code:
            out.append({"error": {"code": r.error_code, "message": r.error}})
        else:
            out.append({"partition": int(r.queue) if r.queue.isdigit() else r.queue,
                        "offset": r.offset})
    return {"topic": p.topic, "failed": p.failed, "results": out}


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
        raise bad_request("invalid_failed", "failed must be an array of offsets or "
                          "{offset, delayMs} objects")
    out: dict[int, int | None] = {}
    for item in v:
        delay: int | None = None
        if isinstance(item, dict):
            if set(item) - {"offset", "delayMs"}:
                raise bad_request("invalid_failed", "an item of failed takes offset and delayMs")
            delay = parse_delay_ms(item.get("delayMs"), "failed[].delayMs")
            item = item.get("offset")
        offset = json_int(item)
        if offset is None or offset < 0:
            raise bad_request("invalid_failed", "failed[].offset must be a non-negative integer")
        out[offset] = delay
    return out


def parse_delay_ms(v: Any, name: str = "delayMs") -> int | None:
    """A retry's own wait (ms), 0 up to the year 9999; None when not given."""
    if v is None:
        return None
    ms = json_int(v)
    if ms is None or not 0 <= ms <= MAX_DUE - now_ms():  # the produce rule: see _due
        raise bad_request("invalid_delay", f"{name} must be an integer number of milliseconds, "
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
        body["lock"] = r.lock_state
    return body


def fetched_body(f: Fetched, broker: str, encoding: str) -> dict[str, Any]:
    body: dict[str, Any]
    b = f.batch
    if b is None:
        body = {"status": f.status.value, "topic": f.topic, "messages": []}
        if f.status is FetchStatus.RATE_LIMITED:
            body["retryAfterMs"] = f.retry_after_ms
    else:
        body = {
            "status": f.status.value, "requestId": b.request_id, "broker": broker,
            "topic": f.topic, "queue": b.queue, "offset": b.offset, "nextOffset": b.next_offset,
            "backlog": b.backlog, "redelivered": b.redelivered, "lockTimeoutMs": b.lock_timeout_ms,
            "messages": encode_records(b.records, encoding, retried=b.topic != f.topic),
        }
        if b.topic != f.topic:
            body["retryTopic"] = b.topic
        if b.skipped is not None:
            body["skipped"] = {"from": b.skipped.start, "to": b.skipped.end,
                               "reason": b.skipped.reason.value}
    if f.ack is not None:
        body["ack"] = ack_body(f.ack)
    return body


def encode_records(records: list[Record], encoding: str,
                   retried: bool = False) -> list[dict[str, Any]]:
    """Records as JSON: UTF-8 text, or base64 per record when asked or when not valid UTF-8.
    ``attempt`` is 1 unless the records come from a retry topic (``retried``)."""
    out = []
    b64 = encoding == "base64"
    k: str | None
    v: str | None
    h: list[list[str | None]]
    for r in records:
        key, value, headers = r.key, r.value, r.headers
        enc = "base64" if b64 else "utf8"
        if not b64:
            try:
                k = key.decode() if key is not None else None
                v = value.decode() if value is not None else None
                h = [[n, hv.decode() if hv is not None else None] for n, hv in headers]
            except UnicodeDecodeError:
                enc = "base64"
        if enc == "base64":
            k = _b64(key)
            v = _b64(value)
            h = [[n, _b64(hv)] for n, hv in headers]
        out.append({"offset": r.offset, "timestamp": r.timestamp, "key": k, "value": v,
                    "headers": h, "encoding": enc, "attempt": attempt_of(r) if retried else 1})
    return out


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def key_body(rec: KeyRecord) -> dict[str, Any]:
    """An API key's record as the admin API shows it (never its digest)."""
    return {"id": rec.id, "name": rec.name, "admin": rec.admin, "producers": rec.producers,
            "consumers": rec.consumers, "createdMs": rec.created_ms}


_RESET_FIELDS = {"topic": "topic", "to": "to", "timestamp": "timestamp", "offset": "offset",
                 "queue": "queue", "clientId": "client_id"}


def reset_request(body: dict[str, Any]) -> ResetRequest:
    """``POST /admin/consumers/{c}/reset``'s body; its values are checked by the reset itself."""
    extra = set(body) - set(_RESET_FIELDS)
    if extra:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    for k in ("queue", "timestamp", "offset"):  # a null queue would widen the reset to all
        if k in body and body[k] is None:  # queues, which cannot be undone: say so instead
            raise bad_request(f"invalid_{k}", f"{k} must not be null: leave it out"
                              + (" to reset every queue of the topic" if k == "queue" else ""))
    values = {_RESET_FIELDS[k]: v for k, v in body.items()}
    # 100.0 is an integer to JSON Schema, so to this API (a queue may be given as its number)
    for k in ("timestamp", "offset", "queue"):
        if (n := json_int(values.get(k))) is not None:
            values[k] = n
    return ResetRequest(**values)


def reset_body(r: ResetResult) -> dict[str, Any]:
    return {"consumer": r.consumer, "topic": r.topic, "to": r.to, "moved": r.moved,
            "queues": [{"clientId": m.client_id, "queue": m.queue, "from": m.before, "to": m.after}
                       for m in r.queues]}


def dead_page_body(p: DeadPage, encoding: str) -> dict[str, Any]:
    records = encode_records([r for _, r in p.records], encoding, retried=True)
    for (queue, _), out in zip(p.records, records, strict=True):
        out["partition"] = int(queue) if queue.isdigit() else queue
    return {
        "consumer": p.consumer, "deadLetterTopic": p.topic, "exists": p.exists, "count": p.count,
        "oldestMs": p.oldest_ms if p.oldest_ms >= 0 else None,
        "partitions": [{"partition": int(q.queue) if q.queue.isdigit() else q.queue,
                        "redrivenOffset": q.redriven, "endOffset": q.high, "count": q.count}
                       for q in p.queues],
        "messages": records,
    }


def redrive_request(body: dict[str, Any]) -> tuple[RedriveTarget, str | None, int | None,
                                                   int | None]:
    """(target, partition, toOffset, limit) of a redrive; all optional."""
    raw = body.get("target")
    try:
        target = RedriveTarget("consumer" if raw is None else raw if isinstance(raw, str) else "?")
    except ValueError:
        raise bad_request("invalid_target", "target must be 'consumer' (its retry topic) or "
                          "'topic' (the topic it was produced to)") from None
    partition: str | None = None
    if body.get("partition") is not None:
        n = json_int(body["partition"])
        if n is None or not 0 <= n <= MAX_PARTITION:  # Kafka's int32, as for /produce
            raise bad_request("invalid_partition", f"partition must be an integer from 0 to "
                              f"{MAX_PARTITION}", parameter="partition", min=0, max=MAX_PARTITION)
        partition = str(n)
    to_offset = _count(body, "toOffset", "invalid_to_offset", 0)
    limit = _count(body, "limit", "invalid_limit", 1)
    return target, partition, to_offset, limit


def _count(body: dict[str, Any], name: str, code: str, lo: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    n = json_int(v)
    if n is None or n < lo:
        raise bad_request(code, f"{name} must be an integer of at least {lo}")
    return n


def cancelled_body(c: Cancelled) -> dict[str, Any]:
    return {"result": "cancelled", "delayId": c.delay_id, "deliverAt": c.deliver_at, "topic": c.topic}
