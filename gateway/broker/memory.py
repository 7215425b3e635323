"""An in-memory broker, shipped for tests and experiments (as dramatiq ships its StubBroker).

It follows the port's rules and nothing broker-specific: offsets may have holes (records
removed as compaction would), retention moves the low watermark, topics can grow queues, and
every read says where the next one starts. State lives in this object, so it serves one
process only (``MQGW_BROKER=memory`` with one worker).
"""

from __future__ import annotations

import time

from .base import (
    Broker,
    Capability,
    FetchResult,
    OutgoingMessage,
    ProduceError,
    ProduceResult,
    QueueInfo,
    Record,
    Skipped,
    SkipReason,
    TopicExists,
    TopicInfo,
    TopicRefused,
    UnknownTopic,
    check_queue_id,
    fitting,
)
from .partitioner import partition_for_key


class MemoryBroker(Broker):
    capabilities = frozenset({Capability.OUT_OF_RETENTION, Capability.OFFSET_CHECKPOINT})

    def owns_topic(self, topic: str) -> bool:
        """The stand-in broker keeps ``__``-named topics for itself, so the rule that refuses
        a broker's own topics everywhere is exercised in process."""
        return topic.startswith("__")

    def __init__(self, name: str = "memory", topics: dict[str, int] | None = None,
                 tags: bool = False) -> None:
        """``tags``: records carry tags and reads filter them (as RocketMQ's do)."""
        self.name = name
        if tags:
            self.capabilities = self.capabilities | {Capability.TAG_FILTER}
        self.logs: dict[str, dict[str, dict[int, Record]]] = {}
        self.low: dict[tuple[str, str], int] = {}
        self.end: dict[tuple[str, str], int] = {}  # the next offset to write (high watermark)
        self.fetches: list[tuple[str, str, int]] = []
        self.watermark_calls = 0
        self.groups: dict[str, dict[tuple[str, str], int]] = {}  # offset checkpoints
        for topic, queues in (topics or {}).items():
            self.create(topic, queues)

    # -- test controls ------------------------------------------------------------------------
    def create(self, topic: str, queues: int) -> None:
        """Create ``topic`` with queues "0".."queues-1", or add queues to it."""
        logs = self.logs.setdefault(topic, {})
        for q in range(queues):
            logs.setdefault(check_queue_id(str(q)), {})

    def append(self, topic: str, queue: str, *values: str | bytes, timestamp: int = 0) -> list[int]:
        log = self._log(topic, queue)
        out = []
        for v in values:
            off = self._hi(topic, queue)
            log[off] = Record(off, None, v.encode() if isinstance(v, str) else v, [], timestamp)
            self.end[(topic, queue)] = off + 1
            out.append(off)
        return out

    def delete_before(self, topic: str, queue: str, offset: int) -> None:
        """Retention: records below ``offset`` are gone."""
        log = self._log(topic, queue)
        for off in [o for o in log if o < offset]:
            del log[off]
        self.low[(topic, queue)] = offset

    def remove(self, topic: str, queue: str, *offsets: int) -> None:
        """Compaction: these offsets hold no record any more (the high watermark stays)."""
        for off in offsets:
            del self._log(topic, queue)[off]

    # -- the port --------------------------------------------------------------------------
    def _log(self, topic: str, queue: str) -> dict[int, Record]:
        if topic not in self.logs or queue not in self.logs[topic]:
            raise UnknownTopic(topic)
        return self.logs[topic][queue]

    def _hi(self, topic: str, queue: str) -> int:
        self._log(topic, queue)
        return max(self.end.get((topic, queue), 0), self.low.get((topic, queue), 0))

    async def ensure_topics(self, topics: dict[str, int], timeout_s: float = 30.0,
                            compacted: bool = False) -> None:  # kept whole: nothing is deleted
        for topic, queues in topics.items():
            if topic not in self.logs:
                self.create(topic, queues)

    async def describe_topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        for t in names or ():
            if t not in self.logs:
                raise UnknownTopic(t)
        return [TopicInfo(t, tuple(QueueInfo(q, self.low.get((t, q), 0), self._hi(t, q))
                                   for q in self.logs[t]))
                for t in (self.logs if names is None else names)]

    async def create_topic(self, name: str, queues: int, replication: int | None = None,
                           timeout_s: float = 30.0) -> None:
        if name in self.logs:
            raise TopicExists(name)
        if replication not in (None, 1):
            raise TopicRefused("invalid_replication_factor",
                               f"replication factor {replication} is more than the in-memory "
                               "broker's one copy")
        self.create(name, queues)

    async def topics(self, prefix: str) -> set[str]:
        return {t for t in self.logs if t.startswith(prefix)}

    async def queues(self, topic: str) -> list[str]:
        if topic not in self.logs:
            raise UnknownTopic(topic)
        return list(self.logs[topic])

    async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        self.watermark_calls += 1
        return {q: (self.low.get((topic, q), 0), self._hi(topic, q)) for q in await self.queues(topic)}

    async def offset_for_time(self, topic: str, queue: str, timestamp_ms: int) -> int:
        log = self._log(topic, queue)
        hits = [o for o in sorted(log) if log[o].timestamp >= timestamp_ms]
        return hits[0] if hits else self._hi(topic, queue)

    async def fetch(self, topic: str, queue: str, offset: int, max_records: int,
                    tags: frozenset[str] | None = None, max_bytes: int = 0) -> FetchResult:
        self.fetches.append((topic, queue, offset))
        res = self._fetch_tagged(topic, queue, offset, max_records, tags) if tags \
            else self._fetch(topic, queue, offset, max_records)
        if (n := fitting(res.records, max_bytes)) < len(res.records):
            res.records = res.records[:n]
            res.next_offset = res.records[-1].offset + 1
        return res

    def _fetch(self, topic: str, queue: str, offset: int, max_records: int) -> FetchResult:
        log = self._log(topic, queue)
        hi = self._hi(topic, queue)
        low = self.low.get((topic, queue), 0)
        if offset < low:  # retention took the start: read from the first retained record
            recs = [log[o] for o in sorted(log) if o >= low][:max_records]
            skipped: Skipped | None = Skipped(offset, low, SkipReason.OUT_OF_RETENTION)
            nxt = recs[-1].offset + 1 if recs else low
            return FetchResult(recs, nxt, hi, skipped)
        recs = [log[o] for o in sorted(log) if o >= offset][:max_records]
        first = recs[0].offset if recs else hi
        skipped = None
        if first > offset:  # a hole (compaction): always real here, nothing races a write
            skipped = Skipped(offset, first, SkipReason.GAP if recs else SkipReason.NO_RECORDS)
        nxt = recs[-1].offset + 1 if recs else max(first, offset)
        return FetchResult(recs, nxt, hi, skipped)

    def _fetch_tagged(self, topic: str, queue: str, offset: int, max_records: int,
                      tags: frozenset[str]) -> FetchResult:
        """Records of the tags only; the others are stepped over (reported as a gap)."""
        log = self._log(topic, queue)
        hi = self._hi(topic, queue)
        at = max(offset, self.low.get((topic, queue), 0))
        recs = [log[o] for o in sorted(log) if o >= at and log[o].tag in tags][:max_records]
        nxt = recs[-1].offset + 1 if len(recs) == max_records else hi
        end = recs[0].offset if recs else nxt
        skipped = Skipped(offset, end, SkipReason.GAP) if end > offset else None
        return FetchResult(recs, max(nxt, offset), hi, skipped)

    async def save_offsets(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        for q, off in offsets.items():
            self._log(topic, q)
            self.groups.setdefault(group, {})[(topic, q)] = off

    async def load_offsets(self, group: str, topic: str,
                           queues: list[str] | None = None) -> dict[str, int]:
        return {q: off for (t, q), off in self.groups.get(group, {}).items() if t == topic}

    async def forget_offsets(self, group: str) -> None:
        self.groups.pop(group, None)

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        out = []
        for m in messages:
            q = m.queue or "0"
            if m.queue is None and m.key is not None and topic in self.logs:
                q = str(partition_for_key(m.key, len(self.logs[topic])))  # where Java puts it
            if topic not in self.logs:
                out.append(ProduceResult(error_code=ProduceError.UNKNOWN_TOPIC, error=f"no topic {topic!r}"))
                continue
            if q not in self.logs[topic]:
                out.append(ProduceResult(error_code=ProduceError.UNKNOWN_PARTITION, error=f"no queue {q!r}"))
                continue
            off = self._hi(topic, q)
            ts = m.timestamp if m.timestamp is not None else int(time.time() * 1000)
            self.logs[topic][q][off] = Record(off, m.key, m.value, list(m.headers), ts, m.tag)
            self.end[(topic, q)] = off + 1
            out.append(ProduceResult(q, off))
        return out
