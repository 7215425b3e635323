"""What idle gateway nodes cost the broker and Redis.

Starts redis-server, the broker (Tansu) and N gateway nodes (2 workers each, the same
command line as ``mqgw serve``), drives a short burst of produce + fetch/ack through every
node (so each worker's Kafka clients and fetch pool are warm, as after real traffic), stops
all clients, lets things settle, then measures the CPU of every process over a window in
which nobody sends a request::

    .venv/bin/python bench/idle.py --nodes 3 --window 20
    .venv/bin/python bench/idle.py --nodes 3 --gateway-src /tmp/before   # another tree

Reported as % of one core per process (broker, redis, each node's workers summed), and the
broker's and Redis' figures with no gateway running at all (the floor).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import procstat  # noqa: E402
from gateway.cli import devstack  # noqa: E402
from run import Stack, http_json, start_gateway  # noqa: E402

TOPIC = "idle-bench"


def cpu_window(named: dict[str, int], seconds: float) -> dict[str, float]:
    s0, t0 = procstat.snapshot(named), time.monotonic()
    time.sleep(seconds)
    return procstat.usage(s0, procstat.snapshot(named), time.monotonic() - t0)


def warm(port: int, partitions: int) -> None:
    """Produce to every partition and fetch + ack from each through this node."""
    recs = [{"value": f"v{i}", "partition": i % partitions} for i in range(partitions * 4)]
    status, body = http_json(port, "POST", "/produce", {"topic": TOPIC, "messages": recs})
    assert status == 200, (status, body)
    for _ in range(partitions * 2):
        status, body = http_json(port, "GET", f"/message?topic={TOPIC}&consumer=idle&max=8&wait_ms=0")
        if status == 200 and body.get("requestId"):
            http_json(port, "POST", "/ack", {"requestId": body["requestId"]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--window", type=float, default=20.0, help="measured idle seconds (20)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the last request (5)")
    ap.add_argument("--gateway-src", default=str(ROOT))
    ap.add_argument("--gateway-env", action="append", default=[], metavar="K=V")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    env = {"MQGW_AUTH": "false", "MQGW_OPEN_MODE": "true", "MQGW_START_POSITION": "earliest",
           "MQGW_ACCESS_LOG": "false", **dict(kv.split("=", 1) for kv in args.gateway_env)}
    stack = Stack()
    res: dict[str, Any] = {"command": " ".join(sys.argv), "nodes": args.nodes, "window_s": args.window}
    try:
        redis = stack.add(devstack.start_redis())
        broker = stack.add(devstack.start_broker())
        bs = broker.extra["bootstrap"]
        devstack.create_topic(bs, TOPIC, args.partitions)
        base = {"redis": redis.proc.pid, "broker": broker.proc.pid}
        time.sleep(args.settle)
        res["floor"] = cpu_window(base, args.window)
        named = dict(base)
        ports = []
        for n in range(args.nodes):
            gw, workers = start_gateway(stack, redis.extra["url"], bs, args.workers, env,
                                        Path(args.gateway_src).resolve())
            ports.append(gw.port)
            named[f"node{n + 1}"] = gw.proc.pid
            for i, w in enumerate(workers):
                named[f"node{n + 1}.w{i + 1}"] = w
        for port in ports:
            warm(port, args.partitions)
        time.sleep(args.settle)
        res["idle"] = cpu_window(named, args.window)
    finally:
        stack.stop()
    nodes = {f"node{n + 1}": round(sum(v for k, v in res["idle"].items()
                                       if k.startswith(f"node{n + 1}")), 1) for n in range(args.nodes)}
    print(f"floor (no gateway): broker {res['floor']['broker']}% redis {res['floor']['redis']}%")
    print(f"{args.nodes} idle nodes:     broker {res['idle']['broker']}% redis {res['idle']['redis']}%"
          f"  gateway processes {nodes} (% of one core over {args.window:.0f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
