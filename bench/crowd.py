"""A crowd of long polls on one node: 5xx, memory per waiting poll, Redis connections, and how
``/healthz`` and ``/produce`` answer meanwhile.

Starts redis-server, the broker (Tansu) and one gateway node (2 workers, the same command line
as ``mqgw serve``); opens ``--polls`` concurrent ``GET /message?wait_ms=30000`` (each on its own
connection, ``--groups`` consumers on one topic with nothing to read, opened at ``--ramp`` per
second); once they all wait, probes ``/healthz`` and a one-record ``/produce`` (on another topic)
back to back for ``--probe`` seconds; then produces one record to every partition of the polled
topic and lets every poll finish::

    .venv/bin/python bench/crowd.py --polls 10000
    .venv/bin/python bench/crowd.py --polls 10000 --gateway-src /tmp/before

Memory per poll is the growth of the workers' RSS (from /proc) divided by the polls.
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

import redis  # noqa: E402

import httpc  # noqa: E402
import procstat  # noqa: E402
from gateway.cli import devstack  # noqa: E402
from run import Stack, start_gateway  # noqa: E402

TOPIC, OTHER = "crowd", "crowd-produce"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def poll(port: int, path: str) -> int:
    """One long poll on its own connection; its status (599: the connection failed)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 599
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n".encode())
        raw = await reader.read()
        return int(raw.split(b" ", 2)[1]) if raw else 599
    except OSError:
        return 599
    finally:
        writer.close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def probe(port: int, seconds: float) -> dict[str, Any]:
    """/healthz and /produce back to back on two keep-alive connections: latencies in ms."""
    health, produce = await httpc.connect("127.0.0.1", port), await httpc.connect("127.0.0.1", port)
    body = json.dumps({"topic": OTHER, "messages": [{"value": "x"}]}).encode()
    lat: dict[str, list[float]] = {"healthz": [], "produce": []}
    codes: Counter[int] = Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, conn, raw in (("healthz", health, httpc.get("/healthz")),
                                ("produce", produce, httpc.post("/produce", body))):
            t0 = time.perf_counter()
            status, _ = await conn.request(raw)
            lat[name].append(1000 * (time.perf_counter() - t0))
            codes[status] += 1
        await asyncio.sleep(0.01)
    health.close()
    produce.close()
    return {k: {"n": len(v), "p50": round(statistics.median(v), 2), "p99": round(pct(v, 99), 2),
                "max": round(max(v), 2)} for k, v in lat.items()} | {"statuses": dict(codes)}


async def crowd(args: argparse.Namespace, port: int, workers: list[int], redis_url: str,
                bootstrap: str) -> dict[str, Any]:
    r = redis.Redis.from_url(redis_url)
    res: dict[str, Any] = {"rss_mb_before": [round(rss_mb(w), 1) for w in workers],
                           "redis_clients_before": r.info("clients")["connected_clients"]}
    polls: list[asyncio.Future[int]] = []
    t0 = time.monotonic()
    for i in range(args.polls):
        path = f"/message?topic={TOPIC}&consumer=crowd-{i % args.groups}&wait_ms=30000"
        polls.append(asyncio.ensure_future(poll(port, path)))
        if i % 100 == 99:
            await asyncio.sleep(max(0.0, t0 + (i + 1) / args.ramp - time.monotonic()))
    res["opened_s"] = round(time.monotonic() - t0, 1)
    last = -1
    while True:  # every poll has made its first choose once Redis goes quiet
        await asyncio.sleep(1.0)
        calls = int(r.info("stats")["total_commands_processed"])
        if last >= 0 and calls - last < 200:
            break
        last = calls
    res["waiting_after_s"] = round(time.monotonic() - t0, 1)
    res["rss_mb_waiting"] = [round(rss_mb(w), 1) for w in workers]
    grown = sum(res["rss_mb_waiting"]) - sum(res["rss_mb_before"])
    res["kb_per_poll"] = round(1024 * grown / args.polls, 1)
    res["redis_clients_waiting"] = r.info("clients")["connected_clients"]
    named = {f"worker{i + 1}": p for i, p in enumerate(workers)}
    named["redis"] = int(r.info("server")["process_id"])
    s0, w0 = procstat.snapshot(named), time.monotonic()
    c0 = int(r.info("stats")["total_commands_processed"])
    res["probe"] = await probe(port, args.probe)
    took = time.monotonic() - w0
    res["cpu_pct_during_probe"] = procstat.usage(s0, procstat.snapshot(named), took)
    # the probe's own produce touches no Redis in open mode: these are the waiting polls' cost
    res["redis_commands_per_s_waiting"] = round(
        (int(r.info("stats")["total_commands_processed"]) - c0) / took, 1)
    done_before = sum(p.done() for p in polls)
    from confluent_kafka import Producer  # the records that end some polls early

    prod = Producer({"bootstrap.servers": bootstrap})
    for part in range(args.partitions):
        prod.produce(TOPIC, b"wake", partition=part)
    prod.flush(10)
    statuses = Counter(await asyncio.gather(*polls))
    res["finished_early"] = done_before
    res["statuses"] = dict(statuses)
    res["errors_5xx"] = sum(n for s, n in statuses.items() if s >= 500)
    r.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--polls", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=10, help="consumer names the polls spread over")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--ramp", type=float, default=2000.0, help="polls opened per second")
    ap.add_argument("--probe", type=float, default=10.0, help="seconds of /healthz + /produce probes")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gateway-src", default=str(ROOT))
    ap.add_argument("--gateway-env", action="append", default=[], metavar="K=V")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    env = {"MQGW_AUTH": "false", "MQGW_OPEN_MODE": "true", "MQGW_ACCESS_LOG": "false",
           "MQGW_HMAC_KEY": "bench-crowd-key-0123456789", **dict(kv.split("=", 1) for kv in args.gateway_env)}
    stack = Stack()
    try:
        rsvc = stack.add(devstack.start_redis())
        broker = stack.add(devstack.start_broker())
        bs = broker.extra["bootstrap"]
        devstack.create_topic(bs, TOPIC, args.partitions)
        devstack.create_topic(bs, OTHER, 1)
        gw, workers = start_gateway(stack, rsvc.extra["url"], bs, args.workers, env,
                                    Path(args.gateway_src).resolve())
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        res = asyncio.run(crowd(args, gw.port, workers, rsvc.extra["url"], bs))
    finally:
        stack.stop()
    res = {"command": " ".join(sys.argv), "polls": args.polls, **res}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
