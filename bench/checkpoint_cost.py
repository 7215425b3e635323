"""What one offset checkpoint round costs, to choose ``checkpoint_interval_ms``.

    .venv/bin/python bench/checkpoint_cost.py --broker kafka      # --consumers 10,100,1000

A Redis loss redelivers what was acknowledged since the last round (at full speed 14,098
records in one 5 s interval), so a shorter interval costs less after a loss; what it costs every
second is the round itself. A round (core/checkpoint.py) reads every consumer's queue hash
(Redis) and sends one OffsetCommit per consumer and topic whose offsets moved: its cost grows
with the number of consumers that moved, not with the records acknowledged.

This starts a private redis-server and the broker (Apache Kafka from its Maven jars, or Tansu),
makes a topic of ``--partitions`` partitions and, for each count of consumers: moves every
consumer's committed offsets (HSET, as acks do), then times ``Checkpoints.round()`` in this
process (wall time and this process's CPU time), ``--rounds`` times. The broker's CPU is read
from /proc for the same interval. From the figures: the share of a core a round every
``interval`` takes, for intervals 500 ms to 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.broker.kafka import KafkaBroker  # noqa: E402
from gateway.cli import devstack  # noqa: E402
from gateway.config import Settings  # noqa: E402
from gateway.core.checkpoint import Checkpoints  # noqa: E402
from gateway.store import OffsetStore, queue_field  # noqa: E402

INTERVALS_MS = (500, 1000, 2000, 5000)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status() -> dict[str, str]:
    """This process's /proc status lines (Threads, VmRSS)."""
    return dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())


async def measure(redis_url: str, bootstrap: str, broker_pid: int, counts: list[int],
                  partitions: int, rounds: int) -> list[dict[str, float]]:
    topic = f"ckcost-{os.getpid()}"
    devstack.create_topic(bootstrap, topic, partitions)
    settings = Settings(redis_url=redis_url, kafka_bootstrap=bootstrap, checkpoint_interval_ms=1000)
    store = OffsetStore.connect(redis_url)
    broker = KafkaBroker(bootstrap)
    await broker.start()
    out = []
    try:
        ck = Checkpoints(settings, store, broker)
        offset = 0
        for n in counts:
            names = [f"ck{n}-{i}" for i in range(n)]
            walls, cpus, broker_cpus = [], [], []
            for _ in range(rounds + 1):  # the first round makes the groups' consumers: not counted
                offset += 1
                async with store.redis.pipeline(transaction=False) as pipe:
                    for g in names:
                        pipe.hset(store.queues_key(g), mapping={
                            queue_field(topic, str(q), "com"): offset for q in range(partitions)})
                    await pipe.execute()
                b0, c0, t0 = proc_cpu_s(broker_pid), time.process_time(), time.perf_counter()
                copied = await ck.round(names)
                for _ in range(20 if not walls else 0):  # a new cluster's coordinators load
                    if copied == n * partitions:
                        break
                    await asyncio.sleep(0.5)
                    copied += await ck.round(names)
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                broker_cpus.append(proc_cpu_s(broker_pid) - b0)
                assert copied == n * partitions, (copied, n, partitions)
            status = proc_status()
            row = {"consumers": n, "wall_ms": statistics.median(walls[1:]) * 1000,
                   "threads": int(status["Threads"]), "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
                   "gateway_cpu_ms": statistics.median(cpus[1:]) * 1000,
                   "broker_cpu_ms": statistics.median(broker_cpus[1:]) * 1000}
            for iv in INTERVALS_MS:
                row[f"core_share_at_{iv}ms"] = (row["gateway_cpu_ms"] + row["broker_cpu_ms"]) / iv
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        await broker.close()
        await store.aclose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    ap.add_argument("--consumers", default="10,100,1000")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--group-cache", type=int, default=0,
                    help="checkpoint-group consumers kept open (default: the adapter's)")
    args = ap.parse_args()
    if args.group_cache:
        from gateway.broker.kafka import groups
        groups._GROUP_CONSUMERS = args.group_cache
    redis_svc = devstack.start_redis()
    if args.broker == "kafka":
        from gateway.cli.kafka_dist import start_kafka
        broker_svc = start_kafka()
    else:
        broker_svc = devstack.start_broker()
    try:
        assert broker_svc.proc is not None
        rows = asyncio.run(measure(redis_svc.extra["url"], broker_svc.extra["bootstrap"],
                                   broker_svc.proc.pid, [int(c) for c in args.consumers.split(",")],
                                   args.partitions, args.rounds))
    finally:
        broker_svc.stop()
        redis_svc.stop()
    print("\nconsumers  threads  RSS MB  round wall ms  gateway CPU ms  broker CPU ms  " +
          "  ".join(f"core@{iv}ms" for iv in INTERVALS_MS))
    for r in rows:
        print(f"{r['consumers']:>9}  {r['threads']:>7}  {r['rss_mb']:>6.0f}  {r['wall_ms']:>13.1f}  "
              f"{r['gateway_cpu_ms']:>14.1f}  "
              f"{r['broker_cpu_ms']:>13.1f}  " +
              "  ".join(f"{r[f'core_share_at_{iv}ms']:>10.1%}" for iv in INTERVALS_MS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
