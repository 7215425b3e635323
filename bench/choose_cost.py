"""What choosing a queue costs Redis as a topic's partitions grow (issue 35's baseline).

    .venv/bin/python bench/choose_cost.py           # --queues 1,16,64,256,1024,4096 --calls 400

choose.lua's own time in Redis (``SLOWLOG`` with a threshold of 0, median and p90 per call),
called through the project's script registration as ``/message`` calls it: a cluster-mode
consumer over a topic of N queues, each with a backlog, every lock given back at once (so
each call scans the same queues), against a private redis-server. Also the bytes of the request
(its arguments carry every queue's watermarks). The number to beat (issue 35): ~50 us at every
size.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from gateway.cli import devstack  # noqa: E402
from gateway.store import OffsetStore, scripts  # noqa: E402

NO_ERA = "local info = ''"  # the variant without the era check (bench/redis_ha.py)


async def choose_us(url: str, queues: int, calls: int, era: bool = True) -> tuple[float, float]:
    """(median, p90) us of choose.lua per call over a topic of ``queues`` queues."""
    store = OffsetStore.connect(url, f"bench{os.getpid()}")
    if not era:
        text = scripts.source("choose").replace("local info = redis.pcall('INFO', 'server')",
                                                 NO_ERA)
        assert NO_ERA in text
        store._choose = store.redis.register_script(text)
    sync = redis.Redis.from_url(url)
    wm = {str(q): (0, 1_000_000) for q in range(queues)}
    try:
        sync.config_set("slowlog-log-slower-than", 0)
        sync.config_set("slowlog-max-len", calls + 100)
        sync.slowlog_reset()
        for i in range(calls):
            lock = await store.choose(f"g{i % 50}", "", "t", wm, address="bench",
                                      default_timeout_ms=60_000, default_start="earliest",
                                      client_idle_ms=60_000, max_messages=10)
            await store.unlock(f"g{i % 50}", "", "t", lock.queue, lock.token)  # type: ignore[union-attr]
        durations = sorted(e["duration"] for e in sync.slowlog_get(calls + 100)
                           if e["command"].startswith(b"EVALSHA " + store._choose.sha.encode()))
        return float(statistics.median(durations)), float(durations[int(len(durations) * 0.9)])
    finally:
        sync.config_set("slowlog-log-slower-than", 10_000)
        sync.close()
        await store.aclose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", default="1,16,64,256,1024,4096")
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    svc = devstack.start_redis()
    try:
        print(f"load average before: {os.getloadavg()}")
        print("| queues | choose.lua us (median) | p90 | request args (bytes) |")
        print("| --- | --- | --- | --- |")
        for n in (int(x) for x in args.queues.split(",")):
            med, p90 = asyncio.run(choose_us(svc.extra["url"], n, args.calls))
            argv = sum(len(str(q)) + len("0") + len("1000000") for q in range(n))
            print(f"| {n:,} | {med:,.0f} | {p90:,.0f} | ~{argv:,} |", flush=True)
    finally:
        svc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
