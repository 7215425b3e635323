"""How long the first record of a partition takes after ``assign`` on a consumer that has not
seen the topic, with and without asking for the topic's metadata first (Apache Kafka).

    .venv/bin/python bench/assign_probe.py            # assign only
    .venv/bin/python bench/assign_probe.py --learn    # list_topics(topic) before each first assign

Measured 2026-11-25 (2 cores, Kafka 4.1.1, librdkafka 2.x), first assign of each of 6 topics:
~1,000 ms for most (the metadata waits for the next periodic refresh), 27-85 ms with --learn;
13-22 ms for later assigns either way. gateway/broker/kafka/fetch.py (_learn) acts on it.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from confluent_kafka import Consumer, Producer, TopicPartition

from gateway.broker.kafka.clients import common_conf, consumer_conf
from gateway.cli import devstack
from gateway.cli.kafka_dist import start_kafka


def main() -> None:
    learn = "--learn" in sys.argv
    svc = start_kafka()
    bs = svc.extra["bootstrap"]
    try:
        topics = [f"probe{i}" for i in range(6)]
        for t in topics:
            devstack.create_topic(bs, t, 2)
        p = Producer({"bootstrap.servers": bs})
        for t in topics:
            for _ in range(10):
                p.produce(t, b"x", partition=0)
        p.flush()
        c = Consumer(consumer_conf(common_conf(bs, None), max_batch=1000))  # the adapter's defaults
        for rnd in range(2):
            for t in topics:
                t0 = time.monotonic()
                if learn and rnd == 0:
                    c.list_topics(t, timeout=5)
                c.assign([TopicPartition(t, 0, 0)])
                m = c.poll(5)
                while m is not None and m.error():
                    m = c.poll(5)
                print(f"round {rnd} {t}: first record after {(time.monotonic() - t0) * 1000:.0f} ms")
        c.close()
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
