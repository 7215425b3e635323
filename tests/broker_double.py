"""An in-memory broker for cases the test broker cannot produce (retention, compaction gaps,
added partitions). It implements the same interface as the Kafka adapter."""

from __future__ import annotations

from gateway.broker import Broker, FetchResult, OutgoingMessage, ProduceResult, Record, UnknownTopic


class MemoryBroker(Broker):
    name = "kafka"

    def __init__(self) -> None:
        self.logs: dict[str, dict[str, dict[int, Record]]] = {}
        self.low: dict[tuple[str, str], int] = {}
        self.hide_once: dict[tuple[str, str], int] = {}  # hide N leading records on the next fetch
        self.fetches: list[tuple[str, str, int]] = []
        self.watermark_calls = 0

    def create(self, topic: str, partitions: int) -> None:
        logs = self.logs.setdefault(topic, {})
        for p in range(partitions):
            logs.setdefault(str(p), {})

    def append(self, topic: str, queue: str, *values: str) -> None:
        log = self.logs[topic][queue]
        for v in values:
            off = len(log) + self.low.get((topic, queue), 0) if not log else max(log) + 1
            log[off] = Record(off, None, v.encode(), [], 0)

    def delete_before(self, topic: str, queue: str, offset: int) -> None:
        log = self.logs[topic][queue]
        for off in [o for o in log if o < offset]:
            del log[off]
        self.low[(topic, queue)] = offset

    def remove(self, topic: str, queue: str, *offsets: int) -> None:
        for off in offsets:
            del self.logs[topic][queue][off]

    def _log(self, topic: str, queue: str) -> dict[int, Record]:
        if topic not in self.logs:
            raise UnknownTopic(topic)
        return self.logs[topic][queue]

    def _hi(self, topic: str, queue: str) -> int:
        log = self._log(topic, queue)
        return max(log) + 1 if log else self.low.get((topic, queue), 0)

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

    async def fetch(self, topic: str, queue: str, offset: int, max_records: int) -> FetchResult:
        self.fetches.append((topic, queue, offset))
        log = self._log(topic, queue)
        low = self.low.get((topic, queue), 0)
        if offset < low:
            return FetchResult([], self._hi(topic, queue), out_of_range=True, low_watermark=low)
        recs = [log[o] for o in sorted(log) if o >= offset][:max_records]
        hide = self.hide_once.pop((topic, queue), 0)
        return FetchResult(recs[hide:], self._hi(topic, queue))

    async def produce(self, topic: str, messages: list[OutgoingMessage]) -> list[ProduceResult]:
        out = []
        for m in messages:
            q = str(m.partition or 0)
            self.append(topic, q, (m.value or b"").decode())
            out.append(ProduceResult(int(q), self._hi(topic, q) - 1))
        return out
