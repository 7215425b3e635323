"""What Redis high availability costs the consume path (issue 34), as ratios in one run.

    .venv/bin/python bench/redis_ha.py            # --rounds 3 --duration 4 --calls 2000

1. **The era check** (choose.lua asks INFO for the Redis process's run_id at every call, so a
   consumer hash written by another process is noticed): choose.lua's own time in Redis
   (``SLOWLOG`` with a threshold of 0, median per call) with the check and with it cut out of
   the prelude, alternating, for topics of 1 and 16 queues.
2. **Sentinel**: fetch+ack through a gateway node on ``redis+sentinel://`` against one on
   ``redis://`` at the same primary, alternating rounds of ``bench/loadgen.py`` (closed loop,
   ``max=1``, separate acks), on Apache Kafka. The commands sent are the same; only the way to
   the primary differs (asked of the sentinels at each new connection).

No ``WAIT`` is issued anywhere: a failover's lost writes are detected (the era), not prevented,
so there is no replica round trip to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from choose_cost import choose_us  # noqa: E402
from gateway.cli import devstack  # noqa: E402
from tests.support import start_node  # noqa: E402


def consume_round(port: int, topic: str, group: str, duration: float) -> float:
    spec = {"kind": "consume", "port": port, "topic": topic, "group": group, "max": 1,
            "concurrency": 16, "warmup": 1.0, "duration": duration, "ack": "separate"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "loadgen.py"), json.dumps(spec)],
                         capture_output=True, text=True, timeout=duration + 120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, result["error_samples"]
    return float(result["records_per_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    from confluent_kafka import Producer

    from gateway.cli.kafka_dist import start_kafka

    rs = devstack.start_redis_sentinel(replicas=1, sentinels=3)
    kafka = start_kafka()
    nodes = []
    try:
        direct = f"redis://127.0.0.1:{rs.primary_port()}/0"
        print(f"uptime: {os.getloadavg()}", flush=True)
        print("\n1. choose.lua in Redis, median us per call (with the era check / without)")
        for queues in (1, 16):
            pairs = []
            for _ in range(args.rounds):
                with_era = asyncio.run(choose_us(direct, queues, args.calls, True))[0]
                without = asyncio.run(choose_us(direct, queues, args.calls, False))[0]
                pairs.append((with_era, without))
            w = statistics.median(p[0] for p in pairs)
            wo = statistics.median(p[1] for p in pairs)
            print(f"   {queues:>2} queues: {w:.1f} / {wo:.1f} us  (ratio {w / wo:.2f}, "
                  f"+{w - wo:.1f} us; rounds {pairs})", flush=True)

        bootstrap = kafka.extra["bootstrap"]
        topic = f"ha-{os.getpid()}"
        devstack.create_topic(bootstrap, topic, 8)
        total = int(args.rounds * 2 * (args.duration + 2) * 6000)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i in range(total):
            while True:
                try:
                    p.produce(topic, b"x" * 16, partition=i % 8)
                    break
                except BufferError:  # librdkafka's queue is full: let it send
                    p.poll(0.05)
        p.flush(60)
        tmp = Path(tempfile.mkdtemp())
        via = {"sentinel": start_node(rs.url, bootstrap, tmp), "direct": start_node(direct, bootstrap, tmp)}
        nodes = list(via.values())
        group = f"ha-g-{os.getpid()}"
        import httpx

        for n in nodes:
            httpx.patch(f"{n.url}/admin/consumers/{group}", json={"start": "earliest"}).raise_for_status()
        print("\n2. fetch+ack records/s through a node on redis+sentinel:// and on redis:// "
              "(same primary, alternating rounds; max=1, 16 connections)")
        rates: dict[str, list[float]] = {"sentinel": [], "direct": []}
        for r in range(args.rounds):
            order = ("sentinel", "direct") if r % 2 == 0 else ("direct", "sentinel")
            for which in order:
                port = int(via[which].url.rsplit(":", 1)[1])
                rates[which].append(consume_round(port, topic, group, args.duration))
        s, d = statistics.median(rates["sentinel"]), statistics.median(rates["direct"])
        print(f"   sentinel {s:.0f}/s, direct {d:.0f}/s: ratio {s / d:.2f} (rounds {rates})")
        print(f"uptime: {os.getloadavg()}")
    finally:
        for n in nodes:
            n.stop()
        kafka.stop()
        rs.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
