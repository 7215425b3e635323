"""Scale-out: the same phases with 1, 2, 4 ... gateway nodes sharing one Redis (or a Redis
Cluster) and one Apache Kafka, each node driven by load generators of its own.

    .venv/bin/python bench/scaleout.py                       # nodes 1,2,4; noop,p1,f32
    .venv/bin/python bench/scaleout.py --nodes 1,2,4,8 --workers 2 --redis cluster
    .venv/bin/python bench/scaleout.py --nodes 1 --phases f32 --redis cluster --primaries 3 --shards 3

For each node count the run starts that many gateway nodes (``--workers`` uvicorn workers each,
``mqgw serve``'s command line), runs ``--loadgens-per-node`` load-generator processes per node
(each with ``--concurrency`` connections to its node, spread over its workers), measures every
phase, and stops the nodes; Redis and the broker stay up for the whole run. It reports per node
count: the summed req/s and records/s, the worst p99 of the load generators, the CPU of the
nodes, of each load generator (the busiest one: a generator near 100 % of a core is the limit,
not the gateway; add generators), of Redis and of the broker, and Redis's work per HTTP request
(script calls, commands, and Redis CPU microseconds). ``1e6 / redis_us_per_request`` is the
request rate one Redis core stops at; with ``--redis cluster`` (``--primaries``, 3 by default,
no replicas) the keys of different consumers land on different nodes, and the CPU is the sum of
them. One consumer group is one Redis core unless it has ``--shards`` (the consumer setting,
store/shards.py): then the busiest primary's CPU per request ("busiest Redis us/req") sets the
rate one group stops at. "Redis command us/req" counts only the time the nodes spent in
commands (INFO commandstats), without each node's idle work (a cluster's bus, its cron).

On a machine with fewer cores than nodes + generators + Redis + broker the curve flattens where
the cores run out: "machine busy" says when. Tansu is not offered: its fetch path spins on
many-core machines (BENCHMARKS.md), so its figures would measure Tansu.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procstat
import run as bench
import runargs
from gateway.cli import devstack

RESULTS = runargs.RESULTS
PHASES = ("noop", "p1", "p100", "f32", "f1000")


def redis_stats(ports: list[int]) -> dict[str, int]:
    """Commands and script calls every Redis node processed so far, summed; ``usec:<command>``:
    the time Redis spent in each command (a script's own commands count in its EVALSHA too);
    ``node_usec:<port>``: the time each node spent in commands (its idle work, such as a
    cluster's bus and cron, is not in it)."""
    import redis

    out = {"commands": 0, "scripts": 0}
    for port in ports:
        r = redis.Redis(port=port)
        try:
            stats = r.info("commandstats")
            out["commands"] += int(r.info("stats")["total_commands_processed"]) - 2  # these INFOs
        finally:
            r.close()
        out["scripts"] += sum(int(v["calls"]) for k, v in stats.items()
                              if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))
        for k, v in stats.items():
            name = "usec:" + k.removeprefix("cmdstat_")
            out[name] = out.get(name, 0) + int(v["usec"])
        out[f"node_usec:{port}"] = sum(int(v["usec"]) for v in stats.values())
    return out


def run_generators(stack: bench.Stack, specs: list[dict[str, Any]],
                   named: dict[str, int], redis_ports: list[int]) -> dict[str, Any]:
    """Start one load generator per spec at once; measure from the moment the last one opened
    its window to the moment the first one closed it (all of them loading the nodes)."""
    procs = [subprocess.Popen([sys.executable, str(bench.HERE / "loadgen.py"), json.dumps(s)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True,
                              cwd=bench.ROOT) for s in specs]
    stack.profilers.extend(procs)  # Stack.stop() kills them on an interrupt
    limit = specs[0]["warmup"] + specs[0]["duration"] + 60
    timer = threading.Timer(limit, lambda: [os.killpg(p.pid, signal.SIGKILL) for p in procs
                                            if p.poll() is None])
    timer.start()
    named = {**named, **{f"loadgen{i + 1}": p.pid for i, p in enumerate(procs)}}
    started: list[int] = []
    ended: list[int] = []
    marks: dict[str, tuple[procstat.CpuSnapshot, float, dict[str, int]]] = {}
    results: list[dict[str, Any] | None] = [None] * len(procs)
    lock = threading.Lock()

    def follow(i: int, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            line = line.strip()
            with lock:
                if line == "start":
                    started.append(i)
                    if len(started) == len(procs):
                        marks["start"] = (procstat.snapshot(named), time.monotonic(),
                                          redis_stats(redis_ports))
                elif line == "end":
                    ended.append(i)
                    if len(ended) == 1 and "start" in marks:
                        marks["end"] = (procstat.snapshot(named), time.monotonic(),
                                        redis_stats(redis_ports))
                elif line.startswith("{"):
                    results[i] = json.loads(line)

    threads = [threading.Thread(target=follow, args=(i, p)) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.wait()
    timer.cancel()
    stack.profilers.clear()
    if any(r is None for r in results) or "end" not in marks:
        raise RuntimeError(f"a load generator failed (exits {[p.returncode for p in procs]})")
    (s0, t0, c0), (s1, t1, c1) = marks["start"], marks["end"]
    cpu = procstat.usage(s0, s1, t1 - t0)
    return merge([r for r in results if r is not None], cpu, c0, c1, t1 - t0, len(procs))


def merge(results: list[dict[str, Any]], cpu: dict[str, float], c0: dict[str, int],
          c1: dict[str, int], window_s: float, generators: int) -> dict[str, Any]:
    """The generators' figures summed (rates) or worst (p99), with CPU and Redis per request."""
    out: dict[str, Any] = {}
    for k in ("req_per_s", "records_per_s", "fetch_per_s", "ack_per_s", "errors", "empty"):
        vals = [r[k] for r in results if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = round(sum(vals), 1)
    lat = [r.get("latency_ms") or r.get("message_latency_ms") or {} for r in results]
    out["p99_ms"] = max((d.get("p99", 0.0) for d in lat), default=0.0)
    requests = out.get("req_per_s") or (out.get("fetch_per_s", 0) + out.get("ack_per_s", 0))
    redis_cpu = sum(v for k, v in cpu.items() if k.startswith("redis"))
    per_s = max(requests, 1e-9)
    out["cpu_pct"] = {
        "nodes": round(sum(v for k, v in cpu.items() if k.startswith("node")), 1),
        "loadgen_busiest": max((v for k, v in cpu.items() if k.startswith("loadgen")), default=0.0),
        "loadgen_total": round(sum(v for k, v in cpu.items() if k.startswith("loadgen")), 1),
        "redis": round(redis_cpu, 1), "broker": cpu.get("broker", 0.0),
        "redis_busiest": max((v for k, v in cpu.items() if k.startswith("redis")), default=0.0),
        "machine_busy": cpu["machine_busy_pct_of_all_cores"]}
    total = requests * window_s
    out["redis_per_request"] = {
        "scripts": round((c1["scripts"] - c0["scripts"]) / max(total, 1), 3),
        "commands": round((c1["commands"] - c0["commands"]) / max(total, 1), 3),
        "cpu_us": round(redis_cpu / 100 * 1e6 / per_s, 1),
        "busiest_us": round(out["cpu_pct"]["redis_busiest"] / 100 * 1e6 / per_s, 1),
        # the command time of the node that spent most in commands, per request
        "busiest_cmd_us": round(max((c1[k] - c0.get(k, 0) for k in c1 if k.startswith("node_usec:")),
                                    default=0) / max(total, 1), 1),
        "cmd_us": round(sum(c1[k] - c0.get(k, 0) for k in c1 if k.startswith("node_usec:"))
                        / max(total, 1), 1),
        # where Redis' time went, per request: the top commands by time (scripts include theirs)
        "top_us": dict(sorted(((k[5:], round((c1.get(k, 0) - c0.get(k, 0)) / max(total, 1), 1))
                               for k in c1 if k.startswith("usec:")),
                              key=lambda kv: -kv[1])[:5])}
    out["generators"] = generators
    return out


def run_nodes(stack: bench.Stack, n: int, args: argparse.Namespace, phases: list[str],
              redis_url: str, redis_pids: list[int], redis_ports: list[int], bs: str,
              broker_pid: int, env: dict[str, str]) -> dict[str, Any]:
    """Start ``n`` nodes, measure every phase, stop them (Redis and the broker stay)."""
    first = len(stack.services)
    nodes = [bench.start_gateway(stack, redis_url, bs, args.workers, env, runargs.gateway_src(args))
             for _ in range(n)]
    named: dict[str, int] = {f"redis{i}": p for i, p in enumerate(redis_pids)}
    named["broker"] = broker_pid
    for i, (svc, workers) in enumerate(nodes):
        for j, w in enumerate(workers):
            named[f"node{i + 1}w{j + 1}"] = w
        named[f"node{i + 1}master"] = svc.proc.pid
    print(f"{n} node(s) x {args.workers} worker(s) on ports {[s.port for s, _ in nodes]}", flush=True)
    out: dict[str, Any] = {}
    try:
        specs = bench.phase_specs(args)
        for name in phases:
            spec = specs[name]
            if spec["kind"] == "consume":  # a group per node count: each run has a fresh backlog
                spec = {**spec, "group": f"{spec['group']}-n{n}"}
                bench.configure_consumer(nodes[0][0].port, spec["group"], args.shards)
            gens = [{**spec, "port": svc.port, "balance": workers, "concurrency": args.concurrency,
                     "duration": args.duration, "warmup": args.warmup}
                    for svc, workers in nodes for _ in range(args.loadgens_per_node)]
            r = run_generators(stack, gens, named, redis_ports)
            out[name] = r
            req = r.get("req_per_s") or r.get("fetch_per_s", 0) + r.get("ack_per_s", 0)
            print(f"  {name:6s} {req:>9,.0f} req/s {r.get('records_per_s', 0):>10,.0f} rec/s  "
                  f"p99 {r['p99_ms']:7.2f} ms  "
                  f"cpu {r['cpu_pct']}  redis/req {r['redis_per_request']}", flush=True)
    finally:
        for svc in stack.services[first:]:
            svc.stop()
        del stack.services[first:]
    return out


def report(res: dict[str, Any]) -> str:
    lines = ["| nodes | phase | req/s | records/s | p99 ms | nodes CPU % | busiest loadgen % | "
             "Redis CPU % | Redis us/req | busiest Redis us/req | Redis command us/req | "
             "busiest Redis command us/req | Redis scripts/req | one group stops at (req/s) | "
             "broker CPU % | machine busy % |", "| " + " | ".join(["---"] * 16) + " |"]
    for n, phases in res["runs"].items():
        for name, r in phases.items():
            req = r.get("req_per_s") or r.get("fetch_per_s", 0) + r.get("ack_per_s", 0)
            us = r["redis_per_request"]["cpu_us"]
            busiest = r["redis_per_request"].get("busiest_us", us)
            c = r["cpu_pct"]
            lines.append(f"| {n} | {name} | {req:,.0f} | {r.get('records_per_s', 0):,.0f} | "
                         f"{r['p99_ms']:.2f} | {c['nodes']:.0f} | {c['loadgen_busiest']:.0f} | "
                         f"{c['redis']:.0f} | {us:.1f} | {busiest:.1f} | "
                         f"{r['redis_per_request'].get('cmd_us', 0):.1f} | "
                         f"{r['redis_per_request'].get('busiest_cmd_us', 0):.1f} | "
                         f"{r['redis_per_request']['scripts']:.2f} | "
                         f"{(1e6 / busiest if busiest >= 1 else float('inf')):,.0f} | {c['broker']:.0f} | "
                         f"{c['machine_busy']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = runargs.parser(
        __doc__, out=RESULTS / "scaleout.json", workers_help="uvicorn workers per node (1)",
        env_help="extra environment for every node", src_help="serve the gateway package in DIR")
    ap.set_defaults(workers=1)
    ap.add_argument("--nodes", default="1,2,4", help="node counts, measured in turn (1,2,4)")
    ap.add_argument("--loadgens-per-node", type=int, default=1,
                    help="load-generator processes per node (1); raise it when the busiest one "
                         "nears 100 %% of a core")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="connections (consumers) per load generator (16)")
    ap.add_argument("--phases", default="noop,p1,f32", help=f"any of {','.join(PHASES)}")
    ap.add_argument("--redis", choices=("single", "cluster"), default="single",
                    help="one redis-server, or a Redis Cluster (--primaries masters)")
    ap.add_argument("--primaries", type=int, default=3, help="masters of --redis cluster (3)")
    ap.add_argument("--shards", type=int, default=1,
                    help="the bench consumers' shards setting (1): Redis Cluster slots per group")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=3_000_000,
                    help="records in the backlog the fetch phases read (3,000,000)")
    ap.add_argument("--paced-rate", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--delay-rate", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--max-delay-ms", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    if any(p not in PHASES for p in phases):
        ap.error(f"--phases: any of {', '.join(PHASES)}")
    counts = [int(n) for n in args.nodes.split(",") if n]
    env = runargs.gateway_env(args, {"MQGW_AUTH": "false", "MQGW_OPEN_MODE": "true",
                                     "MQGW_HMAC_KEY": "bench-" + os.urandom(16).hex()})
    res = runargs.record(args, dt.datetime.now())
    res["runs"] = {}
    stack = bench.Stack()
    runargs.stop_on_sigterm()
    try:
        if args.redis == "cluster":
            cluster = devstack.start_redis_cluster(args.primaries)
            stack.services.extend(cluster.nodes)
            redis_url, redis_ports = cluster.url, [s.port for s in cluster.nodes]
            redis_pids = [s.proc.pid for s in cluster.nodes]
        else:
            r = stack.add(devstack.start_redis())
            redis_url, redis_ports, redis_pids = r.extra["url"], [r.port], [r.proc.pid]
        broker = bench.start_broker(stack, "kafka")
        bs = broker.extra["bootstrap"]
        for t in [bench.BACKLOG_TOPIC, *(f"{bench.PRODUCE_TOPIC}-{p}" for p in phases
                                         if p.startswith("p"))]:
            bench.create_topic("kafka", bs, t, args.partitions)
        if any(p.startswith("f") for p in phases):
            print(f"backlog: {args.prefill:,} records ...", flush=True)
            bench.rawkafka.produce(bs, bench.BACKLOG_TOPIC, args.prefill, args.value_size)
        for n in counts:
            res["runs"][str(n)] = run_nodes(stack, n, args, phases, redis_url, redis_pids,
                                            redis_ports, bs, broker.proc.pid, env)
    except KeyboardInterrupt:
        stack.stop()
        print("\ninterrupted; every process this run started is stopped", file=sys.stderr)
        return 130
    finally:
        stack.stop()
    out = Path(args.out)
    runargs.write(res, out, f"scaleout-{runargs.stamp()}.json")
    print()
    print(report(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
