"""Slow clients against one node: how long the server lets them hold a connection, and how
``/healthz`` and ``/produce`` answer meanwhile.

Starts redis-server, the broker (Tansu) and one gateway node (2 workers, the same command line
as ``mqgw serve``, default settings); then ``--conns`` connections from 127.0.0.2-4 each send an
unfinished request head and one more byte every ``--drip`` seconds, for ``--duration`` seconds,
while ``/healthz`` and a one-record ``/produce`` are probed back to back::

    .venv/bin/python bench/slowclients.py --conns 3000
    .venv/bin/python bench/slowclients.py --conns 3000 --gateway-src /tmp/old10   # before

Reported: how many slow connections the server dropped and after how long, how many were still
open at the end, probe latencies and statuses, worker RSS before, at the end and 10 s later.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from crowd import OTHER, pct, probe, rss_mb  # noqa: E402
from gateway.cli import devstack  # noqa: E402
from run import Stack, start_gateway  # noqa: E402


async def slow(port: int, source: str, drip: float, duration: float) -> float | None:
    """One slow client; after how long the server ended it (None: still open at the end)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError:
        return 0.0  # refused at once
    start = time.monotonic()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: b\r\nX-Slow: ")
        while time.monotonic() - start < duration:
            try:
                data = await asyncio.wait_for(reader.read(4096), drip)
            except TimeoutError:
                writer.write(b"a")
                continue
            if not data or data.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")):
                return time.monotonic() - start
        return None
    except OSError:
        return time.monotonic() - start
    finally:
        writer.close()


async def attack(args: argparse.Namespace, port: int, workers: list[int]) -> dict[str, Any]:
    res: dict[str, Any] = {"rss_mb_before": [round(rss_mb(w), 1) for w in workers]}
    sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    tasks = []
    for i in range(args.conns):
        tasks.append(asyncio.ensure_future(slow(port, sources[i % 3], args.drip, args.duration)))
        if i % 200 == 199:
            await asyncio.sleep(0.05)
    res["probe"] = await probe(port, args.duration)
    ended = await asyncio.gather(*tasks)
    res["rss_mb_end"] = [round(rss_mb(w), 1) for w in workers]
    dropped = [t for t in ended if t is not None]
    res["slow_dropped"] = len(dropped)
    res["slow_still_open_at_end"] = sum(t is None for t in ended)
    if dropped:
        res["dropped_after_s"] = {"p50": round(statistics.median(dropped), 2),
                                  "p99": round(pct(dropped, 99), 2), "max": round(max(dropped), 2)}
    await asyncio.sleep(10)
    res["rss_mb_10s_later"] = [round(rss_mb(w), 1) for w in workers]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=3000)
    ap.add_argument("--drip", type=float, default=2.0, help="seconds between two bytes (2)")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gateway-src", default=str(ROOT))
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    env = {"MQGW_AUTH": "false", "MQGW_OPEN_MODE": "true", "MQGW_ACCESS_LOG": "false",
           "MQGW_HMAC_KEY": "bench-slow-key-0123456789"}
    stack = Stack()
    try:
        rsvc = stack.add(devstack.start_redis())
        broker = stack.add(devstack.start_broker())
        devstack.create_topic(broker.extra["bootstrap"], OTHER, 1)
        gw, workers = start_gateway(stack, rsvc.extra["url"], broker.extra["bootstrap"], args.workers,
                                    env, Path(args.gateway_src).resolve())
        res = asyncio.run(attack(args, gw.port, workers))
    finally:
        stack.stop()
    res = {"command": " ".join(sys.argv), "conns": args.conns, **res}
    res["probe"]["statuses"] = dict(Counter(res["probe"]["statuses"]))
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
