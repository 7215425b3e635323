"""The Kafka adapter's reads from a pooled consumer (gateway/broker/kafka/fetch.py): records
built from real ``confluent_kafka.Message`` objects (the type ``Consumer.consume`` returns), the
skip over records another worker served, holes and end-of-partition events. The consumer is a
stand-in holding messages, as librdkafka's holds what it prefetched; tests/system reads Kafka."""

from __future__ import annotations

import gc

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    Message,
    TopicPartition,
)

from gateway.broker.kafka.fetch import PooledConsumer, RawRead, WouldBlock, _record, read


def test_a_record_keeps_offset_key_value_headers_and_timestamp() -> None:
    m = Message(topic="t", partition=3, offset=41, key=b"k", value=b"v",
                headers=[("h", b"1"), ("h", b"2")], timestamp=(TIMESTAMP_CREATE_TIME, 1700))
    r = _record(m)
    assert (r.offset, r.key, r.value, r.timestamp, r.tag) == (41, b"k", b"v", 1700, None)
    assert list(r.headers) == [("h", b"1"), ("h", b"2")]


def test_no_headers_and_no_timestamp() -> None:
    """No headers: the empty tuple, not a new list per record: it is no object the cyclic GC
    tracks (a max=1000 read makes a thousand records; gateway/ops/gc_tuning.py)."""
    r = _record(Message(topic="t", offset=0, value=None, timestamp=(TIMESTAMP_NOT_AVAILABLE, 0)))
    assert r.headers == () and not gc.is_tracked(r.headers)
    assert (r.value, r.timestamp) == (None, -1)


class Held:
    """A stand-in for a pooled librdkafka consumer at its position: ``consume`` hands out the
    messages it holds; ``assign`` (a seek) is recorded and drops them, as librdkafka's does."""

    def __init__(self, msgs: list[Message], chunk: int = 1000) -> None:
        self.msgs = msgs
        self.chunk = chunk  # at most this many a call, as librdkafka hands out a fetch at a time
        self.assigned: list[int] = []

    def consume(self, n: int, timeout: float) -> list[Message]:
        n = min(n, self.chunk)
        out, self.msgs = self.msgs[:n], self.msgs[n:]
        return out

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned.append(tps[0].offset)
        self.msgs = []

    def list_topics(self, topic: str, timeout: float) -> None:
        pass

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, 100


def msg(offset: int) -> Message:
    return Message(topic="t", partition=0, offset=offset, value=b"v%d" % offset,
                   timestamp=(TIMESTAMP_CREATE_TIME, offset))


def eof(offset: int) -> Message:
    return Message(topic="t", partition=0, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


def at(held: Held, position: int) -> PooledConsumer:
    pc = PooledConsumer(held)  # type: ignore[arg-type]
    pc.topic, pc.partition, pc.position = "t", 0, position
    return pc


def offsets(r: RawRead) -> list[int]:
    return [x.offset for x in r.records]


def test_a_held_run_is_skipped_then_read_without_a_seek() -> None:
    held = Held([msg(o) for o in range(10, 30)])
    pc = at(held, 10)
    r = read(pc, "t", 0, 15, 10, blocking=False)
    assert offsets(r) == list(range(15, 25)) and held.assigned == []
    assert pc.position == 25 and r.high_watermark == 100


def test_a_hole_inside_the_batch_ends_it_before_the_hole() -> None:
    held = Held([msg(o) for o in (5, 6, 7, 9, 10)])
    r = read(at(held, 5), "t", 0, 5, 10, blocking=False)
    assert offsets(r) == [5, 6, 7]
    held = Held([msg(o) for o in (5, 6, 7, 9, 10)])
    r = read(at(held, 5), "t", 0, 5, 5, blocking=False, stop_at_holes=False)
    assert offsets(r) == [5, 6, 7, 9, 10]
    held = Held([msg(o) for o in (5, 6, 8, 9)], chunk=2)  # the hole between two calls
    assert offsets(read(at(held, 5), "t", 0, 5, 10, blocking=False)) == [5, 6]


def test_an_end_of_partition_event_ends_the_batch_and_is_remembered() -> None:
    held = Held([msg(5), msg(6), eof(7)])
    pc = at(held, 5)
    r = read(pc, "t", 0, 5, 10, blocking=False)
    assert offsets(r) == [5, 6] and (pc.position, pc.at_eof) == (7, True)


def test_an_event_among_the_skipped_records_means_a_seek() -> None:
    held = Held([msg(3), eof(4), msg(4), msg(5)])
    pc = at(held, 3)
    with pytest.raises(WouldBlock):  # the seek dropped what was held: the rest waits in a thread
        read(pc, "t", 0, 5, 10, blocking=False)
    assert held.assigned == [5]


def test_a_byte_limit_holds_the_cut_tail_for_the_next_batch_without_a_seek() -> None:
    """``max_bytes``: the batch ends where the limit says; the records consumed past it stay
    held, so the next batch (which starts at the first of them) needs no seek."""
    held = Held([msg(o) for o in range(10, 20)])  # values b"v10".. b"v19": 3 bytes each
    pc = at(held, 10)
    r = read(pc, "t", 0, 10, 10, blocking=False, max_bytes=7)
    assert offsets(r) == [10, 11] and held.assigned == []
    assert pc.position == 20 and [x.offset for x in pc.held] == list(range(12, 20))
    r = read(pc, "t", 0, 12, 3, blocking=False, max_bytes=100)
    assert offsets(r) == [12, 13, 14] and held.assigned == []


def test_held_records_then_more_from_the_consumer() -> None:
    held = Held([msg(o) for o in range(10, 16)], chunk=3)
    pc = at(held, 10)
    assert offsets(read(pc, "t", 0, 10, 10, blocking=False, max_bytes=3)) == [10]
    assert [x.offset for x in pc.held] == [11, 12] and pc.position == 13
    r = read(pc, "t", 0, 11, 5, blocking=False)  # the held two, then 13..15 from the consumer
    assert offsets(r) == [11, 12, 13, 14, 15] and held.assigned == [] and pc.held == []


def test_held_records_at_the_end_of_the_partition_are_served_without_waiting() -> None:
    held = Held([msg(5), msg(6), msg(7), eof(8)])
    pc = at(held, 5)
    assert offsets(read(pc, "t", 0, 5, 10, blocking=False, max_bytes=2)) == [5]
    assert pc.at_eof and pc.position == 8
    # no WouldBlock: the held records are all there was, and the event said so
    assert offsets(read(pc, "t", 0, 6, 10, blocking=False)) == [6, 7] and held.assigned == []


def test_a_read_behind_the_held_records_seeks_and_forgets_them() -> None:
    held = Held([msg(o) for o in range(10, 14)])
    pc = at(held, 10)
    read(pc, "t", 0, 10, 10, blocking=False, max_bytes=3)
    with pytest.raises(WouldBlock):  # a redelivery of 9: a seek, then a wait in a thread
        read(pc, "t", 0, 9, 10, blocking=False)
    assert held.assigned == [9] and pc.held == []
