"""Topics: creating them on every master, listing and describing them.

RocketMQ counts queues per broker: a topic made with N queues has N on each master (one broker
in most test set-ups, so N in all). UPDATE_AND_CREATE_TOPIC is an idempotent create-or-update,
so "exists" is decided from the route first. The broker registers a new topic with the name
servers at once; the topic is ready when its route lists it and each queue answers.
"""

from __future__ import annotations

import asyncio
import re
import time

from ..base import BrokerUnavailable, QueueInfo, TopicExists, TopicInfo, TopicRefused, UnknownTopic
from .client import Client, Route, check
from .codes import DEFAULT_TOPIC, Req
from .message import TOPIC_MAX, to_broker_name

_VALID = re.compile(r"[%|A-Za-z0-9_-]+")
#: RocketMQ's own topics (``TopicValidator.SYSTEM_TOPIC_SET`` and prefixes): listed by the admin
#: API only when asked.
SYSTEM_TOPICS = frozenset({
    DEFAULT_TOPIC, "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "TRANS_CHECK_MAXTIME_TOPIC",
})
SYSTEM_PREFIXES = ("%", "rmq_sys_", "RMQ_SYS_", "rocketmq-broker-")


def is_system_topic(topic: str, own: set[str] | frozenset[str]) -> bool:
    """RocketMQ's own topic: the system ones (the timer log ``rmq_sys_wheel_timer`` holds every
    pending timer record of every topic; ``SCHEDULE_TOPIC_XXXX`` the delay levels'), and those
    each broker registers after itself and its cluster (``own``: their names, and the cluster's
    reply topics)."""
    name = to_broker_name(topic)
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_PREFIXES) or name in own \
        or (name.endswith("_REPLY_TOPIC") and name[:-len("_REPLY_TOPIC")] in own)


def check_name(topic: str) -> str:
    """RocketMQ's spelling of ``topic``, or :class:`TopicRefused` when RocketMQ cannot have it."""
    name = to_broker_name(topic)
    if not _VALID.fullmatch(name) or len(name) > TOPIC_MAX:
        raise TopicRefused("invalid_topic", f"RocketMQ topic names are up to {TOPIC_MAX} "
                           "characters of letters, digits, '.', '_' and '-'")
    return name


class Topics:
    def __init__(self, client: Client, watermarks: WatermarkReader) -> None:
        self._client = client
        self._wm = watermarks

    async def exists(self, topic: str) -> bool:
        try:
            await self._client.route(topic, fresh=True)
            return True
        except UnknownTopic:
            return False

    async def create(self, topic: str, queues: int, replication: int | None, timeout_s: float,
                     compacted: bool = False) -> None:
        name = check_name(topic)
        if replication not in (None, 1, -1):
            raise TopicRefused("invalid_replication_factor", "RocketMQ replicates whole brokers "
                               "(master and slaves), not topics: leave replication out")
        if queues < 1 or queues > 1024:
            raise TopicRefused("invalid_partitions", "a RocketMQ topic has 1 to 1024 queues per broker")
        if await self.exists(topic):
            raise TopicExists(topic)
        await self._make(topic, name, queues, timeout_s, compacted)

    async def ensure(self, topics: dict[str, int], timeout_s: float, compacted: bool) -> None:
        for topic, queues in topics.items():
            if not await self.exists(topic):
                await self._make(topic, check_name(topic), queues, timeout_s, compacted)

    async def _make(self, topic: str, name: str, queues: int, timeout_s: float,
                    compacted: bool) -> None:
        masters = await self._client.masters()
        if not masters:
            raise BrokerUnavailable("no RocketMQ broker is registered with the name servers")
        ext = {"topic": name, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": str(queues),
               "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG",
               "topicSysFlag": "0", "order": "false"}
        if compacted:
            ext["attributes"] = "+cleanup.policy=COMPACTION"
        for addr in masters.values():
            check(await self._client.call(addr, Req.UPDATE_AND_CREATE_TOPIC, ext), f"create {topic}")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                route = await self._client.route(topic, fresh=True)
                if len(route.readable()) >= queues * len(masters):
                    await self._wm.read(topic, route)
                    return
            except (UnknownTopic, BrokerUnavailable):
                pass
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"topic {topic} was created but its queues do not serve yet")
            await asyncio.sleep(0.05)

    async def describe(self, names: list[str] | None) -> list[TopicInfo]:
        known = await self._client.topic_names() if names is None else names
        # Each broker registers topics named after itself and its cluster (and the cluster's
        # reply topic): the broker's own, like SYSTEM_TOPICS.
        own = await self._client.own_names()
        out = await asyncio.gather(*(self._describe_one(t, names is not None, own) for t in known))
        return [t for t in out if t is not None]

    async def _describe_one(self, topic: str, named: bool, own: set[str]) -> TopicInfo | None:
        try:
            route = await self._client.route(topic, fresh=True)
        except UnknownTopic:
            if named:
                raise
            return None  # listed, but no queue serves reads (a broker's own name topic)
        try:
            wm = await self._wm.read(topic, route)
        except BrokerUnavailable:
            wm = {}
        internal = is_system_topic(topic, own)
        queues = tuple(QueueInfo(s.qid, *wm.get(s.qid, (-1, -1)), leader=0,
                                 replicas=tuple(sorted(int(i) for i in route.addrs.get(s.broker, {}))),
                                 in_sync=tuple(sorted(int(i) for i in route.addrs.get(s.broker, {}))))
                       for s in route.readable())
        return TopicInfo(topic, queues, internal)


class WatermarkReader:
    """Low (GET_MIN_OFFSET) and high (GET_MAX_OFFSET) watermarks of every readable queue, asked
    concurrently. The high watermark is the next dispatched offset: it lags an acknowledged send
    by a few records for a few ms (measured; longer under load), so a fetch right after a
    produce can find nothing and a long poll sees the records within about
    ``metadata_refresh_ms``, as docs/api.md promises on every broker. Nothing cheaper says how
    far a queue is written: 5.5 ignores GET_MAX_OFFSET's ``committed=false`` (AdminBrokerProcessor
    asks the consume queue either way) and GET_BROKER_RUNTIME_INFO, which has the dispatch lag,
    took ~21 ms an answer (measured)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def read(self, topic: str, route: Route | None = None) -> dict[str, tuple[int, int]]:
        route = route or await self._client.route(topic)
        slots = route.readable()
        name = to_broker_name(topic)

        async def one(code: int, addr: str, qid: int) -> int:
            return int(check(await self._client.call(addr, code, {"topic": name, "queueId": str(qid)}),
                             f"offsets of {topic}").ext["offset"])
        got = await asyncio.gather(*(one(c, route.masters[s.broker], s.queue_id) for s in slots
                                     for c in (Req.GET_MIN_OFFSET, Req.GET_MAX_OFFSET)))
        return {s.qid: (got[2 * i], got[2 * i + 1]) for i, s in enumerate(slots)}
