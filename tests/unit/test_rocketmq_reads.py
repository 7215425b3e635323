"""RocketMQ's pull answers in the port's terms (gateway/broker/rocketmq/reads.py), with the
broker's answers scripted: what the gateway commits past, and what it never moves back over."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker import SkipReason
from gateway.broker.rocketmq.codes import Resp
from gateway.broker.rocketmq.reads import pull
from gateway.broker.rocketmq.remoting import Command

from ..support.rocketmq_records import stored

pytestmark = pytest.mark.anyio


class Scripted:
    """A Client whose pulls answer from a list, recording the offsets asked for."""

    def __init__(self, *answers: Command) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    async def master_of(self, topic: str, queue: str) -> tuple[str, int]:
        return "127.0.0.1:1", 0

    async def call(self, addr: str, code: int, ext: dict[str, str] | None = None,
                   body: bytes = b"", wait_s: float | None = None) -> Command:
        assert ext is not None
        self.asked.append(int(ext["queueOffset"]))
        return self.answers.pop(0)

    def forget(self, topic: str) -> None:
        pass


def answer(code: int, nxt: int, lo: int = 0, hi: int = 100, body: bytes = b"") -> Command:
    return Command(code, {"nextBeginOffset": str(nxt), "minOffset": str(lo), "maxOffset": str(hi)},
                   body, flag=1)


def records(*offsets: int, tag: str = "A") -> bytes:
    return b"".join(stored(o, b"v%d" % o, {"TAGS": tag}) for o in offsets)


async def read(client: Scripted, offset: int, n: int = 10, tags: Any = None,
               max_bytes: int = 0) -> Any:
    return await pull(client, None, "g", "t", "broker-a.0", offset, n, tags,  # type: ignore[arg-type]
                      max_bytes)


async def test_records_and_the_next_offset() -> None:
    c = Scripted(answer(Resp.SUCCESS, 13, hi=13, body=records(10, 11, 12)))
    r = await read(c, 10)
    assert [x.offset for x in r.records] == [10, 11, 12] and r.next_offset == 13
    assert r.high_watermark == 13 and r.skipped is None


async def test_a_read_over_32_takes_several_pulls() -> None:
    c = Scripted(answer(Resp.SUCCESS, 32, hi=40, body=records(*range(32))),
                 answer(Resp.SUCCESS, 40, hi=40, body=records(*range(32, 40))))
    r = await read(c, 0, 100)
    assert len(r.records) == 40 and c.asked == [0, 32] and r.next_offset == 40


async def test_a_stretch_the_tag_filter_refused_is_stepped_over_and_reported() -> None:
    c = Scripted(answer(Resp.PULL_RETRY_IMMEDIATELY, 50, hi=52),
                 answer(Resp.SUCCESS, 52, hi=52, body=records(50, 51)))
    r = await read(c, 10, tags=frozenset({"A"}))
    assert [x.offset for x in r.records] == [50, 51] and r.next_offset == 52
    assert r.skipped is not None and (r.skipped.start, r.skipped.end) == (10, 50)
    assert r.skipped.reason is SkipReason.GAP


async def test_the_hash_filter_letting_another_tag_through_is_rechecked() -> None:
    c = Scripted(answer(Resp.SUCCESS, 3, hi=3, body=records(0, tag="B") + records(1, 2)))
    r = await read(c, 0, tags=frozenset({"A"}))
    assert [x.offset for x in r.records] == [1, 2] and r.next_offset == 3


async def test_below_the_low_watermark_is_out_of_retention() -> None:
    c = Scripted(answer(Resp.PULL_OFFSET_MOVED, 20, lo=20, hi=21),
                 answer(Resp.SUCCESS, 21, lo=20, hi=21, body=records(20)))
    r = await read(c, 5)
    assert r.skipped is not None and r.skipped.reason is SkipReason.OUT_OF_RETENTION
    assert (r.skipped.start, r.skipped.end, r.next_offset) == (5, 20, 21)


async def test_nothing_there_and_an_offset_past_the_end_never_move_backwards() -> None:
    r = await read(Scripted(answer(Resp.PULL_NOT_FOUND, 7, hi=7)), 7)
    assert (r.records, r.next_offset, r.skipped) == ([], 7, None)
    # the queue was emptied or the store wiped: the broker says "start at 0"
    r = await read(Scripted(answer(Resp.PULL_OFFSET_MOVED, 0, hi=0)), 9)
    assert (r.records, r.next_offset, r.skipped) == ([], 9, None)


async def test_other_answers_are_the_brokers_failure() -> None:
    from gateway.broker import BrokerUnavailable, UnknownTopic

    with pytest.raises(BrokerUnavailable):
        await read(Scripted(answer(Resp.SYSTEM_ERROR, 0)), 0)
    with pytest.raises(UnknownTopic):
        await read(Scripted(answer(Resp.TOPIC_NOT_EXIST, 0)), 0)


async def test_the_rest_of_a_large_read_is_asked_at_once_and_a_short_answer_restarts_it() -> None:
    c = Scripted(answer(Resp.SUCCESS, 32, hi=100, body=records(*range(32))),
                 # pipelined at 32, 64, 96: the first ends short (the broker's byte limit)
                 answer(Resp.SUCCESS, 42, hi=100, body=records(*range(32, 42))),
                 answer(Resp.SUCCESS, 96, hi=100, body=records(*range(64, 96))),
                 answer(Resp.SUCCESS, 100, hi=100, body=records(*range(96, 100))),
                 # asked again from 42
                 answer(Resp.SUCCESS, 74, hi=100, body=records(*range(42, 74))),
                 answer(Resp.SUCCESS, 100, hi=100, body=records(*range(74, 100))))
    r = await read(c, 0, 100)
    assert [x.offset for x in r.records] == list(range(100)) and r.next_offset == 100
    assert c.asked == [0, 32, 64, 96, 42, 74]


async def test_a_byte_limit_ends_the_read_after_the_last_record_that_fits() -> None:
    """Values b"v10".. are 3 bytes: 7 bytes hold two. The pull after the limit is not made."""
    c = Scripted(answer(Resp.SUCCESS, 13, hi=100, body=records(10, 11, 12)))
    r = await read(c, 10, n=10, max_bytes=7)
    assert [x.offset for x in r.records] == [10, 11] and r.next_offset == 12
    assert c.asked == [10]
