"""Kafka adapter on confluent-kafka (librdkafka), written for Apache Kafka semantics.

The Broker port over modules of one job each: :mod:`.clients` (the librdkafka clients and their
lifecycle), :mod:`.metadata` (partitions, watermarks, descriptions), :mod:`.topics` (creating
topics), :mod:`.fetch` and :mod:`.reads` (pooled reads and Kafka's offset rules),
:mod:`.produce` (writes), :mod:`.groups` (offset checkpoints in consumer groups) and
:mod:`.errors` (librdkafka's errors in the port's terms).
"""

from __future__ import annotations

from ..base import (
    Broker,
    Capability,
    FetchResult,
    OutgoingMessage,
    ProduceResult,
    TopicInfo,
)
from .clients import Clients, common_conf
from .groups import CheckpointGroups
from .metadata import Metadata, is_own_topic
from .produce import Sender
from .reads import read_checked
from .topics import TopicMaker
from .transactions import TransactionalWriters


class KafkaBroker(Broker):
    """Kafka's offset rules live in :mod:`.reads`: retention, compaction and transaction-marker
    holes, and the re-check that tells those from a fetch racing a producer at the tail."""

    capabilities = frozenset({Capability.OUT_OF_RETENTION, Capability.OFFSET_CHECKPOINT,
                              Capability.EXACTLY_ONCE})

    def __init__(self, bootstrap: str, *, extra: dict[str, str] | None = None, pool_size: int = 8,
                 max_batch: int = 1000, produce_timeout_ms: int = 30_000, produce_linger_ms: int = 2,
                 gap_recheck_ms: int = 30, replication: int = -1, name: str = "kafka") -> None:
        self.name = name
        self._gap_recheck_s = gap_recheck_ms / 1000
        self._clients = Clients(common_conf(bootstrap, extra), pool_size=pool_size,
                                max_batch=max_batch, produce_timeout_ms=produce_timeout_ms,
                                produce_linger_ms=produce_linger_ms)
        self._metadata = Metadata(self._clients)
        self._topic_maker = TopicMaker(self._clients, self._metadata, replication)
        self._groups = CheckpointGroups(self._clients)
        self._sender = Sender(self._clients)
        self._writers = TransactionalWriters(self._clients, self._groups, produce_timeout_ms)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._clients.start()

    async def close(self) -> None:
        if not self._clients.running:
            return
        await self._clients.close()
        self._writers.close()
        self._groups.close()

    async def write_once(self, group: str, source_topic: str, source_queue: str, start: int,
                         end: int, batches: dict[str, list[OutgoingMessage]],
                         ) -> dict[str, list[ProduceResult]]:
        return await self._writers.write(group, source_topic, source_queue, start, end, batches)

    # -- metadata -------------------------------------------------------------------------
    def owns_topic(self, topic: str) -> bool:
        return is_own_topic(topic)

    async def queues(self, topic: str) -> list[str]:
        return [str(p) for p in await self._metadata.partitions(topic)]

    async def topics(self, prefix: str) -> set[str]:
        return await self._metadata.topics(prefix)

    async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        return await self._metadata.watermarks(topic)

    async def offset_for_time(self, topic: str, queue: str, timestamp_ms: int) -> int:
        return await self._metadata.offset_for_time(topic, queue, timestamp_ms)

    async def ping(self) -> None:
        await self._metadata.ping()

    async def describe_topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        return await self._metadata.describe_topics(names)

    async def broker_ids(self) -> list[int]:
        return await self._metadata.broker_ids()

    # -- topic creation -------------------------------------------------------------------
    async def ensure_topics(self, topics: dict[str, int], timeout_s: float = 30.0,
                            compacted: bool = False) -> None:
        await self._topic_maker.ensure(topics, timeout_s, compacted)

    async def create_topic(self, name: str, queues: int, replication: int | None = None,
                           timeout_s: float = 30.0) -> None:
        await self._topic_maker.create(name, queues, replication, timeout_s)

    # -- offset checkpoints -----------------------------------------------------------------
    async def save_offsets(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        await self._groups.save(group, topic, offsets)

    async def load_offsets(self, group: str, topic: str,
                           queues: list[str] | None = None) -> dict[str, int]:
        # With the queues given, no metadata request: a herd of restores made one each, and they
        # queued in the shared pool ahead of produce and fetch calls.
        parts = [int(q) for q in queues] if queues \
            else await self._metadata.partitions(topic, fresh=True)
        return await self._groups.load(group, topic, parts)

    async def forget_offsets(self, group: str) -> None:
        await self._groups.forget(group)

    # -- fetch and produce ------------------------------------------------------------------
    async def fetch(self, topic: str, queue: str, offset: int, max_records: int,
                    tags: frozenset[str] | None = None, max_bytes: int = 0) -> FetchResult:
        """Read at ``offset`` through the pool; offsets skipped at the start are reported in
        ``skipped``. ``gap_recheck_ms`` > 0: holes are looked at again (:mod:`.reads`)."""
        trust = self._gap_recheck_s <= 0
        pool = self._clients.pool
        return await read_checked(
            lambda at: pool.fetch(topic, int(queue), at, max_records, stop_at_holes=not trust,
                                  max_bytes=max_bytes),
            offset, self._gap_recheck_s)

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        return await self._sender.produce(topic, messages, urgent)
