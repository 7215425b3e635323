"""What a Kafka cluster says about its topics: partitions, watermarks, listings, descriptions.

Partition lists are cached for :data:`METADATA_TTL_S`; watermarks are asked for each time
(ListOffsets through the metadata consumer), and a partition whose leader is moving is asked again
after short pauses rather than failing the request at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ..base import BrokerUnavailable, QueueInfo, TopicInfo, UnknownTopic
from .clients import Clients
from .errors import error_of, is_leader_change, is_unknown

#: How long partition lists are trusted before new partitions are looked for.
METADATA_TTL_S = 5.0
#: Pauses before asking again when a partition's leader is moving (a broker restarted, a topic
#: just created): a /message then waits under a second instead of answering 503 at once.
LEADER_RETRY_S = (0.05, 0.2, 0.5)
#: Kafka's own topics (__consumer_offsets, __transaction_state, __share_group_state, ...) are
#: named so; the admin API lists them only when asked.
INTERNAL_PREFIX = "__"


def is_own_topic(topic: str) -> bool:
    """Kafka's own topic, or one that collides with them: Kafka takes '.' and '_' for one
    character (``_.consumer_offsets`` collides with ``__consumer_offsets``)."""
    return topic.replace(".", "_").startswith(INTERNAL_PREFIX)
#: How long the readiness probe waits for a metadata answer.
PING_TIMEOUT_S = 2.0
#: The timestamps ListOffsets answers with a partition's first offset and its high watermark.
LOG_START, LOG_END = -2, -1


class Metadata:
    """Metadata and offset look-ups over the process's clients."""

    def __init__(self, clients: Clients) -> None:
        self._clients = clients
        self._topics: dict[str, tuple[float, list[int]]] = {}  # topic: (when, partitions)
        self._probe: asyncio.Future[None] | None = None  # the readiness probe in flight

    async def partitions(self, topic: str, fresh: bool = False) -> list[int]:
        """The topic's partition ids (cached unless ``fresh``); raises :class:`UnknownTopic`."""
        cached = self._topics.get(topic)
        if cached and not fresh and time.monotonic() - cached[0] < METADATA_TTL_S:
            return cached[1]
        md = await self._clients.run(self._list_topic, topic)
        tm = md.topics.get(topic)
        if not md.brokers:  # (a broker just unfenced answers so for a moment): no verdict on
            raise BrokerUnavailable("the cluster's metadata lists no live broker")  # the topic
        if tm is None or is_unknown(tm.error) or not tm.partitions:
            self._topics.pop(topic, None)
            raise UnknownTopic(topic)
        if tm.error is not None:
            raise BrokerUnavailable(str(tm.error))
        parts = sorted(tm.partitions)
        self._topics[topic] = (time.monotonic(), parts)
        return parts

    def forget(self, topic: str) -> None:
        """Drop the cached partitions of ``topic`` (it was just created)."""
        self._topics.pop(topic, None)

    def _list_topic(self, topic: str) -> Any:
        try:
            return self._clients.meta.list_topics(topic, timeout=5)
        except KafkaException as e:
            raise BrokerUnavailable(str(e)) from None

    async def topics(self, prefix: str) -> set[str]:
        def names() -> set[str]:
            try:  # the admin client: on the metadata client's handle, a listing every second
                # held up the topic look-ups of /message while the cluster was away (measured:
                # test_whole_cluster_outage got no 503 in 10 s). A listing asks the broker anew.
                md = self._clients.admin.list_topics(timeout=5)
            except KafkaException as e:
                raise BrokerUnavailable(str(e)) from None
            return {t for t, tm in md.topics.items() if t.startswith(prefix) and tm.error is None}
        found: set[str] = await self._clients.run(names)
        return found

    async def broker_ids(self) -> list[int]:
        """The cluster's broker ids, as a metadata answer lists them (the admin client, as
        :meth:`topics`)."""
        def ids() -> list[int]:
            try:
                return sorted(self._clients.admin.list_topics(timeout=5).brokers)
            except KafkaException as e:
                raise BrokerUnavailable(str(e)) from None
        found: list[int] = await self._clients.run(ids)
        return found

    async def ping(self) -> None:
        """A metadata request through the admin client, in a thread of its own
        (:attr:`Clients.probe`): the readiness check must not queue behind requests whose
        threads wait on the metadata consumer (before: ``/readyz`` gave no answer in 9-60 s
        while every pool thread waited on a broker that had stopped answering). A probe still
        running is awaited, not doubled."""
        fut = self._probe
        if fut is None or fut.done():
            fut = self._probe = asyncio.get_running_loop().run_in_executor(
                self._clients.probe, self._probe_once)
        try:
            await asyncio.wait_for(asyncio.shield(fut), PING_TIMEOUT_S + 0.5)
        except TimeoutError:
            raise BrokerUnavailable(f"no metadata answer within {PING_TIMEOUT_S:.0f} s") from None

    def _probe_once(self) -> None:
        try:
            md = self._clients.admin.list_topics(timeout=PING_TIMEOUT_S)
        except KafkaException as e:
            err = error_of(e)
            raise BrokerUnavailable(err.str() if err is not None else str(e)) from None
        if not md.brokers:
            raise BrokerUnavailable("the cluster's metadata lists no live broker")

    # -- watermarks -----------------------------------------------------------------------
    async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        parts = await self.partitions(topic, fresh=True)  # (fresh: the leaders, too)
        tps = [TopicPartition(topic, p) for p in parts]
        for delay in (*LEADER_RETRY_S, None):
            try:
                out, failed = await self._list_offsets(tps)
                for _tp, miss in failed:
                    if not is_unknown(miss):
                        raise KafkaException(miss)
                if not out:
                    raise UnknownTopic(topic)
                # A partition the metadata consumer does not know yet (just added) is left out
                # for now: the next refresh finds it.
                return {str(tp.partition): ends for tp, ends in out.items()}
            except KafkaException as e:
                err = error_of(e)
                if is_unknown(err):
                    raise UnknownTopic(topic) from None
                if delay is None or not is_leader_change(err):
                    raise BrokerUnavailable(str(e)) from None
            await self._clients.run(self._refresh, topic)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _refresh(self, topic: str) -> None:
        """Have the metadata consumer ask for the topic's metadata now (blocking)."""
        try:
            self._clients.meta.list_topics(topic, timeout=5)
        except KafkaException:
            pass  # best effort: the next look tries again

    async def _list_offsets(self, tps: list[TopicPartition], timeout_s: float = 5) -> tuple[
            dict[TopicPartition, tuple[int, int]], list[tuple[TopicPartition, KafkaError]]]:
        """(low, high) watermark of each partition that answered, and each that did not with its
        error; raises KafkaException when the whole request failed.

        ListOffsets at the timestamps -2 and -1 (the log start and end), through the metadata
        consumer's ``offsets_for_times``: blocking, in the clients' pool, two requests per
        leader at once. Not the admin client's ``list_offsets``: it looks the leaders up with
        librdkafka's asynchronous leader query, whose first step runs on the calling thread while
        a metadata update (any topic's) can run the same request on librdkafka's main thread;
        one of them ends the request and the other dereferences what it freed (SIGSEGV in
        pthread_mutex_lock on a NULL ``eonce``, librdkafka 2.16, core dump of a node). Idle
        nodes died of it at startup (3 in ~100 starts, tests/CI) and while refreshing the
        watermarks of deleted topics. ``offsets_for_times`` waits for the leaders
        synchronously, with no such second path.
        """
        meta = self._clients.meta

        def ask(spec: int) -> list[TopicPartition]:
            asked = [TopicPartition(tp.topic, tp.partition, spec) for tp in tps]
            got: list[TopicPartition] = meta.offsets_for_times(asked, timeout=timeout_s)
            return got

        lows, highs = await asyncio.gather(self._clients.run(ask, LOG_START),
                                           self._clients.run(ask, LOG_END))
        out: dict[TopicPartition, tuple[int, int]] = {}
        failed: list[tuple[TopicPartition, KafkaError]] = []
        for tp, lo, hi in zip(tps, lows, highs, strict=True):
            err = lo.error or hi.error
            if err is not None or lo.offset < 0 or hi.offset < 0:
                # No answer without an error is a slow or moving leader, not a verdict that the
                # partition does not exist: it was taken for one (_UNKNOWN_PARTITION), and while
                # a broker was slow /message answered 404 unknown_topic for existing topics
                # (175 times in one run), which a client takes as "stop consuming".
                failed.append((tp, err or KafkaError(KafkaError.LEADER_NOT_AVAILABLE)))
            else:
                out[tp] = (lo.offset, hi.offset)
        return out, failed

    async def all_watermarks(self, tps: list[TopicPartition]) -> dict[tuple[str, int], tuple[int, int]]:
        """(low, high) of each partition that answered; the others are asked again a few
        times (with fresh metadata) and then left out."""
        out: dict[tuple[str, int], tuple[int, int]] = {}
        todo = tps
        for delay in (*LEADER_RETRY_S, None):
            if not todo:
                break
            try:
                got, failed = await self._list_offsets(todo, timeout_s=10)
                out.update({(tp.topic, tp.partition): ends for tp, ends in got.items()})
                todo = [tp for tp, _err in failed]
            except KafkaException as e:
                if delay is None or not is_leader_change(error_of(e)):
                    raise BrokerUnavailable(str(e)) from None
            if todo and delay is not None:
                for t in {tp.topic for tp in todo}:
                    await self._clients.run(self._refresh, t)
                await asyncio.sleep(delay)
        return out

    async def offset_for_time(self, topic: str, queue: str, timestamp_ms: int) -> int:
        meta = self._clients.meta

        def look() -> int:
            tp = TopicPartition(topic, int(queue), timestamp_ms)
            found = meta.offsets_for_times([tp], timeout=5)[0]
            if found.offset >= 0:
                return found.offset
            return meta.get_watermark_offsets(TopicPartition(topic, int(queue)), timeout=5)[1]
        try:
            offset: int = await self._clients.run(look)
            return offset
        except KafkaException as e:  # a timeout or a broker error: 503 for the reset, not 500
            if is_unknown(error_of(e)):
                raise UnknownTopic(topic) from None
            raise BrokerUnavailable(str(e)) from None

    # -- descriptions (the admin API's /admin/topics) ---------------------------------------
    async def describe_topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        """One metadata request, then ListOffsets for every partition of those topics at once
        (twice: earliest and latest). A partition whose leader is moving is asked again after
        the pauses of :data:`LEADER_RETRY_S`, then listed with -1 watermarks: one partition
        must not fail a listing of thousands."""
        clients = self._clients

        def metadata() -> dict[str, Any]:
            try:
                if names is None:  # the admin client: see topics() on why not the metadata one
                    return dict(clients.admin.list_topics(timeout=10).topics)
                # One topic at a time through the metadata consumer, which never asks the broker
                # to auto-create a topic it names (allow.auto.create.topics=false).
                return {t: clients.meta.list_topics(t, timeout=5).topics.get(t) for t in names}
            except KafkaException as e:
                raise BrokerUnavailable(str(e)) from None
        found = await clients.run(metadata)
        topics: dict[str, list[Any]] = {}
        for t in (names if names is not None else sorted(found)):
            tm = found.get(t)
            if tm is None or is_unknown(tm.error) or not tm.partitions:
                if names is not None:
                    raise UnknownTopic(t)
                continue
            topics[t] = [tm.partitions[p] for p in sorted(tm.partitions)]
        offsets = await self.all_watermarks(
            [TopicPartition(t, pm.id) for t, pms in topics.items() for pm in pms])
        return [TopicInfo(t, tuple(
            QueueInfo(str(pm.id), *offsets.get((t, pm.id), (-1, -1)), pm.leader,
                      tuple(pm.replicas), tuple(pm.isrs)) for pm in pms),
            internal=is_own_topic(t)) for t, pms in topics.items()]
