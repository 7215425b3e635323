"""Connections streaming an endless request header at one node: the worker's memory, and how
``/healthz`` answers meanwhile.

Starts redis-server, the broker (Tansu) and one gateway node with one worker (the command line
of ``mqgw serve``, default settings); then ``--conns`` connections, from a process of their own,
each send a request line and a header that never ends, 64 KB at a time as fast as the node takes
them, for ``--seconds``; meanwhile ``/healthz`` is probed every 50 ms::

    .venv/bin/python bench/endless_heads.py
    .venv/bin/python bench/endless_heads.py --gateway-src /tmp/old20      # before

Reported: the worker's RSS before and at its peak, and ``/healthz`` latencies and failures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.cli import devstack  # noqa: E402


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


async def attack(port: int, conns: int, seconds: float) -> None:
    async def one() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        end, chunk = time.monotonic() + seconds, b"a" * 65536
        try:
            while time.monotonic() < end:
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), 1)
        except (ConnectionError, TimeoutError):
            pass  # cut, or no longer read
        writer.close()
    await asyncio.gather(*(one() for _ in range(conns)))


async def probe(port: int, pid: int, seconds: float) -> tuple[list[float], float, int]:
    """(/healthz latencies in ms, the worker's peak RSS, probes that failed)."""
    lat, peak, failed = [], rss_mb(pid), 0
    async with httpx.AsyncClient(timeout=30) as http:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                ok = (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            lat.append((time.monotonic() - t0) * 1000)
            failed += not ok
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.05)
    return sorted(lat), peak, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--gateway-src", default=str(ROOT), help="the tree whose gateway is served")
    ap.add_argument("--attack-port", type=int, help=argparse.SUPPRESS)  # the attackers' process
    args = ap.parse_args()
    if args.attack_port:
        asyncio.run(attack(args.attack_port, args.conns, args.seconds))
        return

    redis, broker = devstack.start_redis(), devstack.start_broker()
    port = devstack.free_port()
    env = {**os.environ, "MQGW_REDIS_URL": redis.extra["url"],
           "MQGW_KAFKA_BOOTSTRAP": broker.extra["bootstrap"], "MQGW_HMAC_KEY": "bench-hmac-key-0123456789",
           "MQGW_OPEN_MODE": "true", "MQGW_AUTH": "false", "MQGW_RELAY": "false"}
    node = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port), "--workers", "1"],
                            cwd=args.gateway_src, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        devstack.wait_port(port, timeout=30, proc=node)
        time.sleep(1)
        base = rss_mb(node.pid)  # --workers 1: the app runs in this very process
        attackers = subprocess.Popen([sys.executable, __file__, "--attack-port", str(port),
                                      "--conns", str(args.conns), "--seconds", str(args.seconds)])
        lat, peak, failed = asyncio.run(probe(port, node.pid, args.seconds))
        attackers.wait(args.seconds + 30)
        print(f"{args.gateway_src}: worker RSS {base:.0f} -> peak {peak:.0f} MB; /healthz n={len(lat)} "
              f"p50 {statistics.median(lat):.1f} p99 {lat[int(len(lat) * 0.99) - 1]:.1f} "
              f"max {lat[-1]:.1f} ms, {failed} failed")
    finally:
        os.killpg(node.pid, 15)
        node.wait(10)
        redis.stop()
        broker.stop()


if __name__ == "__main__":
    main()
