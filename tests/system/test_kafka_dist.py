"""Apache Kafka from its Maven Central jars runs here (issue 11, first step).

Started through ``gateway.cli.kafka_dist`` (resolved once into a cache, then ``kafka.Kafka`` in
KRaft combined mode), it must do what Tansu gets wrong (README.md, Known limitations):
ListOffsets(latest) is the high watermark even when one batch holds many records, and a time
after the last record finds no offset.
"""

from __future__ import annotations

import time

import pytest

from gateway.cli import devstack
from gateway.cli.kafka_dist import start_kafka


@pytest.mark.slow
def test_apache_kafka_starts_and_reports_exact_offsets() -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    kafka = start_kafka()
    try:
        bs = kafka.extra["bootstrap"]
        devstack.create_topic(bs, "exact", 3)
        p = Producer({"bootstrap.servers": bs, "linger.ms": 50})
        for i in range(10):  # one batch of ten records in partition 1
            p.produce("exact", value=str(i).encode(), partition=1)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bs, "group.id": "exact", "enable.auto.commit": False})
        try:
            assert c.get_watermark_offsets(TopicPartition("exact", 1), timeout=10, cached=False) == (0, 10)
            assert c.get_watermark_offsets(TopicPartition("exact", 0), timeout=10, cached=False) == (0, 0)
            future = int(time.time() * 1000) + 3_600_000
            found = c.offsets_for_times([TopicPartition("exact", 1, future)], timeout=10)
            assert found[0].offset == -1  # no record at or after that time (Tansu answers 0)
            c.assign([TopicPartition("exact", 1, 4)])
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 6 and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is not None and m.error() is None:
                    got.append(int(m.value()))
            assert got == [4, 5, 6, 7, 8, 9]
        finally:
            c.close()
    finally:
        kafka.stop()
    assert kafka.proc.poll() is not None
