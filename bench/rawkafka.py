"""The raw confluent-kafka client on the same broker: the ceiling the HTTP figures are compared to."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

#: The gateway's producer settings (gateway/broker/kafka/clients.py, producer_conf), so that the
#: raw figure and the HTTP figure pay for the same acks/idempotence/linger.
GATEWAY_PRODUCER = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 2,
    "queue.buffering.max.messages": 1_000_000,
    "socket.nagle.disable": True,
}


def value_for(seq: int, size: int) -> bytes:
    head = b"v%010d-" % seq
    return head + b"x" * (size - len(head))


def produce(bootstrap: str, topic: str, count: int, value_size: int = 100,
            max_seconds: float = 30.0, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """Produce ``count`` keyed records (fewer if ``max_seconds`` runs out) and flush; msgs/s."""
    errors = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    # Delivery reports only for failures: the usual fire-and-flush way to drive librdkafka.
    p = Producer({"bootstrap.servers": bootstrap, **(conf if conf is not None else GATEWAY_PRODUCER),
                  "delivery.report.only.error": True, "on_delivery": on_delivery})
    values = [value_for(i, value_size) for i in range(1024)]
    keys = [b"k%d" % i for i in range(1024)]

    # Connect and learn the topic's metadata before the clock starts.
    p.produce(topic, value=values[0], key=keys[0])
    p.flush(10)
    sent = 1
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    produce_ = p.produce
    poll = p.poll
    i = 1
    while i < count:
        try:
            produce_(topic, value=values[i & 1023], key=keys[i & 1023])
        except BufferError:
            poll(0.005)
            continue
        i += 1
        if not i & 0x3FFF:
            poll(0)
            if time.perf_counter() > deadline:
                break
    left = p.flush(60)
    t1 = time.perf_counter()
    sent = i - 1
    return {"records": sent, "seconds": round(t1 - t0, 3), "records_per_s": sent / (t1 - t0),
            "errors": errors[0] + left, "total_in_topic": i}


def consume(bootstrap: str, topic: str, partitions: int, expected: int,
            max_seconds: float = 30.0) -> dict[str, Any]:
    """Assign every partition at offset 0 and read ``expected`` records; msgs/s."""
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "bench-raw",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "fetch.queue.backoff.ms": 0,
        "auto.offset.reset": "earliest",
    })
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        nbytes = 0
        errors = 0
        t0 = time.perf_counter()
        deadline = t0 + max_seconds
        while got < expected and time.perf_counter() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        errors += 1
                    continue
                got += 1
                nbytes += len(m.value())
        t1 = time.perf_counter()
    finally:
        c.close()
    return {"records": got, "seconds": round(t1 - t0, 3), "records_per_s": got / (t1 - t0),
            "errors": errors, "complete": got >= expected}
