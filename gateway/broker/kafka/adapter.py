"""Kafka adapter on confluent-kafka (librdkafka), written for Apache Kafka semantics.

Per process it keeps one producer (with a poll thread that resolves delivery
futures), one admin client for ListOffsets, one metadata consumer, and a pool of
fetch consumers with partition affinity (:mod:`.kafka_fetch`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from ..base import (
    Broker,
    BrokerUnavailable,
    Capability,
    FetchResult,
    OutgoingMessage,
    ProduceResult,
    QueueInfo,
    Skipped,
    SkipReason,
    TopicExists,
    TopicInfo,
    TopicRefused,
    UnknownTopic,
)
from ..partitioner import LIBRDKAFKA_PARTITIONER
from . import clientlog
from .fetch import UNKNOWN_CODES, FetchPool, RawRead

_UNKNOWN = UNKNOWN_CODES
#: How long partition lists are trusted before new partitions are looked for.
_METADATA_TTL_S = 5.0
#: Pauses before asking again when a partition's leader is moving (a broker restarted, a topic
#: just created): a /message then waits under a second instead of answering 503 at once.
_LEADER_RETRY_S = (0.05, 0.2, 0.5)
_LEADER_CHANGE = {KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
                  KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH,
                  KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.REQUEST_TIMED_OUT,
                  KafkaError._TRANSPORT, KafkaError._TIMED_OUT}
#: Pauses before asking a group's coordinator again while it is being elected or loaded (~8 s in
#: all: a new cluster creates __consumer_offsets, 50 partitions, on the first group request).
_COORDINATOR_RETRY_S = (0.1, 0.3, 0.6, 1.0, 2.0, 2.0, 2.0)
_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                       KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT,
                       KafkaError.REQUEST_TIMED_OUT}
#: Kafka's own topics (__consumer_offsets, __transaction_state, __share_group_state, ...) are
#: named so; the admin API lists them only when asked.
_INTERNAL_PREFIX = "__"
#: A topic that keeps the last record of each key and deletes nothing else (the registry's copy).
_COMPACTED = {"cleanup.policy": "compact", "retention.ms": "-1"}
#: CreateTopics errors that a retry cannot cure: the request itself is refused (TopicRefused).
_CREATE_REFUSALS = {
    KafkaError.TOPIC_EXCEPTION: "invalid_topic",  # InvalidTopicException, e.g. a collision
    KafkaError.INVALID_PARTITIONS: "invalid_partitions",
    KafkaError.INVALID_REPLICATION_FACTOR: "invalid_replication_factor",
    KafkaError.INVALID_REPLICA_ASSIGNMENT: "invalid_replication_factor",
    KafkaError.POLICY_VIOLATION: "policy_violation",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "not_authorized",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "not_authorized",
}
#: librdkafka settings of every client (producers, admin, consumers) for while the brokers are
#: unreachable; the operator's ``kafka_config`` comes after them and may override them. Measured
#: on an idle worker pointed at a closed port (librdkafka 2.16, tests/test_broker_down.py), with
#: librdkafka's defaults: ~350 new threads and ~300 failed connects per second, 20 % of a core.
#: - ``metadata.recovery.strategy``: ``rebootstrap`` (the default since librdkafka 2.10) starts
#:   a re-bootstrap at every failed connect while all brokers are down, and each one replaces the
#:   bootstrap brokers and their threads (librdkafka issues 5088, 5546): ~20 threads a second
#:   per client. ``none`` keeps retrying the bootstrap and known brokers, whose names are
#:   resolved again at each connect, as librdkafka did before 2.10.
#: - ``reconnect.backoff.ms``: a consumer (Python's always has a group) looks for its group
#:   coordinator every ``reconnect.backoff.ms / 2`` (at most 1 s) whatever the per-broker
#:   backoff: 20 connects/s per client at the default 100 ms, 2/s at 1,000. It is also the first
#:   pause before reconnecting to a broker that dropped a connection (doubling up to
#:   ``reconnect.backoff.max.ms``, 10 s).
#: With both: no new threads, ~30 failed connects/s, ~2 % of a core.
BROKER_DOWN: dict[str, str | int] = {"metadata.recovery.strategy": "none",
                                     "reconnect.backoff.ms": 1000}
#: Checkpoint-group consumers kept open per process (least recently used closed first). A round
#: over more groups than this makes and closes consumers: 100 moved consumers cost 407 ms of CPU
#: a round with 16 kept, 92 ms with all kept; 64 kept cost ~4 threads and ~0.4 MB each
#: (bench/checkpoint_cost.py, BENCHMARKS.md).
_GROUP_CONSUMERS = 64
#: Threads for checkpoint-group calls, apart from the pool that produce and fetch use: a herd of
#: first polls (hundreds of new consumers, each restoring its offsets) once held every thread of
#: the shared pool in group calls, behind one process-wide lock, and stalled /produce 4.5-18.6 s.
_GROUP_THREADS = 4
#: Produce requests with at most this many messages go through a producer with a shorter linger.
_SMALL_PRODUCE = 8



@dataclass(slots=True)
class _GroupClient:
    """A checkpoint group's consumer, used by one thread at a time."""

    consumer: Consumer
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.consumer.close()

class KafkaBroker(Broker):
    """Kafka's offset rules live here: retention, compaction and transaction-marker holes, and
    the re-check that tells those from a fetch racing a producer at the tail."""

    capabilities = frozenset({Capability.OUT_OF_RETENTION, Capability.OFFSET_CHECKPOINT})

    def __init__(self, bootstrap: str, *, extra: dict[str, str] | None = None, pool_size: int = 8,
                 max_batch: int = 1000, produce_timeout_ms: int = 30_000, produce_linger_ms: int = 2,
                 gap_recheck_ms: int = 30, replication: int = -1, name: str = "kafka") -> None:
        self.name = name
        #: Replication factor of the topics the gateway creates (-1: the broker's default).
        self._replication = replication
        self._gap_recheck_s = gap_recheck_ms / 1000
        # Every client is built from these; "logger": librdkafka's lines join the JSON log
        # (clientlog.py), never stderr.
        self._common: dict[str, Any] = {"bootstrap.servers": bootstrap, **BROKER_DOWN,
                                        **(extra or {}), "logger": clientlog.LOGGER}
        self._pool_size = pool_size
        self._max_batch = max_batch
        self._produce_timeout_ms = produce_timeout_ms
        self._linger_ms = produce_linger_ms
        #: The producer's per-record limit, named in the error of a record over it.
        self._max_record_bytes = int(self._common.get("message.max.bytes", _MESSAGE_MAX_BYTES))
        self._executor = ThreadPoolExecutor(max_workers=pool_size + 2, thread_name_prefix="kafka")
        self._topics: dict[str, tuple[float, list[int]]] = {}
        self._running = False
        self._groups: OrderedDict[str, _GroupClient] = OrderedDict()  # checkpoint groups, LRU
        self._groups_lock = threading.Lock()  # the dict only; each client has a lock of its own
        self._group_executor = ThreadPoolExecutor(max_workers=_GROUP_THREADS,
                                                  thread_name_prefix="kafka-groups")
        self._produced: set[tuple[int, str]] = set()  # (producer, topic) metadata asked for

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        producer_conf = {
            # Keys land where Java clients put them (partitioner.py); before the common settings,
            # so that MQGW_KAFKA_CONFIG=partitioner=... can still choose another rule.
            "partitioner": LIBRDKAFKA_PARTITIONER,
            **self._common,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": self._linger_ms,
            "message.timeout.ms": self._produce_timeout_ms,
            "queue.buffering.max.messages": 1_000_000,
            "socket.nagle.disable": True,
        }
        self._producer = Producer(producer_conf)
        # Requests of a few messages are latency-bound: the bulk linger would be most of their time.
        # Bulk requests keep the longer linger, which the broker needs to get large batches.
        self._small_producer = Producer({**producer_conf, "linger.ms": 0.5})
        self._admin = AdminClient(dict(self._common))
        self._meta = Consumer(self._consumer_conf())
        self._pool = FetchPool(lambda: Consumer(self._consumer_conf()), self._pool_size, self._run)
        self._running = True
        self._poller = threading.Thread(target=self._poll_loop, args=(self._producer,),
                                        name="kafka-producer-poll", daemon=True)
        self._poller.start()
        self._small_poller = threading.Thread(target=self._poll_loop, args=(self._small_producer,),
                                              name="kafka-producer-poll-small", daemon=True)
        self._small_poller.start()

    def _consumer_conf(self) -> dict[str, Any]:
        # Measured on the test broker: without backoff 0 and a short fetch wait, reading at an
        # explicit offset costs ~30 ms median instead of ~2 ms (see ../shared/notes). A seek
        # parses up to fetch.max.bytes of records: 4 MB cost 7 ms of CPU per seek, 1 MB 1.8 ms.
        # Smaller is not safe: Kafka returns a first record batch larger than the limit whole
        # (KIP-74), but the test broker does not, and producers write batches of up to 1 MB.
        # Prefetching two batches' worth lets a consumer skip a batch another node served.
        return {
            **self._common,
            "group.id": "mqgw-fetch",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Explicit because the hole rules rely on it: only records of committed transactions
            # are returned, and never past the last stable offset, so an open transaction is
            # not a hole; aborted records and markers are.
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "allow.auto.create.topics": False,
            # Not 0: a consumer whose queue is over queued.min.messages re-checks it every
            # fetch.queue.backoff.ms, and with 0 its librdkafka broker thread spins (~50% of a
            # core per idle pooled consumer, measured). A new assignment waits this long before
            # its first fetch; 1 ms measured worse than 5 ms overall (32 consumers waking 1000/s).
            "fetch.queue.backoff.ms": 5,
            "fetch.wait.max.ms": 10,
            "queued.min.messages": 2 * self._max_batch,
            "queued.max.messages.kbytes": 8192,
            "fetch.max.bytes": 1024 * 1024,
            "max.partition.fetch.bytes": 1024 * 1024,
            "socket.nagle.disable": True,
        }

    def _poll_loop(self, producer: Producer) -> None:
        # Clients nothing else polls: their log lines wait in their queue for a poll (clientlog.py).
        quiet = (self._admin, self._meta) if producer is self._producer else ()
        while self._running:
            producer.poll(0.05)
            for client in quiet:
                client.poll(0)

    async def close(self) -> None:
        if not self._running:
            return
        await asyncio.get_running_loop().run_in_executor(self._executor, self._producer.flush, 10)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._small_producer.flush, 10)
        self._running = False
        self._poller.join(timeout=2)
        self._small_poller.join(timeout=2)
        self._pool.close()
        self._meta.close()
        with self._groups_lock:
            clients = list(self._groups.values())
            self._groups.clear()
        for c in clients:
            c.close()
        self._executor.shutdown(wait=False)
        self._group_executor.shutdown(wait=False)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- metadata -------------------------------------------------------------------------
    async def _partitions(self, topic: str, fresh: bool = False) -> list[int]:
        cached = self._topics.get(topic)
        if cached and not fresh and time.monotonic() - cached[0] < _METADATA_TTL_S:
            return cached[1]
        md = await self._run(self._list_topic, topic)
        tm = md.topics.get(topic)
        if tm is None or (tm.error is not None and tm.error.code() in _UNKNOWN) or not tm.partitions:
            self._topics.pop(topic, None)
            raise UnknownTopic(topic)
        if tm.error is not None:
            raise BrokerUnavailable(str(tm.error))
        parts = sorted(tm.partitions)
        self._topics[topic] = (time.monotonic(), parts)
        return parts

    def _refresh_admin_metadata(self, topic: str) -> None:
        try:
            self._admin.list_topics(topic, timeout=5)
        except KafkaException:
            pass  # best effort: the next refresh tries again

    def _list_topic(self, topic: str) -> Any:
        try:
            return self._meta.list_topics(topic, timeout=5)
        except KafkaException as e:
            raise BrokerUnavailable(str(e)) from None

    async def queues(self, topic: str) -> list[str]:
        return [str(p) for p in await self._partitions(topic)]

    async def topics(self, prefix: str) -> set[str]:
        def names() -> set[str]:
            try:  # the admin client: on the metadata client's handle, a listing every second
                # held up the topic look-ups of /message while the cluster was away (measured:
                # test_whole_cluster_outage got no 503 in 10 s). A listing asks the broker anew.
                md = self._admin.list_topics(timeout=5)
            except KafkaException as e:
                raise BrokerUnavailable(str(e)) from None
            return {t for t, tm in md.topics.items() if t.startswith(prefix) and tm.error is None}
        found: set[str] = await self._run(names)
        return found

    async def ensure_topics(self, topics: dict[str, int], timeout_s: float = 30.0,
                            compacted: bool = False) -> None:
        """CreateTopics with the broker's default replication factor (-1, KIP-464), then wait
        until ListOffsets answers for every partition: Apache Kafka lists a new topic's
        partitions before their leaders serve them (see devstack.create_topic)."""
        missing: dict[str, int] = {}
        for topic, n in topics.items():
            try:
                await self._partitions(topic, fresh=True)
            except UnknownTopic:
                missing[topic] = n
        if missing:
            def create() -> None:
                futures = self._admin.create_topics(
                    [NewTopic(t, n, self._replication, config=_COMPACTED if compacted else {})
                     for t, n in missing.items()],
                    request_timeout=timeout_s)
                for f in futures.values():
                    try:
                        f.result(timeout_s)
                    except KafkaException as e:
                        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                            raise BrokerUnavailable(f"creating topics: {e}") from None
            await self._run(create)
        deadline = time.monotonic() + timeout_s
        for topic in missing:
            while True:
                try:
                    await self.watermarks(topic)
                    break
                except (UnknownTopic, BrokerUnavailable):
                    if time.monotonic() > deadline:
                        raise BrokerUnavailable(f"topic {topic} is not served yet") from None
                    await asyncio.sleep(0.1)

    # -- topic administration ------------------------------------------------------------
    async def describe_topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        """One metadata request, then ListOffsets for every partition of those topics at once
        (twice: earliest and latest). A partition whose leader is moving is asked again after
        the pauses of :data:`_LEADER_RETRY_S`, then listed with -1 watermarks: one partition
        must not fail a listing of thousands."""
        def metadata() -> dict[str, Any]:
            try:
                if names is None:  # the admin client: see topics() on why not the metadata one
                    return dict(self._admin.list_topics(timeout=10).topics)
                # One topic at a time through the metadata consumer, which never asks the broker
                # to auto-create a topic it names (allow.auto.create.topics=false).
                return {t: self._meta.list_topics(t, timeout=5).topics.get(t) for t in names}
            except KafkaException as e:
                raise BrokerUnavailable(str(e)) from None
        found = await self._run(metadata)
        topics: dict[str, list[Any]] = {}
        for t in (names if names is not None else sorted(found)):
            tm = found.get(t)
            if tm is None or (tm.error is not None and tm.error.code() in _UNKNOWN) \
                    or not tm.partitions:
                if names is not None:
                    raise UnknownTopic(t)
                continue
            topics[t] = [tm.partitions[p] for p in sorted(tm.partitions)]
        offsets = await self._all_watermarks(
            [TopicPartition(t, pm.id) for t, pms in topics.items() for pm in pms])
        return [TopicInfo(t, tuple(
            QueueInfo(str(pm.id), *offsets.get((t, pm.id), (-1, -1)), pm.leader,
                      tuple(pm.replicas), tuple(pm.isrs)) for pm in pms),
            internal=t.startswith(_INTERNAL_PREFIX)) for t, pms in topics.items()]

    async def _all_watermarks(self, tps: list[TopicPartition]) -> dict[tuple[str, int], tuple[int, int]]:
        """(low, high) of each partition that answered; the others are asked again a few
        times (with fresh admin metadata) and then left out."""
        out: dict[tuple[str, int], tuple[int, int]] = {}
        todo = tps
        for delay in (*_LEADER_RETRY_S, None):
            if not todo:
                break
            earliest, latest = OffsetSpec.earliest(), OffsetSpec.latest()  # type: ignore[no-untyped-call]
            try:
                lo_f = self._admin.list_offsets({tp: earliest for tp in todo}, request_timeout=10)
                hi_f = self._admin.list_offsets({tp: latest for tp in todo}, request_timeout=10)
            except KafkaException as e:
                raise BrokerUnavailable(str(e)) from None
            failed: list[TopicPartition] = []
            for tp in todo:
                try:
                    lo = (await asyncio.wrap_future(lo_f[tp])).offset
                    hi = (await asyncio.wrap_future(hi_f[tp])).offset
                except KafkaException:
                    failed.append(tp)
                    continue
                out[(tp.topic, tp.partition)] = (max(lo, 0), max(hi, 0))
            todo = failed
            if todo and delay is not None:
                for t in {tp.topic for tp in todo}:
                    await self._run(self._refresh_admin_metadata, t)
                await asyncio.sleep(delay)
        return out

    async def create_topic(self, name: str, queues: int, replication: int | None = None,
                           timeout_s: float = 30.0) -> None:
        """CreateTopics (replication -1: the broker's ``default.replication.factor``, KIP-464),
        then wait until every partition answers ListOffsets, as :meth:`ensure_topics` does."""
        def create() -> None:
            new = NewTopic(name, queues, -1 if replication is None else replication)
            future = self._admin.create_topics([new], request_timeout=timeout_s)[name]
            try:
                future.result(timeout_s)
            except KafkaException as e:
                err = e.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    raise TopicExists(name) from None
                refused = _CREATE_REFUSALS.get(err.code())
                if refused is not None:
                    raise TopicRefused(refused, err.str()) from None
                raise BrokerUnavailable(f"creating topic {name}: {e}") from None
        await self._run(create)
        self._topics.pop(name, None)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                served = await self._all_watermarks(
                    [TopicPartition(name, p) for p in await self._partitions(name, fresh=True)])
                if len(served) >= queues:
                    return
            except (UnknownTopic, BrokerUnavailable):
                pass
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"topic {name} was created but is not served yet")
            await asyncio.sleep(0.1)

    async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        parts = await self._partitions(topic, fresh=True)
        tps = [TopicPartition(topic, p) for p in parts]
        for delay in (*_LEADER_RETRY_S, None):
            try:
                out, lagging = await self._list_offsets(tps)
                if lagging:
                    # The metadata consumer knows partitions (or a whole new topic) that the admin
                    # client does not yet: it refreshes its metadata only every 5 minutes by
                    # itself. Measured on Apache Kafka 4.1: after CreatePartitions the whole topic
                    # answered 404 for as long as that lasted, and a topic just created did now
                    # and then.
                    await self._run(self._refresh_admin_metadata, topic)
                    out, lagging = await self._list_offsets(tps)
                if not out:
                    raise UnknownTopic(topic)
                return out  # a partition still unknown to the admin client is left out for now
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if err is not None and err.code() in _UNKNOWN:
                    raise UnknownTopic(topic) from None
                if delay is None or not _is_leader_change(err):
                    raise BrokerUnavailable(str(e)) from None
            await self._run(self._refresh_admin_metadata, topic)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _list_offsets(self, tps: list[TopicPartition]) -> tuple[dict[str, tuple[int, int]], bool]:
        """(low and high watermark per partition, whether some partition was unknown)."""
        earliest, latest = OffsetSpec.earliest(), OffsetSpec.latest()  # type: ignore[no-untyped-call]
        lo_f = self._admin.list_offsets({tp: earliest for tp in tps}, request_timeout=5)
        hi_f = self._admin.list_offsets({tp: latest for tp in tps}, request_timeout=5)
        out: dict[str, tuple[int, int]] = {}
        lagging = False
        for tp in tps:
            try:
                lo = (await asyncio.wrap_future(lo_f[tp])).offset
                hi = (await asyncio.wrap_future(hi_f[tp])).offset
            except KafkaException as e:
                if e.args and e.args[0].code() in _UNKNOWN:
                    lagging = True
                    continue
                raise
            out[str(tp.partition)] = (max(lo, 0), max(hi, 0))
        return out, lagging

    async def offset_for_time(self, topic: str, queue: str, timestamp_ms: int) -> int:
        def look() -> int:
            tp = TopicPartition(topic, int(queue), timestamp_ms)
            found = self._meta.offsets_for_times([tp], timeout=5)[0]
            if found.offset >= 0:
                return found.offset
            return self._meta.get_watermark_offsets(TopicPartition(topic, int(queue)), timeout=5)[1]
        try:
            offset: int = await self._run(look)
            return offset
        except KafkaException as e:  # a timeout or a broker error: 503 for the reset, not 500
            if e.args and e.args[0].code() in _UNKNOWN:
                raise UnknownTopic(topic) from None
            raise BrokerUnavailable(str(e)) from None

    async def ping(self) -> bool:
        try:
            await self._run(lambda: self._meta.list_topics(timeout=2))
            return True
        except Exception:  # noqa: BLE001 - any failure means unreachable
            return False

    # -- offset checkpoints: Kafka consumer groups, written without joining them ------------
    # Through a consumer per group (commit/committed of explicit offsets, never subscribing),
    # not the admin client: librdkafka's coordinator-bound admin requests (AlterConsumerGroup-
    # Offsets, ListConsumerGroupOffsets) abort the whole process when the coordinator's
    # connection drops mid-request ("rd_kafka_enq_once_del_source_return: Assertion
    # eonce->refcnt > 0", librdkafka issues 3663 and 4605): it killed a gateway node when the
    # 3-broker test SIGKILLed a leader. The consumer commit path is librdkafka's everyday one.
    # Calls run on their own threads (_GROUP_THREADS), and a slow call on one group holds only
    # that group's client, so that neither produce nor other groups wait behind it.
    def _with_group(self, group: str, call: Callable[[Consumer], Any]) -> Any:
        """``call`` with the cached consumer of ``group`` (made if needed), holding its lock."""
        while True:
            evicted: list[_GroupClient] = []
            with self._groups_lock:
                client = self._groups.get(group)
                if client is None:
                    client = self._groups[group] = _GroupClient(Consumer({
                        **self._common, "group.id": group, "enable.auto.commit": False,
                        "enable.auto.offset.store": False}))
                    while len(self._groups) > _GROUP_CONSUMERS:
                        evicted.append(self._groups.popitem(last=False)[1])
                else:
                    self._groups.move_to_end(group)
            for old in evicted:
                old.close()  # waits for a call still using it
            with client.lock:
                if not client.closed:  # else evicted between the look-up and here: again
                    return call(client.consumer)

    def _commit(self, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        done: list[TopicPartition] = self._with_group(
            group, lambda c: c.commit(offsets=tps, asynchronous=False))
        return done

    def _committed(self, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        got: list[TopicPartition] = self._with_group(group, lambda c: c.committed(tps, timeout=10))
        return got

    async def _run_group(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._group_executor, fn, *args)

    async def save_offsets(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        # On the first fetch of a new queue too (core/checkpoint.py writes its start position
        # first): a new cluster's coordinators answer "moving" for a moment, as in load_offsets.
        tps = [TopicPartition(topic, int(q), off) for q, off in offsets.items()]
        for delay in (*_COORDINATOR_RETRY_S, None):
            try:
                done = await self._run_group(self._commit, group, tps)
            except KafkaException as e:
                if delay is None or e.args[0].code() not in _COORDINATOR_MOVING:
                    raise BrokerUnavailable(f"saving offsets of group {group}: {e}") from None
                await asyncio.sleep(delay)
                continue
            failed = [tp for tp in done or [] if tp.error is not None]
            if not failed:
                return
            if delay is None or failed[0].error.code() not in _COORDINATOR_MOVING:
                raise BrokerUnavailable(f"saving offsets of group {group}: {failed[0].error}")
            await asyncio.sleep(delay)

    async def load_offsets(self, group: str, topic: str,
                           queues: list[str] | None = None) -> dict[str, int]:
        # With the queues given, no metadata request: a herd of restores made one each, and they
        # queued in the shared pool ahead of produce and fetch calls.
        parts = [int(q) for q in queues] if queues else await self._partitions(topic, fresh=True)
        tps = [TopicPartition(topic, p) for p in parts]
        for delay in (*_COORDINATOR_RETRY_S, None):
            try:
                got = await self._run_group(self._committed, group, tps)
                break
            except KafkaException as e:
                # A new cluster creates __consumer_offsets on the first group request, and its
                # coordinators answer NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for a moment
                # (the first /message of `make run` on Apache Kafka met a 503 here).
                if delay is None or e.args[0].code() not in _COORDINATOR_MOVING:
                    raise BrokerUnavailable(f"reading offsets of group {group}: {e}") from None
                await asyncio.sleep(delay)
        # A partition the group has no offset for answers OFFSET_INVALID (-1001).
        return {str(tp.partition): tp.offset for tp in got if tp.error is None and tp.offset >= 0}

    async def forget_offsets(self, group: str) -> None:
        # An admin request (there is no consumer API for it), so the abort above can happen
        # here too; it runs only when an operator deletes a consumer with its offsets.
        with self._groups_lock:
            c = self._groups.pop(group, None)
        if c is not None:
            await self._run_group(c.close)
        try:
            await asyncio.wrap_future(self._admin.delete_consumer_groups([group], request_timeout=10)[group])
        except KafkaException as e:
            if e.args and e.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return
            raise BrokerUnavailable(f"deleting group {group}: {e}") from None

    # -- fetch ----------------------------------------------------------------------------
    async def fetch(self, topic: str, queue: str, offset: int, max_records: int) -> FetchResult:
        """Read at ``offset``; offsets skipped at the start are reported in ``skipped``.

        Offsets missing at the start of a read (records begin above ``offset``, or there are no
        records but the log ends above it) are final on Apache Kafka: below the high watermark
        (and, read committed, the last stable offset) they are compaction, transaction markers
        or aborted records. So by default (``gap_recheck_ms`` 0) a hole is reported as skipped
        and a batch runs across holes inside it. A broker whose fetch can race a producer at the
        tail and skip records that become readable a moment later (Tansu, ../shared/notes) is
        read with ``gap_recheck_ms`` > 0: a hole is then accepted only after one more look, and a
        hole *inside* a batch ends the batch before it (:func:`.fetch.read`), so the next read
        starts at the hole and checks it the same way.
        """
        trust = self._gap_recheck_s <= 0
        return await read_checked(
            lambda at: self._pool.fetch(topic, int(queue), at, max_records, stop_at_holes=not trust),
            offset, self._gap_recheck_s)

    # -- produce --------------------------------------------------------------------------
    async def _learn(self, producer: Producer, topic: str) -> None:
        """Ask for a topic's metadata before a producer's first write to it. Measured on Apache
        Kafka 4.1: a producer's (and a consumer's) first request for a topic it had not seen
        waited ~1 s for the next periodic metadata refresh; after a metadata request, tens of
        ms. Every first delayed record through a level topic was a second late for it."""
        try:
            await self._run(producer.list_topics, topic, 5)
        except KafkaException:
            return  # the write finds out, as before
        if len(self._produced) >= 10_000:
            self._produced.clear()
        self._produced.add((id(producer), topic))

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        if not messages:
            return []
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        results = [ProduceResult() for _ in messages]
        pending = [len(messages)]
        lock = threading.Lock()  # callbacks run on the poll thread, local failures on this one

        def settle() -> None:
            with lock:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                loop.call_soon_threadsafe(finish)

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        def on_delivery(i: int) -> Any:
            def cb(err: KafkaError | None, msg: Any) -> None:
                r = results[i]
                if err is None:
                    r.queue, r.offset = str(msg.partition()), msg.offset()
                else:
                    r.error_code = _produce_error_code(err)
                    r.error = _too_large(messages[i], None) if r.error_code == "message_too_large" \
                        else err.str()
                settle()
            return cb

        if urgent is None:
            urgent = len(messages) <= _SMALL_PRODUCE
        # Writes into the delay wheel go through the lingering producer whatever their number: a
        # delayed request splits over up to 21 level topics, and through the short linger each
        # of them was a batch of its own (measured: the broker's per-batch cost capped delayed
        # produce at 4,150 records/s on Apache Kafka, BENCHMARKS.md issue 12).
        producer = self._small_producer if urgent else self._producer
        if (id(producer), topic) not in self._produced:
            await self._learn(producer, topic)
        produce = producer.produce
        for i, m in enumerate(messages):
            kwargs: dict[str, Any] = {"value": m.value, "key": m.key, "on_delivery": on_delivery(i)}
            if m.headers:
                kwargs["headers"] = m.headers
            if m.queue is not None:
                kwargs["partition"] = int(m.queue)
            if m.timestamp is not None:
                kwargs["timestamp"] = m.timestamp
            while True:
                try:
                    produce(topic, **kwargs)
                    break
                except BufferError:
                    await asyncio.sleep(0.005)  # local queue full: let the poll thread drain it
                except KafkaException as e:
                    err = e.args[0]
                    results[i].error_code = _produce_error_code(err)
                    results[i].error = _too_large(m, self._max_record_bytes) \
                        if results[i].error_code == "message_too_large" else err.str()
                    settle()
                    break
        await done
        return results


async def read_checked(read: Callable[[int], Awaitable[RawRead]], offset: int,
                       recheck_s: float) -> FetchResult:
    """Kafka's read rules over a raw read at an offset (see :meth:`KafkaBroker.fetch`)."""
    res = await read(offset)
    if res.out_of_range and res.low_watermark > offset:
        res2 = await read(res.low_watermark)
        return _result(res2, res.low_watermark,
                       Skipped(offset, res.low_watermark, SkipReason.OUT_OF_RETENTION))
    first = _first_offset(res)
    if first > offset and recheck_s > 0:  # a broker that may race at the tail: look again
        await asyncio.sleep(recheck_s)
        res = await read(offset)
        first = _first_offset(res)
    if first > offset:
        reason = SkipReason.GAP if res.records else SkipReason.NO_RECORDS
        return _result(res, first, Skipped(offset, first, reason))
    return _result(res, offset, None)


def _result(res: RawRead, start: int, skipped: Skipped | None) -> FetchResult:
    nxt = res.records[-1].offset + 1 if res.records else start
    return FetchResult(res.records, nxt, res.high_watermark, skipped)


def _first_offset(res: RawRead) -> int:
    """Where readable data starts in a raw read, -1 if it says nothing."""
    return res.records[0].offset if res.records else res.end_offset


def _is_leader_change(err: KafkaError | None) -> bool:
    """Whether ListOffsets failed for a reason that a moment (and fresh metadata) cures."""
    return err is not None and (err.code() in _LEADER_CHANGE or bool(err.retriable()))


#: librdkafka's default ``message.max.bytes``: the largest record the producer sends.
_MESSAGE_MAX_BYTES = 1_000_000


def _too_large(m: OutgoingMessage, limit: int | None) -> str:
    """Say how large the record is and which limit it exceeds: the producer's (``limit``, refused
    before sending) or, when the broker refused it (``limit`` None), the topic's."""
    size = len(m.value or b"") + len(m.key or b"") + sum(len(k) + len(v) for k, v in m.headers)
    if limit is not None:
        return (f"record is {size:,} bytes (key, value and headers), over the limit of {limit:,} "
                "bytes per record (librdkafka message.max.bytes; raise it with MQGW_KAFKA_CONFIG="
                "message.max.bytes=N, and the topic's max.message.bytes on the broker with it)")
    return (f"the broker refused a record of {size:,} bytes (key, value and headers) as too large: "
            "over the topic's max.message.bytes (Apache Kafka's default is 1,048,588 bytes)")


def _produce_error_code(err: KafkaError) -> str:
    code = err.code()
    if code in _UNKNOWN:
        return "unknown_partition" if code == KafkaError._UNKNOWN_PARTITION else "unknown_topic"
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return "message_too_large"
    if code == KafkaError._MSG_TIMED_OUT:
        return "broker_timeout"
    return "broker_error"
