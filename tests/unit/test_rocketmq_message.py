"""RocketMQ's message format and names (gateway/broker/rocketmq/message.py, produce.py): stored
records as the broker's ``MessageDecoder`` writes them, properties, and the record rules."""

from __future__ import annotations

import zlib

import pytest

from gateway.broker import OutgoingMessage
from gateway.broker.rocketmq.message import (
    VALUE_MARK,
    decode_messages,
    format_properties,
    from_broker_name,
    group_name,
    new_unique_key,
    parse_properties,
    to_broker_name,
)
from gateway.broker.rocketmq.produce import InvalidRecord, properties

from ..support.rocketmq_records import stored


def test_stored_records_decode_with_their_properties() -> None:
    buf = stored(5, b"hello", {"KEYS": "k1", "TAGS": "A", "UNIQ_KEY": "X", "h": "v"}) + \
        stored(6, zlib.compress(b"x" * 5000), {"TAGS": "B"}, sys_flag=0x1 | (3 << 8))
    a, b = decode_messages(buf)
    assert (a.queue_id, a.queue_offset, a.body, a.key, a.tag, a.topic) == (3, 5, b"hello", b"k1", "A", "t")
    assert a.headers == [("h", b"v")]  # system properties are not headers
    assert (a.born_timestamp, a.store_timestamp) == (1000, 2000)
    assert (b.queue_offset, b.body, b.tag) == (6, b"x" * 5000, "B")  # zlib, as Java compresses


def test_a_body_compressed_with_a_missing_codec_is_reported_not_garbage() -> None:
    (m,) = decode_messages(stored(0, b"\x04\x22\x4d\x18junk", {}, sys_flag=0x1 | (1 << 8)))
    assert m.body is None and m.error


def test_null_and_empty_values_round_trip() -> None:
    for value, mark in ((None, "null"), (b"", "empty")):
        props = properties(OutgoingMessage(value, b"k"))
        assert props[VALUE_MARK] == mark
        (m,) = decode_messages(stored(0, b"\0", props))
        assert m.value == value and m.headers == []
    props = properties(OutgoingMessage(b"v", b"k"))
    assert VALUE_MARK not in props


def test_properties_round_trip() -> None:
    props = {"a": "1", "b": "x y"}
    assert parse_properties(format_properties(props)) == props


@pytest.mark.parametrize("m", [
    OutgoingMessage(b"v", headers=[("h", b"\xff")]),  # not UTF-8
    OutgoingMessage(b"v", headers=[("h", b"1"), ("h", b"2")]),  # repeated
    OutgoingMessage(b"v", headers=[("KEYS", b"x")]),  # a system property
    OutgoingMessage(b"v", headers=[("h", b"a\x01b")]),  # a separator
    OutgoingMessage(b"v", headers=[("h", b"")]),  # RocketMQ keeps no empty property
    OutgoingMessage(b"v", key=b"\xff\xfe"),
    OutgoingMessage(b"v", tag="A||B"),
])
def test_records_rocketmq_cannot_carry_are_refused(m: OutgoingMessage) -> None:
    with pytest.raises(InvalidRecord):
        properties(m)


def test_names_map_dots_both_ways_and_groups_fit_120() -> None:
    assert to_broker_name("mqgw.retry.a-b_c") == "mqgw|retry|a-b_c"
    assert from_broker_name(to_broker_name("a.b.c")) == "a.b.c"
    assert to_broker_name("plain_Topic-1") == "plain_Topic-1"  # RocketMQ names map to themselves
    long = "mqgw." + "c" * 200
    g = group_name(long)
    assert len(g) == 120 and g != group_name(long + "x") and g == group_name(long)


def test_message_ids_are_32_hex_digits_and_unique() -> None:
    ids = {new_unique_key() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
