"""Dead letters: listing a consumer's dead-letter topic, and redriving what it holds.

A dead-letter topic is a topic like any other; what was redriven is remembered as the committed
offsets of the internal consumer :data:`CURSOR_CONSUMER` on it, in Redis, through the same
lock/commit scripts as ``/message``. So a redrive runs on any node, two redrives at once never
send a record twice (each holds the queue it moves), and one that dies half-way leaves its
queue uncommitted: the records are sent again, never lost. A range is always "the oldest not yet
redriven, up to an offset or a count", which keeps the cursor one offset per queue.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum

from ..broker import Broker, BrokerUnavailable, OutgoingMessage, Record, UnknownTopic
from ..config import Settings
from ..store import Lock, NeedsRestore, NoQueue, OffsetStore
from .checkpoint import Checkpoints
from .errors import invalid
from .names import INTERNAL_PREFIX, InternalTopics
from .produce import produce
from .retry import (
    H_ATTEMPT,
    H_CLIENT,
    H_CONSUMER,
    H_FAILED,
    H_FIRST,
    H_ORIGIN_OFFSET,
    H_ORIGIN_QUEUE,
    H_ORIGIN_TOPIC,
    H_ORIGIN_TS,
    OWN_HEADERS,
    RetryPolicy,
    header,
    retry_topic,
)
from .watermarks import Watermarks

#: The internal consumer whose committed offsets on a dead-letter topic mark what was redriven.
CURSOR_CONSUMER = f"{INTERNAL_PREFIX}.deadletters"
#: Records moved per lock (one read, one produce, one commit).
REDRIVE_BATCH = 500
#: What a record redriven to its consumer keeps of our headers: where it came from and its
#: history; its attempt starts again at 1.
_KEPT = frozenset({H_FIRST, H_FAILED, H_ORIGIN_TOPIC, H_ORIGIN_QUEUE, H_ORIGIN_OFFSET,
                   H_ORIGIN_TS, H_CLIENT, H_CONSUMER})


class RedriveTarget(str, Enum):
    CONSUMER = "consumer"  # the consumer's retry topic: only the consumer that failed it sees it
    TOPIC = "topic"  # the topic it was produced to: every consumer of that topic sees it again


@dataclass(frozen=True, slots=True)
class DeadQueue:
    queue: str
    redriven: int  # the cursor: offsets below it were redriven
    high: int  # the queue's end
    count: int  # records not yet redriven


@dataclass(frozen=True, slots=True)
class DeadPage:
    consumer: str
    topic: str  # the dead-letter topic
    exists: bool
    count: int
    oldest_ms: int  # when the oldest not yet redriven record failed for the last time; -1: none
    queues: list[DeadQueue]
    records: list[tuple[str, Record]]  # (queue, record), oldest first per queue


class DeadLetters:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 wm: Watermarks, checkpoints: Checkpoints | None = None) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.wm = wm
        #: The redrive positions (CURSOR_CONSUMER) are checkpointed like a consumer's: after a Redis
        #: loss a redrive resumes there instead of sending every dead letter again.
        self.checkpoints = checkpoints if checkpoints is not None and checkpoints.enabled else None

    async def topic_of(self, consumer: str) -> str:
        cfg = await self.store.get_config(consumer)
        return RetryPolicy.of(consumer, cfg, self.settings, self.broker.max_topic_length).dead_letter_topic

    async def _queues(self, topic: str) -> dict[str, tuple[int, int, int]]:
        """queue -> (low, cursor, high) of the dead-letter topic; {} if it does not exist."""
        try:
            wm = await self.broker.watermarks(topic)
        except UnknownTopic:
            return {}
        cursors = {q.queue: q.committed for q in await self.store.queue_states(CURSOR_CONSUMER)
                   if q.topic == topic and q.has_offset}
        return {q: (lo, max(lo, cursors.get(q, lo)), hi) for q, (lo, hi) in wm.items()}

    async def page(self, consumer: str, limit: int, queue: str | None = None,
                   offset: int | None = None) -> DeadPage:
        """Count, age and the first ``limit`` records not yet redriven (from ``offset`` of
        ``queue``, when given)."""
        topic = await self.topic_of(consumer)
        queues = await self._queues(topic)
        if queue is not None and queues and queue not in queues:
            raise invalid("invalid_partition", f"dead-letter topic {topic!r} has no partition {queue}")
        rows: list[DeadQueue] = []
        records: list[tuple[str, Record]] = []
        oldest = -1
        for q in sorted(queues, key=lambda q: int(q) if q.isdigit() else 0):
            _lo, cursor, hi = queues[q]
            mine = (queue is None or queue == q) and len(records) < limit
            start = max(cursor, offset) if mine and offset is not None else cursor
            # A read gives the queue's true end too: ListOffsets may not (Tansu under-reports end
            # offsets: the README's known limitations), and the page needs a read anyway.
            res = await self.broker.fetch(topic, q, start, limit - len(records) if mine else 1)
            hi = max(hi, res.high_watermark)
            rows.append(DeadQueue(q, cursor, hi, max(0, hi - cursor)))
            head = res.records[0] if res.records and start == cursor else None
            if head is None and hi > cursor and start != cursor:
                head = next(iter((await self.broker.fetch(topic, q, cursor, 1)).records), None)
            if head is not None:
                failed = header(head, H_FAILED)
                at = int(failed) if failed and failed.isdigit() else head.timestamp
                oldest = at if oldest < 0 else min(oldest, at)
            if mine:
                records += [(q, r) for r in res.records[:limit - len(records)]]
        return DeadPage(consumer, topic, bool(queues), sum(r.count for r in rows), oldest, rows,
                        records)

    async def redrive(self, consumer: str, target: RedriveTarget, queue: str | None = None,
                      to_offset: int | None = None, limit: int | None = None) -> int:
        """Send the oldest not yet redriven dead letters back (all of them; or those of
        ``queue`` below ``to_offset``; at most ``limit``); how many were sent."""
        topic = await self.topic_of(consumer)
        queues = await self._queues(topic)
        if not queues:  # no dead letter yet: the topic is made at the first
            return 0
        if queue is not None and queue not in queues:
            raise invalid("invalid_partition", f"dead-letter topic {topic!r} has no partition {queue}")
        skip = {q for q in queues if queue is not None and q != queue}
        moved = restores = 0
        while limit is None or moved < limit:
            wm = await self.wm.get(topic)
            want = min(REDRIVE_BATCH, limit - moved) if limit is not None else REDRIVE_BATCH
            chosen = await self.store.choose(
                CURSOR_CONSUMER, "", topic, self.wm.marks(topic) or wm, address="redrive",
                default_timeout_ms=self.settings.relay_lock_ms, default_start="earliest",
                client_idle_ms=self.settings.client_idle_ms, max_messages=want, open_mode=True,
                skip=skip, restore=self.checkpoints is not None)
            if isinstance(chosen, NeedsRestore) and self.checkpoints is not None:
                restores += 1
                if restores > 3:  # each restore seeds every queue: only a Redis emptied again
                    raise BrokerUnavailable("redrive positions being restored")  # and again
                await self.checkpoints.restore(CURSOR_CONSUMER, topic, chosen.start, wm)
                continue
            if not isinstance(chosen, Lock):
                if isinstance(chosen, NoQueue) and chosen.wake_ms >= 0:  # another redrive holds
                    await asyncio.sleep(0.05)  # a queue with records: wait for it to finish
                    continue
                break
            n, done = await self._move(consumer, topic, chosen, target, to_offset)
            moved += n
            if done:
                skip.add(chosen.queue)
        return moved

    async def _move(self, consumer: str, topic: str, lock: Lock, target: RedriveTarget,
                    to_offset: int | None) -> tuple[int, bool]:
        """Send one locked queue's next records and commit them; (sent, queue finished)."""
        start = lock.committed
        end = start
        try:
            res = await self.broker.fetch(topic, lock.queue, start, lock.allowance)
            records = [r for r in res.records if to_offset is None or r.offset < to_offset]
            end = records[-1].offset + 1 if records else (
                res.next_offset if to_offset is None else min(res.next_offset, to_offset))
            sent = await self._send(consumer, target, records) if records else 0
        except BaseException:
            await asyncio.shield(self.store.unlock(CURSOR_CONSUMER, "", topic, lock.queue, lock.token))
            raise
        if end > start:
            await self.store.ack(CURSOR_CONSUMER, "", topic, lock.queue, start, end, lock.token,
                                 default_timeout_ms=self.settings.relay_lock_ms,
                                 high_watermark=res.high_watermark)
        else:
            await self.store.unlock(CURSOR_CONSUMER, "", topic, lock.queue, lock.token)
        finished = not records or (to_offset is not None and end >= to_offset) \
            or end >= res.high_watermark >= 0
        return sent, finished

    async def _send(self, consumer: str, target: RedriveTarget, records: list[Record]) -> int:
        """Each record to its origin topic (headers of ours removed), or as attempt 1 to the
        retry topic of the consumer (and clientId) that failed it; how many were sent (a record
        no nack wrote names no origin: it is passed over)."""
        by_topic: dict[str, list[OutgoingMessage]] = {}
        internal = InternalTopics.of(self.settings, self.broker.owns_topic)
        for r in records:
            origin = header(r, H_ORIGIN_TOPIC)
            if origin is None or origin in internal:
                continue  # not written by a nack (or forged): nowhere to send it back to
            own = [(n, v) for n, v in r.headers if n not in OWN_HEADERS]
            if target is RedriveTarget.TOPIC:  # a new write: the broker's time, as for retries
                by_topic.setdefault(origin, []).append(OutgoingMessage(r.value, r.key, own, tag=r.tag))
                continue
            owner = header(r, H_CONSUMER) or consumer
            dest = retry_topic(self.settings.retry_topic_prefix, owner, origin,
                               header(r, H_CLIENT) or "", self.broker.max_topic_length)
            kept = [(n, v) for n, v in r.headers if n in _KEPT]
            by_topic.setdefault(dest, []).append(OutgoingMessage(
                r.value, r.key, [*own, *kept, (H_ATTEMPT, b"1")], tag=r.tag))
        if target is RedriveTarget.CONSUMER:
            await self.broker.ensure_topics(dict.fromkeys(by_topic, self.settings.retry_partitions))
        for dest, messages in by_topic.items():
            res = await produce(self.broker, dest, messages)
            bad = next((r for r in res.results if r.error_code), None)
            if bad is not None:  # nothing committed: the redrive can be run again
                raise BrokerUnavailable(f"redriving to {dest}: {bad.error}")
        return sum(len(m) for m in by_topic.values())

