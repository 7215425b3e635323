"""The Broker port over Apache RocketMQ's remoting protocol.

Modules of one job each: :mod:`.remoting` (frames, connections), :mod:`.client` (name servers,
routes), :mod:`.message` (the stored format, properties, names), :mod:`.reads` (pulls and the
offset rules), :mod:`.produce`, :mod:`.topics`, :mod:`.groups` (checkpoints), :mod:`.timers`.

Queue ids are ``<broker name>.<queue number>``; offsets are consume-queue offsets. Names: the
gateway's '.' is RocketMQ's '|' (:func:`~.message.to_broker_name`).
"""

from __future__ import annotations

from ..base import (
    Broker,
    BrokerUnavailable,
    CancelRefused,
    Capability,
    FetchResult,
    OutgoingMessage,
    ProduceResult,
    TopicInfo,
)
from .client import Client, check
from .codes import Req
from .groups import Groups
from .message import TOPIC_MAX, to_broker_name
from .produce import Sender
from .reads import pull
from .timers import RecallRefused, TimerSettings, read_settings, recall
from .topics import Topics, WatermarkReader, is_system_topic

_BASE = frozenset({Capability.OUT_OF_RETENTION, Capability.OFFSET_CHECKPOINT, Capability.TAG_FILTER})


class RocketMQBroker(Broker):
    capabilities = _BASE
    max_topic_length = TOPIC_MAX

    def __init__(self, namesrv: str, *, reader_group: str = "mqgw_reader",
                 producer_group: str = "mqgw_producer", timeout_ms: int = 3000,
                 native_delay: bool = True, name: str = "rocketmq") -> None:
        self.name = name
        self._client = Client(namesrv, timeout_ms)
        self._reader_group = reader_group
        self._producer_group = producer_group
        self._native_delay = native_delay
        self._wm = WatermarkReader(self._client)
        self._topics = Topics(self._client, self._wm)
        self._groups = Groups(self._client)
        self._sender = Sender(self._client, producer_group)
        self.timers = TimerSettings()

    async def start(self) -> None:
        """Learn the brokers' timer settings: with timers and recall on every master, delays up
        to their limit are the broker's (cancellable); else the gateway's wheel holds them. A
        cluster that does not answer yet starts with the wheel."""
        try:
            self.timers = await read_settings(self._client)
        except BrokerUnavailable:
            self.timers = TimerSettings()
        native = self._native_delay and self.timers.enabled and self.timers.recall
        self.capabilities = _BASE | ({Capability.DELAYED_DELIVERY} if native else set())
        self.native_delay_max_ms = self.timers.max_delay_ms if native else 0

    def owns_topic(self, topic: str) -> bool:
        return is_system_topic(topic, self._client.known_own)

    async def close(self) -> None:
        await self._groups.close()
        await self._client.close()

    # -- metadata ---------------------------------------------------------------------------
    async def queues(self, topic: str) -> list[str]:
        return [s.qid for s in (await self._client.route(topic)).readable()]

    async def topics(self, prefix: str) -> set[str]:
        return {t for t in await self._client.topic_names() if t.startswith(prefix)}

    async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        return await self._wm.read(topic)

    async def offset_for_time(self, topic: str, queue: str, timestamp_ms: int) -> int:
        """The first offset stored at or after the time (RocketMQ searches store times, which
        the broker sets; Kafka's CreateTime is the producer's): the high watermark if none."""
        addr, qid = await self._client.master_of(topic, queue)
        resp = check(await self._client.call(addr, Req.SEARCH_OFFSET_BY_TIMESTAMP, {
            "topic": to_broker_name(topic), "queueId": str(qid), "timestamp": str(timestamp_ms)}),
            f"offset by time of {topic}")
        return int(resp.ext["offset"])

    async def ping(self) -> None:
        if not await self._client.masters():
            raise BrokerUnavailable("the name server knows no broker")

    async def describe_topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        return await self._topics.describe(names)

    async def ensure_topics(self, topics: dict[str, int], timeout_s: float = 30.0,
                            compacted: bool = False) -> None:
        await self._topics.ensure(topics, timeout_s, compacted)

    async def create_topic(self, name: str, queues: int, replication: int | None = None,
                           timeout_s: float = 30.0) -> None:
        await self._topics.create(name, queues, replication, timeout_s)

    # -- checkpoints -------------------------------------------------------------------------
    async def save_offsets(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        await self._groups.save(group, topic, offsets)

    async def load_offsets(self, group: str, topic: str,
                           queues: list[str] | None = None) -> dict[str, int]:
        return await self._groups.load(group, topic, queues or await self.queues(topic))

    async def forget_offsets(self, group: str) -> None:
        await self._groups.forget(group)

    # -- fetch, produce, cancel ----------------------------------------------------------------
    async def fetch(self, topic: str, queue: str, offset: int, max_records: int,
                    tags: frozenset[str] | None = None, max_bytes: int = 0) -> FetchResult:
        return await pull(self._client, self._groups, self._reader_group, topic, queue, offset,
                          max_records, tags, max_bytes)

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        return await self._sender.produce(topic, messages)

    async def cancel_delayed(self, topic: str, handle: str) -> None:
        try:
            await recall(self._client, self._producer_group, topic, handle)
        except RecallRefused as e:
            raise CancelRefused(e.too_late, str(e)) from None
