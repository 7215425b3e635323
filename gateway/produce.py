"""Turn a JSON produce request into broker messages, validating every field.

Values, keys and header values are UTF-8 text by default, or base64 bytes when the
message (or the whole request) says ``"encoding": "base64"``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from . import metrics
from .broker import Broker, OutgoingMessage, ProduceResult
from .errors import ApiError, bad_request, forbidden, unauthorized
from .names import check_name, check_topic
from .store import Credential, OffsetStore

#: Kafka's field widths (int32 partition, int64 timestamp): larger JSON integers are refused here,
#: before any record of the batch is handed to the producer.
MAX_PARTITION = 2**31 - 1
MAX_TIMESTAMP = 2**63 - 1
_MESSAGE_FIELDS = {"value", "key", "headers", "partition", "timestamp", "encoding"}
_ENCODINGS = ("utf8", "base64")
MAX_HEADERS = 64


def parse_produce(body: Any, max_batch: int) -> tuple[str, str, list[OutgoingMessage]]:
    """Returns (topic, producer name or '', messages)."""
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
            raise ApiError(413, "too_many_messages", f"at most {max_batch} messages per request",
                           limit=max_batch)
        extra = set(body) - {"topic", "producer", "messages", "encoding"}
    else:
        raw = [{k: v for k, v in body.items() if k in _MESSAGE_FIELDS}]
        extra = set(body) - _MESSAGE_FIELDS - {"topic", "producer"}
        if "value" not in body:
            raise bad_request("missing_value", "give 'value' (one message) or 'messages' (a batch)")
    if extra:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    return topic, producer, [_message(m, i, default_enc) for i, m in enumerate(raw)]


async def check_producer(store: OffsetStore, credential: Credential | None, open_mode: bool,
                         producer: str, topic: str) -> None:
    """Refuse a produce the key or the producer registry does not allow (one Redis call; none
    at all when auth is off and the gateway is in open mode)."""
    if credential is None and open_mode and not producer:
        return
    verdict, who = await store.produce_check(credential, open_mode, producer, topic)
    if verdict == "ok":
        return
    if verdict == "unauthenticated":
        raise unauthorized("invalid_api_key", "the API key is not valid")
    if verdict == "forbidden":
        raise forbidden("forbidden", f"this API key may not produce as {who!r}" if who
                        else "this API key is not bound to any producer")
    if verdict == "producer_required":
        raise bad_request("missing_producer", "name the producer: 'producer' in the body")
    if verdict == "unregistered_producer":
        raise forbidden("unregistered_producer", f"producer {who!r} is not registered "
                        f"(PUT /admin/producers/{who})")
    raise forbidden("topic_not_allowed", f"producer {who!r} is not registered for topic {topic!r}")


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
        pairs = raw_h.items() if isinstance(raw_h, dict) else raw_h
        if not isinstance(pairs, (list, type({}.items()))):
            raise bad_request("invalid_headers", f"messages[{i}].headers must be an object or "
                              "a list of [name, value] pairs", index=i)
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)):
                raise bad_request("invalid_headers", f"messages[{i}].headers: each header is "
                                  "[name, value] with a string name", index=i)
            hv = _bytes(pair[1], enc, i, f"headers[{pair[0]}]")
            headers.append((pair[0], hv if hv is not None else b""))
        if len(headers) > MAX_HEADERS:
            raise ApiError(413, "too_many_headers", f"messages[{i}] has more than {MAX_HEADERS} headers",
                           index=i, limit=MAX_HEADERS)
    partition = m.get("partition")
    if partition is not None and (type(partition) is not int or not 0 <= partition <= MAX_PARTITION):
        raise bad_request("invalid_partition", f"messages[{i}].partition must be an integer >= 0", index=i)
    ts = m.get("timestamp")
    if ts is not None and (type(ts) is not int or not 0 <= ts <= MAX_TIMESTAMP):
        raise bad_request("invalid_timestamp", f"messages[{i}].timestamp must be ms since the epoch",
                          index=i)
    return OutgoingMessage(value, key, headers, partition, ts)


def _bytes(v: Any, enc: str, i: int, name: str) -> bytes | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request("invalid_" + ("value" if name == "value" else "key" if name == "key" else "headers"),
                          f"messages[{i}].{name} must be a string or null", index=i)
    if enc == "utf8":
        return v.encode()
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("invalid_base64", f"messages[{i}].{name} is not valid base64", index=i) from None


async def produce(broker: Broker, topic: str, messages: list[OutgoingMessage]) -> dict[str, Any]:
    """Send after checking partitions, so a bad partition fails alone and fast."""
    queues = set(await broker.queues(topic))
    results: list[ProduceResult | None] = [None] * len(messages)
    to_send: list[int] = []
    for i, m in enumerate(messages):
        if m.partition is not None and str(m.partition) not in queues:
            results[i] = ProduceResult(error_code="unknown_partition",
                                       error=f"topic {topic!r} has no partition {m.partition}")
        else:
            to_send.append(i)
    sent = await broker.produce(topic, [messages[i] for i in to_send])
    for i, r in zip(to_send, sent, strict=True):
        results[i] = r
    out = []
    failed = 0
    for r in results:
        assert r is not None
        if r.error_code:
            failed += 1
            out.append({"error": {"code": r.error_code, "message": r.error}})
        else:
            out.append({"partition": r.partition, "offset": r.offset})
    metrics.produced(len(out) - failed, failed)
    return {"topic": topic, "failed": failed, "results": out}
