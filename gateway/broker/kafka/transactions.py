"""Exactly-once hops for the delay relay: records and the position they were read up to, written
in one Kafka transaction (the port's :meth:`Broker.write_once`).

One transactional producer per source queue (``transactional.id`` = the group and the queue),
the way Kafka Streams (EOS v1) gives each input partition one: a relay that takes the queue over
makes its producer, and ``init_transactions`` fences every older producer of that id, so a relay
that lost the queue (its lock ran out while it stalled) can no longer commit what it was
sending; its transaction is aborted and read_committed readers (every gateway read) never see
it. The position goes to the consumer group ``group`` in the same transaction
(``send_offsets_to_transaction``), so "written" and "read up to here" commit together.

A producer's view of the position is exact from its ``init_transactions`` on: any other commit
for the queue would have needed a newer producer of the same id, which fences this one. So the
position is read once per producer (after its init) and then followed; a call whose ``start``
differs from it makes the producer again (someone else moved the queue) and reads again. A
position past ``start`` means the range was written already (a relay committed and died before
telling Redis): :class:`AlreadyWritten`, and the caller moves on from there.

Producers are kept per process, least recently used closed first (:data:`WRITERS`): each is a
librdkafka instance with its own threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from ..base import AlreadyWritten, BrokerUnavailable, OutgoingMessage, ProduceError, ProduceResult
from .clients import Clients, producer_conf
from .errors import produce_error
from .groups import CheckpointGroups
from .produce import produce_kwargs

#: Transactional producers kept per process: one per level queue it moved records of lately,
#: least recently used closed first, and any unused for :data:`IDLE_S`. Each costs 4 librdkafka
#: threads with one broker (measured; a thread more per broker) and making one ~55 ms (its
#: connection, then init_transactions): a queue that moves to another relay process costs that
#: once. 64 covers the default wheel's busy levels; with 16 of a test's 40 level queues, every
#: hop made a producer.
WRITERS = 64
IDLE_S = 60.0
#: Threads for transactions (a call holds one from begin to commit).
_THREADS = 8
#: Bounds (s) of the blocking transactional calls.
_INIT_S = 10.0
_COMMIT_S = 10.0


@dataclass(slots=True)
class _Writer:
    producer: Producer
    #: The position the group holds for the queue, as of this producer's init, then its commits
    #: (None: the group holds none).
    position: int | None
    lock: threading.Lock
    known_topics: set[str]
    used: float = 0.0  # time.monotonic() of the last write


class TransactionalWriters:
    def __init__(self, clients: Clients, groups: CheckpointGroups, timeout_ms: int) -> None:
        self._clients = clients
        self._groups = groups
        self._timeout_ms = timeout_ms
        self._writers: OrderedDict[str, _Writer] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="kafka-txn")
        #: Producers made (each an init_transactions and a position read): the cost a queue
        #: moving between relay processes adds.
        self.made = 0

    def close(self) -> None:
        with self._lock:
            writers = list(self._writers.values())
            self._writers.clear()
        for w in writers:
            _close(w)
        self._executor.shutdown(wait=False)

    async def write(self, group: str, source_topic: str, source_queue: str, start: int, end: int,
                    batches: dict[str, list[OutgoingMessage]]) -> dict[str, list[ProduceResult]]:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._write, group, source_topic, source_queue, start, end, batches)

    # -- on a transaction thread --------------------------------------------------------------
    def _write(self, group: str, source_topic: str, source_queue: str, start: int, end: int,
               batches: dict[str, list[OutgoingMessage]]) -> dict[str, list[ProduceResult]]:
        txn_id = f"{group}.{source_topic}.{source_queue}"
        source = TopicPartition(source_topic, int(source_queue))
        for attempt in range(2):
            w, fresh = self._writer(txn_id, group, source)
            with w.lock:
                if w.position is not None and w.position != start and not fresh:
                    self._drop(txn_id, w)  # the queue moved since this producer's init: again
                    continue
                if w.position is not None and w.position > start:
                    raise AlreadyWritten(w.position)
                try:
                    return self._transaction(w, group, source, end, batches)
                except (KafkaException, SystemError) as e:
                    # (a fatal error raised out of flush() while delivery reports are served
                    # comes as a SystemError whose cause is the KafkaException)
                    if isinstance(e, SystemError) and isinstance(e.__cause__, KafkaException):
                        e = e.__cause__
                    elif isinstance(e, SystemError):
                        raise
                    err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                    if err is not None and err.txn_requires_abort():
                        _try(w.producer.abort_transaction, _COMMIT_S)
                        raise BrokerUnavailable(f"transaction of {txn_id} aborted: {err}") from None
                    self._drop(txn_id, w)  # fenced, or fatal: a new producer, once
                    if attempt or err is None or not (err.fatal() or _fenced(err)):
                        raise BrokerUnavailable(f"transaction of {txn_id}: {e}") from None
        raise BrokerUnavailable(f"transaction of {txn_id}: the queue kept moving")

    def _transaction(self, w: _Writer, group: str, source: TopicPartition, end: int,
                     batches: dict[str, list[OutgoingMessage]]) -> dict[str, list[ProduceResult]]:
        p = w.producer
        results = {t: [ProduceResult() for _ in ms] for t, ms in batches.items()}
        reports: dict[str, list[tuple[KafkaError | None, int, int] | None]] = {
            t: [None] * len(ms) for t, ms in batches.items()}
        missing = [t for t in batches if t not in w.known_topics and not self._learn(w, t)]
        for t in missing:  # never sent: a transaction with it could only abort
            for r in results[t]:
                r.error_code, r.error = produce_error(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)), \
                    f"topic {t} does not exist"
        p.begin_transaction()
        failed = bool(missing)
        for t, ms in batches.items():
            if t in missing:
                continue
            for i, m in enumerate(ms):
                kwargs = produce_kwargs(m, _on_delivery(reports[t], i))
                while True:
                    try:
                        p.produce(t, **kwargs)
                        break
                    except BufferError:
                        p.poll(0.005)
        p.flush(self._timeout_ms / 1000)  # every delivery report served here
        for t, reps in reports.items():
            for r, rep in zip(results[t], reps, strict=True):
                if rep is None:
                    if t not in missing:
                        r.error_code, r.error = ProduceError.BROKER_TIMEOUT, "no delivery report"
                elif rep[0] is not None:
                    r.error_code, r.error = produce_error(rep[0]), rep[0].str()
                else:
                    r.queue, r.offset = str(rep[1]), rep[2]
        failed = failed or any(r.error_code is not None for rs in results.values() for r in rs)
        if failed:  # nothing of it is kept: the caller drops what failed for good, sends again
            p.abort_transaction(_COMMIT_S)
            for rs in results.values():
                for r in rs:
                    if r.error_code is None:
                        r.queue, r.offset = "", -1  # not written after all
            return results
        source.offset = end
        p.send_offsets_to_transaction([source], self._groups.metadata(group), _COMMIT_S)
        p.commit_transaction(_COMMIT_S)
        w.position = end
        return results

    def _learn(self, w: _Writer, topic: str) -> bool:
        """Ask for a topic's metadata before the producer's first write to it (a first write
        otherwise waits for the next metadata refresh, ~1 s): whether it exists."""
        try:
            md = w.producer.list_topics(topic, 5)
        except KafkaException:
            return True  # the write finds out
        tm = md.topics.get(topic)
        if tm is None or (tm.error is not None and tm.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return False
        w.known_topics.add(topic)
        return True

    def _writer(self, txn_id: str, group: str, source: TopicPartition) -> tuple[_Writer, bool]:
        now = time.monotonic()
        idle: list[_Writer] = []
        with self._lock:
            while self._writers:
                oldest_id, oldest = next(iter(self._writers.items()))
                if now - oldest.used < IDLE_S or oldest_id == txn_id:
                    break
                idle.append(self._writers.pop(oldest_id))
            w = self._writers.get(txn_id)
            if w is not None:
                self._writers.move_to_end(txn_id)
                w.used = now
        for old_writer in idle:
            _close(old_writer)
        if w is not None:
            return w, False
        conf = {**producer_conf(self._clients.common, 0.5, self._timeout_ms),
                "transactional.id": txn_id, "transaction.timeout.ms": 60_000,
                # Made while the broker serves, at most WRITERS of them: librdkafka's default
                # first backoff. The clients' 1 s (clients.BROKER_DOWN) held a new client's
                # first metadata answer 500 ms (measured: 504 ms against 2-55 ms), and a queue
                # that moved to this process waited that much more for its producer.
                "reconnect.backoff.ms": 100}
        producer = Producer(conf)
        try:
            # Connected first: init_transactions with no connection up yet may wait for
            # librdkafka's 500 ms coordinator timer (measured: 506 ms instead of 55, one in two).
            producer.list_topics(timeout=_INIT_S)
            producer.init_transactions(_INIT_S)  # fences every older producer of this id
            held = self._groups.committed_now(group, [TopicPartition(source.topic, source.partition)])
        except KafkaException as e:
            _close_producer(producer)
            raise BrokerUnavailable(f"transactional producer {txn_id}: {e}") from None
        position = next((tp.offset for tp in held if tp.error is None and tp.offset >= 0), None)
        w = _Writer(producer, position, threading.Lock(), set(), now)
        self.made += 1
        evicted: list[_Writer] = []
        with self._lock:
            old = self._writers.pop(txn_id, None)
            if old is not None:
                evicted.append(old)
            self._writers[txn_id] = w
            while len(self._writers) > WRITERS:
                evicted.append(self._writers.popitem(last=False)[1])
        for old_writer in evicted:
            _close(old_writer)
        return w, True

    def _drop(self, txn_id: str, w: _Writer) -> None:
        with self._lock:
            if self._writers.get(txn_id) is w:
                del self._writers[txn_id]
        _close_producer(w.producer)


def _on_delivery(reports: list[tuple[KafkaError | None, int, int] | None],
                 i: int) -> Callable[[KafkaError | None, Any], None]:
    """A delivery report kept as it came: read after flush() (a report of a fatal error may
    come while flush() is raising it, and calls on the error would fail then)."""
    def cb(err: KafkaError | None, msg: Any) -> None:
        reports[i] = (err, -1, -1) if err is not None else (None, msg.partition(), msg.offset())
    return cb


def _fenced(err: KafkaError) -> bool:
    return err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                          KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)


def _try(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except KafkaException:
        pass


def _close(w: _Writer) -> None:
    with w.lock:  # waits for a transaction still using it
        _close_producer(w.producer)


def _close_producer(p: Producer) -> None:
    """Close on a thread of its own: close() aborts an open transaction and flushes, which can
    block while the broker is away. A fenced producer's abort fails, as it should: quietly."""
    def close() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _try(p.close)
    threading.Thread(target=close, name="kafka-txn-close", daemon=True).start()
