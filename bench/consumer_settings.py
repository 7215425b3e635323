"""librdkafka consumer settings that decide the gateway's fetch cost, measured on their own.

    .venv/bin/python bench/consumer_settings.py

Starts its own broker (Tansu), fills a 16-partition topic through the raw producer, then:

1. fetch.queue.backoff.ms: CPU burnt by *idle* consumers that are assigned to a partition
   with a backlog and already hold more than queued.min.messages (what the gateway's pooled
   consumers look like between requests), and how fast one of them reads in bulk.
2. fetch.max.bytes (and the backoff again): latency and client CPU of "assign at a new offset,
   read 32 records" (what the gateway does whenever a pooled consumer moves to another
   partition or offset).

All other settings are the gateway's fetch consumers' as of 6f568d7 (``_consumer_conf``, today
``consumer_conf`` in gateway/broker/kafka/clients.py). Its findings: BENCHMARKS.md, "fetch.queue.backoff.ms".
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

import rawkafka  # noqa: E402
from gateway.cli import devstack  # noqa: E402

TOPIC = "settings"


def conf(bs: str, backoff: int, fetch_bytes: int) -> dict:
    c = {"bootstrap.servers": bs, "group.id": "mqgw-fetch", "enable.auto.commit": False,
         "enable.auto.offset.store": False, "enable.partition.eof": True, "auto.offset.reset": "error",
         "allow.auto.create.topics": False, "fetch.queue.backoff.ms": backoff, "fetch.wait.max.ms": 10,
         "queued.min.messages": 1000, "queued.max.messages.kbytes": 16384,
         "fetch.max.bytes": fetch_bytes, "max.partition.fetch.bytes": min(fetch_bytes, 4 * 1024 * 1024),
         "socket.nagle.disable": True}
    if fetch_bytes < 1_000_000:
        c["message.max.bytes"] = fetch_bytes  # librdkafka: fetch.max.bytes >= message.max.bytes
    return c


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def read(c: Consumer, n: int) -> int:
    got = 0
    while got < n:
        msgs = c.consume(n - got, 0)
        if not msgs:
            m = c.poll(1.0)
            if m is None:
                break
            msgs = [m]
        got += sum(1 for m in msgs if m.error() is None)
    return got


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def idle_cost(bs: str, backoff: int, n: int = 4) -> str:
    cs = [Consumer(conf(bs, backoff, 256 * 1024)) for _ in range(n)]
    try:
        for i, c in enumerate(cs):
            c.assign([TopicPartition(TOPIC, i, 100)])
            read(c, 32)
        time.sleep(0.5)
        c0, t0 = cpu_s(), time.perf_counter()
        time.sleep(3)
        idle = 100 * (cpu_s() - c0) / (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        got = read(cs[0], 50_000)
        bulk = got / (time.perf_counter() - t0)
    finally:
        for c in cs:
            c.close()
    return f"fetch.queue.backoff.ms={backoff:<3}  idle assigned consumer: {idle:5.1f}% of a core each;" \
           f"  bulk read {bulk:,.0f} records/s"


def seek_cost(bs: str, backoff: int, fetch_bytes: int, n: int = 120) -> str:
    c = Consumer(conf(bs, backoff, fetch_bytes))
    lat = []
    try:
        c0 = cpu_s()
        for k in range(n):
            t0 = time.perf_counter()
            c.assign([TopicPartition(TOPIC, k % 16, 1000 + 97 * k)])
            read(c, 32)
            lat.append((time.perf_counter() - t0) * 1000)
        cpu = (cpu_s() - c0) / n * 1000
    finally:
        c.close()
    return f"fetch.max.bytes={fetch_bytes // 1024:>5} KB, fetch.queue.backoff.ms={backoff:<2}" \
           f"  assign + read 32: p50 {pct(lat, .5):5.2f} ms" \
           f"  p90 {pct(lat, .9):5.2f} ms  client CPU {cpu:5.2f} ms per read"


def main() -> None:
    broker = devstack.start_broker()
    try:
        bs = broker.extra["bootstrap"]
        devstack.create_topic(bs, TOPIC, 16)
        r = rawkafka.produce(bs, TOPIC, 2_000_000)
        print(f"filled {TOPIC}: {r['records']:,} records, 16 partitions", flush=True)
        for backoff in (0, 1, 5, 10):
            print(idle_cost(bs, backoff), flush=True)
        for fb in (8 * 1024 * 1024, 1024 * 1024, 256 * 1024, 128 * 1024):
            print(seek_cost(bs, 0, fb), flush=True)
        for backoff in (1, 2, 5):  # a new assignment waits for the backoff before its first fetch
            print(seek_cost(bs, backoff, 256 * 1024), flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
