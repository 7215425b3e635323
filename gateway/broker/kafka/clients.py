"""The librdkafka clients of a process, their settings, and their lifecycle.

Per process the adapter keeps two producers (a lingering one for bulk writes, a short-lingering
one for requests of a few records), each with a thread that polls it (it resolves delivery
callbacks), one admin client for CreateTopics and listings, one metadata consumer (metadata and
ListOffsets), and a pool of fetch consumers with partition affinity (:mod:`.fetch`). Every blocking call on
them runs in one thread pool (:meth:`Clients.run`); checkpoint groups have consumers and
threads of their own (:mod:`.groups`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from ..partitioner import LIBRDKAFKA_PARTITIONER
from . import clientlog
from .fetch import FetchPool

log = logging.getLogger("mqgw.kafka")

#: At a stop, how long the producers may take to send what they hold (both together). What
#: they still hold then was never acknowledged to anyone (its request was answered 503, or it is
#: the relay's, which sends it again), so a stop does not wait for a broker that is away; a
#: healthy broker takes milliseconds. With the drain's 4 s (api/drain.py) and CLOSE_S a node
#: whose broker hangs stops in ~8 s (measured 9.2 s with 5 s each).
FLUSH_S = 2.0
#: At a stop, how long closing the consumers may take (off the event loop) before the process
#: goes on without them.
CLOSE_S = 2.0

#: librdkafka settings of every client (producers, admin, consumers); the operator's
#: ``kafka_config`` comes after them and may override them.
#: - ``metadata.recovery.strategy``: ``rebootstrap`` (librdkafka's default since 2.10). With
#:   ``none`` a client that was told by a broker's metadata answer that no broker is alive (a
#:   single broker fenced by its KRaft controller, for the ~1 s after it came back) forgot
#:   every broker and never went back to ``bootstrap.servers``: every node answered 503
#:   ``Broker transport failure`` until restarted (13-37 minutes, 4 times on loaded machines;
#:   tests/system/test_broker_fenced.py stuck at the 2nd of 3 fencings). Its cost while every
#:   broker is really down: each failed connect starts a re-bootstrap that replaces the
#:   bootstrap brokers and their threads (librdkafka issues 5088, 5546). Measured on an idle
#:   worker pointed at a closed port (20 clients, relay on; bench/broker_down.py, BENCHMARKS.md):
#:   38 new threads/s and ~5 % of a core, against 0 and ~4 % with ``none``
#:   (tests/system/test_broker_down.py bounds the threads).
#: - ``reconnect.backoff.ms``: a consumer (Python's always has a group) looks for its group
#:   coordinator every ``reconnect.backoff.ms / 2`` (at most 1 s) whatever the per-broker
#:   backoff: 20 connects/s per client at the default 100 ms, 2/s at 1,000. It is also the first
#:   pause before reconnecting to a broker that dropped a connection (doubling up to
#:   ``reconnect.backoff.max.ms``, 10 s). With librdkafka's 100 ms and re-bootstrapping: 337
#:   new threads/s and ~18 % of a core in the same measurement.
BROKER_DOWN: dict[str, str | int] = {"metadata.recovery.strategy": "rebootstrap",
                                     "reconnect.backoff.ms": 1000}


def common_conf(bootstrap: str, extra: dict[str, str] | None) -> dict[str, Any]:
    """The settings every client is built from. ``logger``: librdkafka's lines join the JSON
    log (clientlog.py), never stderr."""
    return {"bootstrap.servers": bootstrap, **BROKER_DOWN, **(extra or {}),
            "logger": clientlog.LOGGER}


def producer_conf(common: dict[str, Any], linger_ms: float, timeout_ms: int) -> dict[str, Any]:
    return {
        # Keys land where Java clients put them (partitioner.py); before the common settings,
        # so that MQGW_KAFKA_CONFIG=partitioner=... can still choose another rule.
        "partitioner": LIBRDKAFKA_PARTITIONER,
        **common,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": linger_ms,
        "message.timeout.ms": timeout_ms,
        "queue.buffering.max.messages": 1_000_000,
        "socket.nagle.disable": True,
    }


def consumer_conf(common: dict[str, Any], max_batch: int) -> dict[str, Any]:
    """The fetch and metadata consumers' settings (``max_batch``: the most records a read
    returns)."""
    # Measured on the test broker: without backoff 0 and a short fetch wait, reading at an
    # explicit offset costs ~30 ms median instead of ~2 ms. A seek parses up to fetch.max.bytes
    # of records: 4 MB cost 7 ms of CPU per seek, 1 MB 1.8 ms.
    # Smaller is not safe: Kafka returns a first record batch larger than the limit whole
    # (KIP-74), but the test broker does not, and producers write batches of up to 1 MB.
    # Prefetching two batches' worth lets a consumer skip a batch another node served.
    return {
        **common,
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
        "queued.min.messages": 2 * max_batch,
        "queued.max.messages.kbytes": 8192,
        "fetch.max.bytes": 1024 * 1024,
        "max.partition.fetch.bytes": 1024 * 1024,
        "socket.nagle.disable": True,
    }


class Clients:
    """The long-lived clients, made in :meth:`start` and released in :meth:`close`."""

    producer: Producer
    #: Requests of a few messages are latency-bound: the bulk linger would be most of their
    #: time. Bulk requests keep the longer linger, which the broker needs to get large batches.
    small_producer: Producer
    admin: AdminClient
    #: Metadata requests for one topic: it never asks the broker to auto-create a topic it names
    #: (allow.auto.create.topics=false).
    meta: Consumer
    pool: FetchPool

    def __init__(self, common: dict[str, Any], *, pool_size: int, max_batch: int,
                 produce_timeout_ms: int, produce_linger_ms: int) -> None:
        self.common = common
        self._pool_size = pool_size
        self._max_batch = max_batch
        self._produce_timeout_ms = produce_timeout_ms
        self._linger_ms = produce_linger_ms
        self.executor = ThreadPoolExecutor(max_workers=pool_size + 2, thread_name_prefix="kafka")
        #: The readiness probe's thread: never queued behind the pool's blocked calls.
        self.probe = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-probe")
        self.running = False
        self._pollers: list[threading.Thread] = []

    def consumer_conf(self) -> dict[str, Any]:
        return consumer_conf(self.common, self._max_batch)

    def start(self) -> None:
        conf = producer_conf(self.common, self._linger_ms, self._produce_timeout_ms)
        self.producer = Producer(conf)
        self.small_producer = Producer({**conf, "linger.ms": 0.5})
        self.admin = AdminClient(dict(self.common))
        # read_uncommitted: its ListOffsets at the log end answer the high watermark (with
        # read_committed, the last stable offset), as the admin client's did (metadata.py).
        self.meta = Consumer({**self.consumer_conf(), "isolation.level": "read_uncommitted"})
        self.pool = FetchPool(lambda: Consumer(self.consumer_conf()), self._pool_size, self.run)
        self.running = True
        self._pollers = [
            threading.Thread(target=self._poll_loop, args=(self.producer,),
                             name="kafka-producer-poll", daemon=True),
            threading.Thread(target=self._poll_loop, args=(self.small_producer,),
                             name="kafka-producer-poll-small", daemon=True)]
        for t in self._pollers:
            t.start()

    def _poll_loop(self, producer: Producer) -> None:
        # Clients nothing else polls: their log lines wait in their queue for a poll (clientlog.py).
        quiet = (self.admin, self.meta) if producer is self.producer else ()
        while self.running:
            try:
                producer.poll(0.05)
                for client in quiet:
                    client.poll(0)
            except RuntimeError:  # a client closed under it ("Consumer closed"): stopping
                if self.running:
                    raise
                return

    async def close(self) -> None:
        """Flush the producers (for at most :data:`FLUSH_S` in all), then stop the poll threads
        and close the consumers, off the event loop and for at most :data:`CLOSE_S`.

        Before, closing the consumers ran on the event loop and a stop hung there for 20-110 s
        (``self.meta.close()`` waits for librdkafka's threads, which wait for a broker that
        does not answer). A close that overruns is left to a daemon thread: the process exits
        without it, and what it would have closed goes with the process."""
        deadline = time.monotonic() + FLUSH_S
        for producer in (self.producer, self.small_producer):
            await self.run(producer.flush, max(0.0, deadline - time.monotonic()))
        self.running = False
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        def close_all() -> None:
            for t in self._pollers:
                t.join(timeout=2)
            self.pool.close()
            self.meta.close()
            try:
                loop.call_soon_threadsafe(finish)
            except RuntimeError:  # the loop is gone: the stop went on without this close
                pass

        threading.Thread(target=close_all, name="kafka-close", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), CLOSE_S)
        except TimeoutError:
            log.warning("the Kafka clients did not close within %.0f s; exiting without them",
                        CLOSE_S)
        self.executor.shutdown(wait=False)
        self.probe.shutdown(wait=False)

    async def run(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, a blocking librdkafka call, in the clients' thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
