"""Offset checkpoints: Kafka consumer groups, written and read without joining them.

Through a consumer per group (commit/committed of explicit offsets, never subscribing), not the
admin client: librdkafka's coordinator-bound admin requests (AlterConsumerGroupOffsets,
ListConsumerGroupOffsets) abort the whole process when the coordinator's connection drops
mid-request ("rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0", librdkafka
issues 3663 and 4605): it killed a gateway node when the 3-broker test SIGKILLed a leader. The
consumer commit path is librdkafka's everyday one. Calls run on their own threads
(:data:`_GROUP_THREADS`), and a slow call on one group holds only that group's client, so that
neither produce nor other groups wait behind it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ..base import BrokerUnavailable
from .clients import Clients
from .errors import error_of, is_coordinator_moving

#: Checkpoint-group consumers kept open per process (least recently used closed first). A round
#: over more groups than this makes and closes consumers: 100 moved consumers cost 407 ms of CPU
#: a round with 16 kept, 92 ms with all kept; 64 kept cost ~4 threads and ~0.4 MB each
#: (bench/checkpoint_cost.py, BENCHMARKS.md).
_GROUP_CONSUMERS = 64
#: Threads for checkpoint-group calls, apart from the pool that produce and fetch use: a herd of
#: first polls (hundreds of new consumers, each restoring its offsets) once held every thread of
#: the shared pool in group calls, behind one process-wide lock, and stalled /produce 4.5-18.6 s.
_GROUP_THREADS = 4
#: Pauses before asking a group's coordinator again while it is being elected or loaded (~8 s in
#: all: a new cluster creates __consumer_offsets, 50 partitions, on the first group request).
_COORDINATOR_RETRY_S = (0.1, 0.3, 0.6, 1.0, 2.0, 2.0, 2.0)


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


class CheckpointGroups:
    """The consumer groups that hold checkpointed offsets, one cached consumer per group."""

    def __init__(self, clients: Clients) -> None:
        self._clients = clients
        self._groups: OrderedDict[str, _GroupClient] = OrderedDict()  # LRU
        self._lock = threading.Lock()  # the dict only; each client has a lock of its own
        self._executor = ThreadPoolExecutor(max_workers=_GROUP_THREADS,
                                            thread_name_prefix="kafka-groups")

    def close(self) -> None:
        with self._lock:
            clients = list(self._groups.values())
            self._groups.clear()
        for c in clients:
            c.close()
        self._executor.shutdown(wait=False)

    def _with_group(self, group: str, call: Callable[[Consumer], Any]) -> Any:
        """``call`` with the cached consumer of ``group`` (made if needed), holding its lock."""
        while True:
            evicted: list[_GroupClient] = []
            with self._lock:
                client = self._groups.get(group)
                if client is None:
                    client = self._groups[group] = _GroupClient(Consumer({
                        **self._clients.common, "group.id": group, "enable.auto.commit": False,
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

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def metadata(self, group: str) -> Any:
        """The group's metadata for a transaction's offsets (send_offsets_to_transaction), from
        its consumer: it never joins, so the broker takes the offsets as a simple commit's."""
        return self._with_group(group, lambda c: c.consumer_group_metadata())

    def committed_now(self, group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        """What ``group`` holds for ``tps``, on the calling thread (a transaction's): stable
        offsets only (read_committed asks for them), retried while the coordinator moves."""
        for delay in (*_COORDINATOR_RETRY_S, None):
            try:
                return self._committed(group, tps)
            except KafkaException as e:
                if delay is None or not is_coordinator_moving(error_of(e)):
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    async def save(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        """Commit ``offsets`` (partition id: next offset) under ``group``."""
        # On the first fetch of a new queue too (core/checkpoint.py writes its start position
        # first): a new cluster's coordinators answer "moving" for a moment, as in load().
        tps = [TopicPartition(topic, int(q), off) for q, off in offsets.items()]
        for delay in (*_COORDINATOR_RETRY_S, None):
            try:
                done = await self._run(self._commit, group, tps)
            except KafkaException as e:
                if delay is None or not is_coordinator_moving(error_of(e)):
                    raise BrokerUnavailable(f"saving offsets of group {group}: {e}") from None
                await asyncio.sleep(delay)
                continue
            failed = [tp for tp in done or [] if tp.error is not None]
            if not failed:
                return
            if delay is None or not is_coordinator_moving(failed[0].error):
                raise BrokerUnavailable(f"saving offsets of group {group}: {failed[0].error}")
            await asyncio.sleep(delay)

    async def load(self, group: str, topic: str, partitions: list[int]) -> dict[str, int]:
        """The offsets ``group`` holds for those partitions of ``topic`` (none: left out)."""
        tps = [TopicPartition(topic, p) for p in partitions]
        for delay in (*_COORDINATOR_RETRY_S, None):
            try:
                got = await self._run(self._committed, group, tps)
                break
            except KafkaException as e:
                # A new cluster creates __consumer_offsets on the first group request, and its
                # coordinators answer NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS for a moment
                # (the first /message of `make run` on Apache Kafka met a 503 here).
                if delay is None or not is_coordinator_moving(error_of(e)):
                    raise BrokerUnavailable(f"reading offsets of group {group}: {e}") from None
                await asyncio.sleep(delay)
        # A partition the group has no offset for answers OFFSET_INVALID (-1001).
        return {str(tp.partition): tp.offset for tp in got if tp.error is None and tp.offset >= 0}

    async def forget(self, group: str) -> None:
        """Delete the group and its offsets (nothing if there is none)."""
        # An admin request (there is no consumer API for it), so the abort above can happen
        # here too; it runs only when an operator deletes a consumer with its offsets.
        with self._lock:
            c = self._groups.pop(group, None)
        if c is not None:
            await self._run(c.close)
        try:
            await asyncio.wrap_future(
                self._clients.admin.delete_consumer_groups([group], request_timeout=10)[group])
        except KafkaException as e:
            err = error_of(e)
            if err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return
            raise BrokerUnavailable(f"deleting group {group}: {e}") from None
