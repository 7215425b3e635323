"""Reading Kafka at explicit offsets through a pool of long-lived consumers.

Seeking a librdkafka consumer throws away what it prefetched and costs a fetch round
trip (plus parsing up to ``fetch.max.bytes`` of records to use a few). So each pooled
consumer stays assigned to the partition it last read, and the next read of that
partition goes to it: at its position it serves straight from memory; a little ahead
of it (another gateway process served the batch in between) it skips forward through
records it already holds. Only a read behind it (a redelivery) or far ahead seeks.
A read cut short by a byte limit keeps the records it took but did not return (``held``), so
the next batch, which starts at the first of them, is served from there without a seek.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ..base import BrokerUnavailable, Record, UnknownTopic, fitting
from .errors import UNKNOWN_CODES

_OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}
#: How long a read waits for the first record of a queue believed to have a backlog.
FETCH_WAIT_S = 1.0
#: With records in hand, how long a read waits for more before it returns them: about one fetch
#: round trip (fetch.wait.max.ms is 10). It used to wait up to FETCH_WAIT_S for a full batch, so
#: a read of a partition that producers kept writing took a second (measured: the delay relay's
#: reads of its level topics, 1,031-1,061 ms each, and records late by as much).
FOLLOW_WAIT_S = 0.01
#: A consumer asks for a topic's metadata again (before an assign) after this long.
KNOWN_TOPIC_S = 300.0
#: Skip forward through at most this many held records before seeking instead.
SKIP_AHEAD = 5000


#: A pooled consumer unused this long gives up its partition. An assigned consumer at the end of
#: its partition asks the broker for more every ``fetch.wait.max.ms`` (10 ms) for as long as it
#: stays assigned: 3 idle nodes (2 workers, 16 pooled consumers each) kept the broker at 63 % of a
#: core with no client at all (bench/idle.py, Tansu). Parked, a consumer costs nothing; the next
#: read of its partition pays one assignment (a fetch round trip), as a cold one does.
PARK_AFTER_S = 2.0

#: Larger reads stay in the thread pool: building that many records on the event loop delays
#: every other request of the process (measured: f1000 /message p99 doubled).
INLINE_MAX = 100


@dataclass(slots=True)
class RawRead:
    """One read as librdkafka saw it; :mod:`.reads` turns it into the port's FetchResult."""

    records: list[Record]
    #: High watermark learned from the fetch response, -1 if unknown.
    high_watermark: int = -1
    #: The requested offset is below the earliest retained one; ``low_watermark`` says where data starts.
    out_of_range: bool = False
    low_watermark: int = -1
    #: With no records: the offset the broker says the readable log ends at, when it is above the
    #: requested one (offsets taken by transaction markers or aborted records), else -1.
    end_offset: int = -1


#: A read interrupted by WouldBlock: (reading from the consumer's position, records so far, deadline).
ReadState = tuple[bool, list[Record], float]


class WouldBlock(Exception):
    """A non-blocking read has to wait for the broker: finish it in the thread pool."""

    def __init__(self, state: ReadState | None) -> None:
        self.state = state


class PooledConsumer:
    __slots__ = ("at_eof", "consumer", "held", "known", "partition", "position", "topic", "used")

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        #: Topics whose metadata this consumer asked for, and when (monotonic s).
        self.known: dict[str, float] = {}
        self.topic = ""
        self.partition = -1
        self.position = -1  # next offset this consumer returns without a seek; -1 unknown
        self.at_eof = False  # it reported end-of-partition at ``position``
        #: Records it consumed up to ``position`` but did not return (a read cut by max_bytes).
        self.held: list[Record] = []
        self.used = 0.0

    def can_continue_to(self, topic: str, partition: int, offset: int) -> bool:
        if self.topic != topic or self.partition != partition or self.position < 0:
            return False
        if self.held and self.held[0].offset <= offset < self.position:
            return True
        return not self.at_eof and self.position <= offset <= self.position + SKIP_AHEAD

    def reset(self, topic: str = "", partition: int = -1) -> None:
        """Forget where it stands (it is reassigned, or parked)."""
        self.topic, self.partition, self.position, self.at_eof, self.held = \
            topic, partition, -1, False, []


class FetchPool:
    def __init__(self, make_consumer: Callable[[], Consumer], size: int,
                 run: Callable[..., Any]) -> None:
        self._all = [PooledConsumer(make_consumer()) for _ in range(size)]
        self._idle = list(self._all)
        self._cond = asyncio.Condition()
        self._run = run  # runs a blocking call in the broker's thread pool
        self._sweeper: asyncio.Task[None] | None = None

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for pc in self._all:
            pc.consumer.close()

    async def _sweep(self) -> None:
        """Park consumers that nobody used for PARK_AFTER_S (runs while the pool exists)."""
        while True:
            await asyncio.sleep(PARK_AFTER_S / 2)
            await self.park_idle(PARK_AFTER_S)

    async def park_idle(self, older_than_s: float) -> int:
        """Unassign idle consumers last used more than ``older_than_s`` ago; how many."""
        cutoff = time.monotonic() - older_than_s
        async with self._cond:
            stale = [pc for pc in self._idle if pc.topic and pc.used < cutoff]
            for pc in stale:
                self._idle.remove(pc)
        for pc in stale:
            try:
                await self._run(pc.consumer.unassign)
            except KafkaException:
                pass  # it is reassigned (or the pool closed) on next use either way
            finally:
                pc.reset()
                async with self._cond:
                    self._idle.append(pc)
                    self._cond.notify()
        return len(stale)

    async def fetch(self, topic: str, partition: int, offset: int, max_records: int,
                    stop_at_holes: bool = True, max_bytes: int = 0) -> RawRead:
        if self._sweeper is None:  # made here: the pool is built before the event loop runs it
            self._sweeper = asyncio.ensure_future(self._sweep())
        pc = await self._acquire(topic, partition)
        try:
            if max_records <= INLINE_MAX and pc.can_continue_to(topic, partition, offset):
                # It probably holds the records already: read them right here. A thread-pool hop
                # (thread wake-up + GIL hand-off) costs more than the read itself.
                try:
                    return read(pc, topic, partition, offset, max_records, blocking=False,
                                stop_at_holes=stop_at_holes, max_bytes=max_bytes)
                except WouldBlock as wb:
                    done: RawRead = await self._run(read, pc, topic, partition, offset,
                                                    max_records, True, wb.state, stop_at_holes,
                                                    max_bytes)
                    return done
            res: RawRead = await self._run(read, pc, topic, partition, offset, max_records, True,
                                           None, stop_at_holes, max_bytes)
            return res
        finally:
            async with self._cond:
                pc.used = time.monotonic()
                self._idle.append(pc)
                self._cond.notify()

    async def _acquire(self, topic: str, partition: int) -> PooledConsumer:
        """The idle consumer already on this partition, else the least recently used one."""
        async with self._cond:
            while not self._idle:
                await self._cond.wait()
            mine = [pc for pc in self._idle if pc.topic == topic and pc.partition == partition]
            pc = mine[0] if mine else min(self._idle, key=lambda c: c.used)
            self._idle.remove(pc)
            return pc


def read(pc: PooledConsumer, topic: str, partition: int, offset: int, max_records: int,
         blocking: bool = True, state: ReadState | None = None,
         stop_at_holes: bool = True, max_bytes: int = 0) -> RawRead:
    """Return up to ``max_records`` readable from ``offset`` now (``max_bytes``: no more than
    ``fitting`` keeps; the rest stays ``held``). Blocking (in a thread) by default; with
    ``blocking`` False it raises WouldBlock, carrying what it read so far as the ``state`` to
    continue from, instead of waiting. ``stop_at_holes`` ends the batch before an offset missing
    inside it, for a caller that re-checks holes (:mod:`.reads`)."""
    c = pc.consumer
    tp = TopicPartition(topic, partition, offset)
    eof = False
    if state is None:
        reused = pc.can_continue_to(topic, partition, offset)
        records: list[Record] = []
        if reused and offset < pc.position:  # it starts in what the last read held back
            records = [r for r in pc.held if r.offset >= offset]
            eof = pc.at_eof  # nothing was left past them then: return these, wait for nothing
        elif reused and pc.position < offset:
            reused, records = _skip_to(pc, offset, stop_at_holes)
        if not reused:
            _learn(pc, topic)
            c.assign([tp])
        pc.reset(topic, partition)
        deadline = time.monotonic() + FETCH_WAIT_S
    else:
        reused, records, deadline = state
    error: KafkaError | None = None
    gap = dropped = False
    eof_offset = -1
    while len(records) < max_records and not (eof or gap or error or (
            max_bytes and fitting(records, max_bytes) < len(records))):
        # Take what is already queued without blocking; block only for the first new message.
        msgs = c.consume(max_records - len(records), 0)
        if not msgs and not blocking:
            raise WouldBlock((reused, records, deadline))
        if not msgs:
            remaining = deadline - time.monotonic()
            if records:  # only the first record is waited for; then what follows at once
                remaining = min(remaining, FOLLOW_WAIT_S)
            m = c.poll(remaining) if remaining > 0 else None
            if m is None:
                break
            msgs = [m]
        for i, m in enumerate(msgs):
            err = m.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF and not records and reused:
                # An EOF left over from the previous batch on this consumer: look again afresh.
                c.assign([tp])
                reused = False
                deadline = time.monotonic() + FETCH_WAIT_S
                break
            if err is not None:
                eof = err.code() == KafkaError._PARTITION_EOF
                error = None if eof else err
                eof_offset = _offset(m) if eof else -1
            elif stop_at_holes and records and m.offset() != records[-1].offset + 1:
                gap = True  # a hole inside the batch: stop before it so the caller re-checks it
            else:
                records.append(_record(m))
                continue
            dropped = gap or i + 1 < len(msgs)
            break
    held: list[Record] = []
    if (n := min(max_records, fitting(records, max_bytes))) < len(records):
        records, held = records[:n], records[n:]  # (more than max_records: held ones, reused)
    if records and error is None and not dropped:
        pc.position, pc.at_eof, pc.held = (held or records)[-1].offset + 1, eof, held
    try:
        hw = c.get_watermark_offsets(TopicPartition(topic, partition), cached=True)[1]
    except KafkaException:
        hw = -1
    if error is not None and not records:
        if not blocking:
            raise WouldBlock(None)  # handling it may wait on the broker: redo the read in a thread
        if error.code() in _OUT_OF_RANGE:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
            return RawRead([], hi, out_of_range=True, low_watermark=lo)
        if error.code() in UNKNOWN_CODES:
            raise UnknownTopic(topic)
        raise BrokerUnavailable(str(error))
    end = eof_offset if not records and eof_offset > offset else -1
    return RawRead(records, hw if hw is not None and hw >= 0 else -1, end_offset=end)


def _learn(pc: PooledConsumer, topic: str) -> None:
    """Ask for the topic's metadata before the first assign of it on this consumer. Measured on
    Apache Kafka 4.1 (librdkafka 2.x): the first record of a partition of a topic the consumer
    had not seen came ~1,000 ms after the assign (its metadata waits for the next periodic
    refresh); after a metadata request, 27-85 ms, and 13-22 ms on later assigns. The delay relay
    moves among dozens of level topics, and every such read held its records a second."""
    now = time.monotonic()
    if now - pc.known.get(topic, -KNOWN_TOPIC_S) < KNOWN_TOPIC_S:
        return
    try:
        pc.consumer.list_topics(topic, timeout=5)
    except KafkaException:
        return  # the assign finds out, as before
    if len(pc.known) >= 1000:
        pc.known.clear()
    pc.known[topic] = now


def _skip_to(pc: PooledConsumer, offset: int, stop_at_holes: bool) -> tuple[bool, list[Record]]:
    """Discard held records below ``offset``; (False, []) means: seek instead.

    Records at or past ``offset`` met on the way are kept: they start the batch.
    """
    c = pc.consumer
    pos = pc.position
    while pos < offset:
        msgs = c.consume(min(offset - pos, 1000), 0)
        if not msgs:
            return False, []  # nothing held: a seek costs the same round trip and is simpler
        for i, m in enumerate(msgs):
            if m.error() is not None:
                return False, []
            if _offset(m) >= offset:
                kept = [_record(x) for x in msgs[i:] if x.error() is None]
                if len(kept) != len(msgs) - i or (stop_at_holes and any(
                        b.offset != a.offset + 1 for a, b in pairwise(kept))):
                    return False, []
                return True, kept
            pos = _offset(m) + 1
    return True, []


def _offset(m: Any) -> int:
    """A message's offset (the stubs say it may be None: never for a consumed message)."""
    o = m.offset()
    return -1 if o is None else int(o)


def _record(m: Any) -> Record:
    """The port's record of a consumed message. ``headers()`` is the message's own list
    (shared, not copied: nothing changes a Record's headers), or None: the empty tuple then,
    which the cyclic GC never tracks. A max=1000
    read builds a thousand of these, and GC-tracked objects per record were a quarter of a
    worker's CPU in the f1000 phase (BENCHMARKS.md, issue 23; bench/record_cpu.py)."""
    ts_type, ts = m.timestamp()
    return Record(m.offset(), m.key(), m.value(), m.headers() or (), ts if ts_type else -1)
