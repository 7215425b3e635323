"""``POST /produce`` bodies (api/produce_wire.py): messages, encodings, headers, delays
(``delayMs``, ``deliverAt`` as epoch ms or RFC 3339) and the produce answer."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.produce_wire import cancelled_body, parse_produce, produced_body
from gateway.broker import OutgoingMessage, ProduceError, ProduceResult
from gateway.core.delay import Cancelled, Delayed
from gateway.core.errors import DomainError
from gateway.core.produce import Produced
from gateway.core.schemas import SchemaSpec

NOW = 1_795_000_000_000
T = "orders"


def parse(**body: Any) -> Any:
    return parse_produce({"topic": T, **body}, 100, NOW)[:4]


def test_one_message_or_a_batch() -> None:
    assert parse(value="v") == (T, "", [OutgoingMessage(b"v", None, [], None, None)], None)
    topic, producer, msgs, dues = parse(producer="svc", encoding="base64", messages=[
        {"value": "dg==", "key": "aw==", "headers": {"h": "eA=="}, "partition": 2, "timestamp": 9},
        {"value": None, "encoding": "utf8", "headers": [["a", "b"], ["a", None]]}])
    assert (topic, producer, dues) == (T, "svc", None)
    assert msgs[0] == OutgoingMessage(b"v", b"k", [("h", b"x")], "2", 9)
    assert msgs[1] == OutgoingMessage(None, None, [("a", b"b"), ("a", b"")], None, None)


@pytest.mark.parametrize("body,due", [
    (dict(value="x", delayMs=1500), NOW + 1500),
    (dict(value="x", deliverAt=NOW + 10), NOW + 10),
    (dict(value="x", deliverAt="2027-01-01T00:00:00.0001Z"), 1_798_761_600_001),  # rounded up
    (dict(messages=[{"value": "x"}], delayMs=7), NOW + 7),  # the request's default
    (dict(messages=[{"value": "x", "delayMs": 3}], delayMs=7), NOW + 3),  # the message's own
])
def test_delays_give_due_times(body: dict[str, Any], due: int) -> None:
    assert parse(**body)[3] == [due]


@pytest.mark.parametrize("body", [
    dict(value="a", delayMs=0), dict(value="b", deliverAt="2001-01-01T00:00:00Z"),
    dict(value="c", deliverAt=10 ** 11), dict(value="d", deliverAt="2001-01-01t00:00:00z"),
    dict(value="e", deliverAt="2016-12-31T23:59:60Z"),  # a leap second: past, so at once
])
def test_no_delay_or_a_past_time_is_written_at_once(body: dict[str, Any]) -> None:
    assert parse(**body)[3] is None


@pytest.mark.parametrize("body,code", [
    ({"value": "x", "delayMs": -1}, "invalid_delay"),
    ({"value": "x", "delayMs": "soon"}, "invalid_delay"),
    ({"value": "x", "delayMs": 1.5}, "invalid_delay"),
    ({"value": "x", "delayMs": 10 ** 20}, "invalid_delay"),
    ({"value": "x", "deliverAt": "tomorrow"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": "2026-11-25T20:00:00"}, "invalid_deliver_at"),  # no offset
    ({"value": "x", "deliverAt": "12026-01-01T00:00:00Z"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": -5}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": 10 ** 16}, "invalid_deliver_at"),
    ({"value": "x", "delayMs": 5, "deliverAt": 10}, "conflicting_delay"),
    ({"messages": [{"value": "x"}], "delayMs": 5, "deliverAt": 10}, "conflicting_delay"),
    ({"messages": [{"value": "x", "delayMs": []}]}, "invalid_delay"),
    ({"value": "x", "deliverAt": "2026-11-25T20:00:00+05"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": "2026-W48-3T20:00:00Z"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": "2026-11-25T20:00:00.Z"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": "2026-11-25T20:00:00Z\x00"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": "2026-11-25 20:00:00Z"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": "2016-12-30T23:59:60Z"}, "invalid_deliver_at"),
    ({"value": "x", "deliverAt": 1_795_636_800}, "deliver_at_in_seconds"),
    ({"value": "x", "deliverAt": 0}, "deliver_at_in_seconds"),
    ({"value": "x", "deliverAt": 10 ** 11 - 1}, "deliver_at_in_seconds"),
    ({"messages": [{"value": "x"}], "deliverAt": 1_795_636_800}, "deliver_at_in_seconds"),
    ({"messages": [{"value": "x", "deliverAt": 1_795_636_800.0}]}, "deliver_at_in_seconds"),
    ({"vaule": "x"}, "unknown_field"),
    ({}, "missing_value"),
    ({"messages": []}, "invalid_messages"),
    ({"messages": ["x"]}, "invalid_message"),
    ({"value": "x", "encoding": "hex"}, "invalid_encoding"),
    ({"value": "x", "encoding": {}}, "invalid_encoding"),
    ({"value": "x", "valueSchemaId": 1}, "unknown_field"),  # a schema needs a schema encoding
    ({"value": {}, "encoding": "avro", "valueSchemaId": 1, "valueSchema": "{}"}, "invalid_schema"),
    ({"value": {}, "encoding": "avro", "valueSchemaId": "1"}, "invalid_schema"),
    ({"messages": [{"value": 1, "encoding": "utf8"}], "encoding": "avro"}, "invalid_encoding"),
    ({"value": "!!", "encoding": "base64"}, "invalid_base64"),
    ({"value": 5}, "invalid_value"),
    ({"value": "x", "headers": [["a"]]}, "invalid_headers"),
    ({"value": "x", "partition": -1}, "invalid_partition"),
    ({"value": "x", "partition": "1"}, "invalid_partition"),
    ({"value": "x", "timestamp": 2 ** 63}, "invalid_timestamp"),
    ({"value": "x", "queue": "a:b"}, "invalid_queue"),
    ({"value": "x", "queue": 1}, "invalid_queue"),
    ({"value": "x", "queue": "broker-a.1", "partition": 1}, "invalid_queue"),
    ({"value": "x", "tag": "A||B"}, "invalid_tag"),
    ({"value": "x", "tag": ""}, "invalid_tag"),
    ({"value": "x", "headers": {str(i): "v" for i in range(65)}}, "too_many_headers"),
    ({"messages": [{"value": "x"}] * 101}, "too_many_messages"),
])
def test_bad_bodies_are_refused_with_a_code(body: dict[str, Any], code: str) -> None:
    with pytest.raises(DomainError) as e:
        parse(**body)
    assert e.value.code == code


def test_seconds_are_told_in_milliseconds() -> None:
    with pytest.raises(DomainError) as e:
        parse(value="x", deliverAt=1_795_636_800)
    assert "milliseconds" in str(e.value) and "1795636800000" in str(e.value)


def test_the_produce_answer() -> None:
    failed = ProduceResult(error="nope", error_code=ProduceError.UNKNOWN_TOPIC)
    p = Produced(T, [ProduceResult("0", 41), ProduceResult(), failed, ProduceResult("broker-a.3", 7)])
    body = produced_body(p, {1: Delayed("id1", NOW + 5)})
    assert body["topic"] == T and body["results"] == [
        {"partition": 0, "offset": 41}, {"delayId": "id1", "deliverAt": NOW + 5},
        {"error": {"code": "unknown_topic", "message": "nope"}},
        {"queue": "broker-a.3", "offset": 7}]  # RocketMQ's queue ids are not partition numbers
    assert cancelled_body(Cancelled("id1", NOW, T)) == \
        {"result": "cancelled", "delayId": "id1", "deliverAt": NOW, "topic": T,
         "alreadyCancelled": False}


def test_a_schema_encoding_leaves_keys_and_values_to_encode() -> None:
    _, _, msgs, _, schemas = parse_produce(
        {"topic": T, "encoding": "protobuf", "valueSchema": "syntax", "keySchemaId": 4,
         "messages": [{"value": {"a": 1}, "key": "k", "headers": {"h": "v"}}, {"value": None}]},
        100, NOW)
    assert schemas is not None and schemas.kind.value == "PROTOBUF"
    assert (schemas.key, schemas.value) == (SchemaSpec(id=4), SchemaSpec(text="syntax"))
    assert (schemas.keys, schemas.values) == (["k", None], [{"a": 1}, None])
    assert [(m.key, m.value, m.headers) for m in msgs] == [(None, None, [("h", b"v")]),
                                                           (None, None, [])]
    assert parse_produce({"topic": T, "value": "x"}, 100, NOW)[4] is None


def test_trace_context_is_checked_and_a_records_own_wins() -> None:
    from gateway.core import trace

    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert trace.context_headers(good, "a=1") == [("traceparent", good.encode()),
                                                  ("tracestate", b"a=1")]
    for bad in ("", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", "ff" + good[2:],
                "00-" + "0" * 32 + "-b7ad6b7169203331-01", good[:-2] + "01-x",
                good.upper(), "00-xyz-bad-01"):
        assert trace.context_headers(bad, "a=1") == [], bad
    assert trace.valid_parent("01" + good[2:] + "-later-fields")  # a later version's extras
    assert trace.context_headers(good, "x" * 513) == [("traceparent", good.encode())]
    msgs = [OutgoingMessage(b"a"), OutgoingMessage(b"b", headers=[("traceparent", b"mine")])]
    out = trace.stamp(msgs, trace.context_headers(good, None))
    assert out[0].headers == [("traceparent", good.encode())] and out[1] is msgs[1]
    assert trace.prefers_context("respond-async, Trace-Context; x=1")
    assert not trace.prefers_context("return=minimal") and not trace.prefers_context(None)
