"""The Kafka adapter's read rules over a raw read (gateway/broker/kafka/reads.py), no broker."""

from __future__ import annotations

import asyncio

from gateway.broker import Record, Skipped, SkipReason
from gateway.broker.kafka.fetch import RawRead
from gateway.broker.kafka.reads import read_checked


def test_leading_gap_is_refetched_once_before_it_is_accepted() -> None:
    """The Kafka adapter's rule (a fetch racing a producer at the tail can skip records that
    become readable a moment later): a hole at the start is accepted only after a re-read."""
    log = {o: Record(o, None, f"v{o}".encode(), [], 0) for o in range(6)}
    reads: list[int] = []
    hide = [3]

    async def raw(at: int) -> RawRead:  # the read as librdkafka returns it
        reads.append(at)
        recs = [log[o] for o in sorted(log) if o >= at][:10]
        hidden, hide[0] = hide[0], 0
        hi = max(log) + 1
        return RawRead(recs[hidden:], hi, end_offset=hi if not recs[hidden:] else -1)

    async def body() -> None:
        r = await read_checked(raw, 0, 0.005)  # the first read hides 3 records: a tail race
        assert [x.offset for x in r.records] == [0, 1, 2, 3, 4, 5] and r.skipped is None
        assert reads == [0, 0] and r.next_offset == 6
        # a real hole (compaction): accepted after one re-check and reported
        log.update({o: Record(o, None, v, [], 0) for o, v in ((6, b"a"), (7, b"b"), (8, b"c"))})
        del log[6], log[7]
        reads.clear()
        r = await read_checked(raw, 6, 0.005)
        assert r.skipped == Skipped(6, 8, SkipReason.GAP) and [x.value for x in r.records] == [b"c"]
        assert reads == [6, 6] and r.next_offset == 9
        # a trusted broker (Apache Kafka, gap_recheck_ms 0): the hole is final at the first read
        log.update({o: Record(o, None, b"x", [], 0) for o in (10, 12)})
        reads.clear()
        r = await read_checked(raw, 9, 0)
        assert r.skipped == Skipped(9, 10, SkipReason.GAP) and [x.offset for x in r.records] == [10, 12]
        assert reads == [9] and r.next_offset == 13
    asyncio.run(body())
