"""Writing records: the choice of producer, the wait for every acknowledgement, and the port's
error for each record that failed (:func:`.errors.produce_error`)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from ..base import OutgoingMessage, ProduceError, ProduceResult, payload_bytes
from .clients import Clients
from .errors import produce_error

#: Produce requests with at most this many messages go through a producer with a shorter linger.
_SMALL_PRODUCE = 8
#: librdkafka's default ``message.max.bytes``: the largest record the producer sends.
_MESSAGE_MAX_BYTES = 1_000_000
#: (producer, topic) pairs whose metadata was asked for are remembered up to this many.
_LEARNED_MAX = 10_000


class Sender:
    """Sends records through the process's producers and waits for their acknowledgements."""

    def __init__(self, clients: Clients) -> None:
        self._clients = clients
        #: The producer's per-record limit, named in the error of a record over it.
        self._max_record_bytes = int(clients.common.get("message.max.bytes", _MESSAGE_MAX_BYTES))
        self._learned: set[tuple[int, str]] = set()  # (producer, topic) metadata asked for

    async def _learn(self, producer: Producer, topic: str) -> None:
        """Ask for a topic's metadata before a producer's first write to it. Measured on Apache
        Kafka 4.1: a producer's (and a consumer's) first request for a topic it had not seen
        waited ~1 s for the next periodic metadata refresh; after a metadata request, tens of
        ms. Every first delayed record through a level topic was a second late for it."""
        try:
            await self._clients.run(producer.list_topics, topic, 5)
        except KafkaException:
            return  # the write finds out, as before
        if len(self._learned) >= _LEARNED_MAX:
            self._learned.clear()
        self._learned.add((id(producer), topic))

    def _producer(self, messages: list[OutgoingMessage], urgent: bool | None) -> Producer:
        if urgent is None:
            urgent = len(messages) <= _SMALL_PRODUCE
        # Writes into the delay wheel go through the lingering producer whatever their number: a
        # delayed request splits over up to 21 level topics, and through the short linger each
        # of them was a batch of its own (measured: the broker's per-batch cost capped delayed
        # produce at 4,150 records/s on Apache Kafka, BENCHMARKS.md issue 12).
        return self._clients.small_producer if urgent else self._clients.producer

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        """One result per message, in order, once each was acknowledged or failed."""
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

        def fail(i: int, err: KafkaError, limit: int | None) -> None:
            r = results[i]
            r.error_code = produce_error(err)
            r.error = too_large(messages[i], limit) \
                if r.error_code is ProduceError.MESSAGE_TOO_LARGE else err.str()
            settle()

        def on_delivery(i: int) -> Any:
            def cb(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    fail(i, err, None)  # refused by the broker: over the topic's limit
                    return
                results[i].queue, results[i].offset = str(msg.partition()), msg.offset()
                settle()
            return cb

        producer = self._producer(messages, urgent)
        if (id(producer), topic) not in self._learned:
            await self._learn(producer, topic)
        produce = producer.produce
        for i, m in enumerate(messages):
            kwargs = produce_kwargs(m, on_delivery(i))
            while True:
                try:
                    produce(topic, **kwargs)
                    break
                except BufferError:
                    await asyncio.sleep(0.005)  # local queue full: let the poll thread drain it
                except KafkaException as e:  # refused before sending: over the producer's limit
                    fail(i, e.args[0], self._max_record_bytes)
                    break
        await done
        return results


def produce_kwargs(m: OutgoingMessage, on_delivery: Any) -> dict[str, Any]:
    """librdkafka's ``produce`` arguments for one message (one spelling for every producer)."""
    kwargs: dict[str, Any] = {"value": m.value, "key": m.key, "on_delivery": on_delivery}
    if m.headers:
        kwargs["headers"] = m.headers
    if m.queue is not None:
        kwargs["partition"] = int(m.queue)
    if m.timestamp is not None:
        kwargs["timestamp"] = m.timestamp
    return kwargs


def too_large(m: OutgoingMessage, limit: int | None) -> str:
    """Say how large the record is and which limit it exceeds: the producer's (``limit``, refused
    before sending) or, when the broker refused it (``limit`` None), the topic's."""
    size = payload_bytes(m.key, m.value, m.headers)
    if limit is not None:
        return (f"record is {size:,} bytes (key, value and headers), over the limit of {limit:,} "
                "bytes per record (librdkafka message.max.bytes; raise it with MQGW_KAFKA_CONFIG="
                "message.max.bytes=N, and the topic's max.message.bytes on the broker with it)")
    return (f"the broker refused a record of {size:,} bytes (key, value and headers) as too large: "
            "over the topic's max.message.bytes (Apache Kafka's default is 1,048,588 bytes)")
