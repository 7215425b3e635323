"""What choosing a queue costs Redis as a topic's partitions grow (issue 35).

    .venv/bin/python bench/choose_cost.py           # --queues 1,16,64,256,1024,4096 --calls 400

choose.lua's own time in Redis (``SLOWLOG`` with a threshold of 0, median and p90 per call),
called through the project's script registration as ``/message`` calls it: a cluster-mode
consumer over a topic of N queues, each with a backlog, every lock given back at once (so
each call scans the same queues), against a private redis-server. Also the bytes of the request
(the scan's arguments carry every queue's watermarks). The number to beat (issue 35): ~50 us at
every size.

Three ways, alternately in one run: ``scan`` (the watermarks as a dict: choose.lua's full path,
what every /message did before issue 35), ``index`` (the process's MarkLog with nothing changed:
the delta path, the common case), ``index+1`` (one queue's high watermark moved before each call,
as a fetch response's does; one consumer, so each request carries that one change: with G
groups in turn each carries the G changes since its last). ``unlock`` is unlock.lua's time on
the indexed consumer (it places the queue back in the ready index, as an ack does).
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
from gateway.store.marks import MarkLog  # noqa: E402

NO_ERA = "local info = ''"  # the variant without the era check (bench/redis_ha.py)


async def choose_us(url: str, queues: int, calls: int, era: bool = True,
                    mode: str = "scan") -> tuple[float, float, float, int]:
    """(median, p90) us of choose.lua per call over a topic of ``queues`` queues, unlock.lua's
    median, and the median request's argument bytes."""
    store = OffsetStore.connect(url, f"bench{os.getpid()}{mode}")
    if not era:
        text = scripts.source("choose").replace("local info = redis.pcall('INFO', 'server')",
                                                 NO_ERA)
        assert NO_ERA in text
        store._choose = store.redis.register_script(text)
    sync = redis.Redis.from_url(url)
    wm = {str(q): (0, 1_000_000) for q in range(queues)}
    log = MarkLog(wm)
    sizes: list[int] = []
    inner = store._choose

    async def measured(keys: list[str], args: list[object]) -> object:
        sizes.append(sum(len(str(a)) for a in args))
        return await inner(keys=keys, args=args)

    store._choose = measured  # type: ignore[assignment]
    try:
        for i in range(50):  # every consumer's first (full) call, not measured
            lock = await store.choose(f"g{i}", "", "t", log if mode != "scan" else wm,
                                      address="bench", default_timeout_ms=60_000,
                                      default_start="earliest", client_idle_ms=60_000,
                                      max_messages=10)
            await store.unlock(f"g{i}", "", "t", lock.queue, lock.token)  # type: ignore[union-attr]
        sizes.clear()
        sync.config_set("slowlog-log-slower-than", 0)
        sync.config_set("slowlog-max-len", 2 * calls + 100)
        sync.slowlog_reset()
        for i in range(calls):
            if mode == "index+1":
                q = str(i % queues)
                log.update({**log.queues, q: (0, log.queues[q][1] + 1)}, (q,))
            g = "g0" if mode == "index+1" else f"g{i % 50}"
            lock = await store.choose(g, "", "t", log if mode != "scan" else wm,
                                      address="bench", default_timeout_ms=60_000,
                                      default_start="earliest", client_idle_ms=60_000,
                                      max_messages=10)
            await store.unlock(g, "", "t", lock.queue, lock.token)  # type: ignore[union-attr]
        entries = sync.slowlog_get(2 * calls + 100)
        durations = sorted(e["duration"] for e in entries
                           if e["command"].startswith(b"EVALSHA " + inner.sha.encode()))
        unlocks = sorted(e["duration"] for e in entries
                         if e["command"].startswith(b"EVALSHA " + store._unlock.sha.encode()))
        return (float(statistics.median(durations)), float(durations[int(len(durations) * 0.9)]),
                float(statistics.median(unlocks)), int(statistics.median(sizes)))
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
        print("| queues | way | choose.lua us (median) | p90 | unlock.lua us | request bytes |")
        print("| --- | --- | --- | --- | --- | --- |")
        asyncio.run(choose_us(svc.extra["url"], 16, args.calls, mode="scan"))  # warm-up
        for n in (int(x) for x in args.queues.split(",")):
            for mode in ("scan", "index", "index+1"):
                med, p90, unlock, size = asyncio.run(choose_us(svc.extra["url"], n, args.calls,
                                                               mode=mode))
                print(f"| {n:,} | {mode} | {med:,.0f} | {p90:,.0f} | {unlock:,.0f} | {size:,} |",
                      flush=True)
        print(f"load average after: {os.getloadavg()}")
    finally:
        svc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
