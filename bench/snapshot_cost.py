"""What one ``mqgw snapshot`` costs Redis, on a Redis holding 10,000 consumer queue hashes.

    .venv/bin/python bench/snapshot_cost.py            # --runs 3 --keys 10000 --queues 8

It starts a private redis-server (devstack.start_redis) and fills it with a synthetic
gateway state:
- ``--keys`` consumer queue hashes of ``--queues`` queues each: 80 % cluster-mode consumers
  ``P:{G}:q``, 20 % broadcast clientIds ``P:{G}:q:<clientId>`` (4 clientIds per consumer);
- config hashes for 30 % of the consumers (some paused, some rate limited, with token buckets);
- the broadcast consumers' clientId sets, and the watermark hashes of ``--topics`` topics.

Then, per run:
1. **Alone.** It resets Redis's statistics (CONFIG RESETSTAT), runs the real command
   (``python -m gateway snapshot --once``) in a subprocess, and reads INFO. From that it reports
   the wall time of the process, rows, file size, Redis CPU (used_cpu_user+sys delta), the
   commands Redis processed, by command, and the slowest of them (latencystats p100 and the
   slowlog at 500 µs).
2. **PING without a snapshot.** Another process sends PING every 1 ms and records each round
   trip's latency.
3. **PING during a snapshot of a twin.** The same loop while the snapshot reads a second
   redis-server holding the same data: the CPU contention alone, as a control.
4. **PING during a snapshot.** The same loop while the snapshot reads the Redis being pinged.

On a 2-core machine the three processes (redis-server, the snapshot, the PING loop) share the
cores, so part of the added PING latency is CPU scheduling, not Redis. The server-side numbers
(the slowest single command) and the control (3) say what Redis itself was busy with.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from gateway.cli import devstack  # noqa: E402

PREFIX = "mqgw"


def populate(url: str, keys: int, queues: int, topics: int, seed: int = 1) -> dict[str, int]:
    import redis

    rnd = random.Random(seed)
    r = redis.Redis.from_url(url)
    now = int(time.time() * 1000)
    n_broadcast_keys = keys // 5
    n_cluster = keys - n_broadcast_keys
    clients_per = 4
    n_bcast_groups = max(1, n_broadcast_keys // clients_per)
    topic_names = [f"topic-{i:03d}" for i in range(topics)]
    his = {t: [rnd.randint(10_000, 5_000_000) for _ in range(queues)] for t in topic_names}
    pipe = r.pipeline(transaction=False)
    written = 0

    def flush(force: bool = False) -> None:
        nonlocal pipe
        if force or len(pipe) >= 1000:
            pipe.execute()
            pipe = r.pipeline(transaction=False)

    def queue_hash(topic: str) -> dict[str, Any]:
        h: dict[str, Any] = {}
        for q in range(queues):
            hi = his[topic][q]
            com = max(0, hi - rnd.choice((0, 0, 3, 50, 2_000, 100_000)))
            held = rnd.random() < 0.1
            h.update({f"{topic}:{q}:max": hi, f"{topic}:{q}:com": com,
                      f"{topic}:{q}:lock": now - rnd.randint(0, 90_000) if held else 0,
                      f"{topic}:{q}:tok": rnd.randint(1, 100_000),
                      f"{topic}:{q}:acc": now - rnd.randint(0, 3_600_000),
                      f"{topic}:{q}:addr":
                          f"10.0.{rnd.randint(0, 255)}.{rnd.randint(1, 254)}:{rnd.randint(1024, 65535)}"})
        return h

    groups = [f"svc-{i:05d}" for i in range(n_cluster)] + [f"bc-{i:05d}" for i in range(n_bcast_groups)]
    for i, g in enumerate(groups):
        topic = topic_names[i % topics]
        if g.startswith("svc-"):
            pipe.hset(f"{PREFIX}:{{{g}}}:q", mapping=queue_hash(topic))
            written += 1
        else:
            clients = [f"host-{j}.{rnd.randint(100, 99999)}" for j in range(clients_per)]
            for c in clients:
                if written < keys:
                    pipe.hset(f"{PREFIX}:{{{g}}}:q:{c}", mapping=queue_hash(topic))
                    written += 1
            pipe.zadd(f"{PREFIX}:{{{g}}}:clients", {c: now for c in clients})
        if rnd.random() < 0.3:
            cfg: dict[str, Any] = {"updated_ms": now, "start": "earliest"}
            if rnd.random() < 0.5:
                cfg.update(registered="1", topics=f",{topic},", created_ms=now,
                           mode="broadcast" if g.startswith("bc-") else "cluster")
            if rnd.random() < 0.15:
                cfg["paused"] = "1"
            if rnd.random() < 0.3:
                cfg["consume_timeout_ms"] = rnd.choice((10_000, 30_000, 120_000))
            if rnd.random() < 0.3:
                cfg["rate"] = repr(float(rnd.choice((5, 100, 2500))))
                pipe.hset(f"{PREFIX}:{{{g}}}:rl", mapping={"tokens": rnd.random() * 5, "ts": now - 500})
            pipe.hset(f"{PREFIX}:{{{g}}}:cfg", mapping=cfg)
        flush()
    for t in topic_names:
        wm: dict[str, Any] = {"queues": ",".join(map(str, range(queues))), "ts": now}
        for q in range(queues):
            wm[f"{q}:lo"] = his[t][q] // 10
            wm[f"{q}:hi"] = his[t][q]
        pipe.hset(f"{PREFIX}:{{wm:{t}}}", mapping=wm)
    flush(force=True)
    info = r.info()
    return {"queue_hashes": written, "groups": len(groups),
            "db_keys": int(info.get("db0", {}).get("keys", 0)),
            "used_memory_mb": round(info["used_memory"] / 2**20, 1)}


def snapshot_cmd(url: str, out: str, chunk: int | None) -> list[str]:
    args = ["snapshot", "--once", "--out", out, "--redis-url", url]
    if chunk is None:
        return [sys.executable, "-m", "gateway", *args]
    code = (f"import sys, gateway.ops.snapshot as s; s.CHUNK = {chunk}; from gateway.cli.main import main; "
            f"sys.exit(main({args!r}))")
    return [sys.executable, "-c", code]


def run_snapshot(url: str, out: str, chunk: int | None) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    p = subprocess.run(snapshot_cmd(url, out, chunk), check=False, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"snapshot failed: {p.stderr}")
    return json.loads(p.stdout), wall


def cpu(info: dict[str, Any]) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def alone(url: str, out: str, chunk: int | None) -> dict[str, Any]:
    import redis

    r = redis.Redis.from_url(url, decode_responses=True)
    r.config_set("slowlog-log-slower-than", 500)
    r.config_set("latency-tracking-info-percentiles", "50 99 99.9 100")
    r.slowlog_reset()
    before = r.info("cpu")
    r.config_resetstat()
    summary, wall = run_snapshot(url, out, chunk)
    info = r.info("everything")
    slow = [e for e in r.slowlog_get(128) if e["command"].split()[0].upper() not in ("INFO", "CONFIG")]
    stats = {k[len("cmdstat_"):]: v for k, v in info.items() if k.startswith("cmdstat_")}
    lat = {k[len("latency_percentiles_usec_"):]: v for k, v in info.items()
           if k.startswith("latency_percentiles_usec_")}
    by_cmd = {c: s["calls"] for c, s in stats.items() if c not in ("config|resetstat",)}
    worst, worst_cmd = max(((float(v.get("p100", 0)), c) for c, v in lat.items()
                            if c != "config|resetstat"), default=(0.0, ""))
    return {**summary, "wall_s": wall, "redis_cpu_ms": (cpu(info) - cpu(before)) * 1000,
            "commands": int(info["total_commands_processed"]) - 1,  # less the CONFIG RESETSTAT
            "by_command": by_cmd, "slowest_cmd_us": worst, "slowest_cmd": worst_cmd,
            "p100_us": {c: float(v.get("p100", 0)) for c, v in lat.items() if c != "config|resetstat"},
            "slowlog_500us": len(slow),
            "usec_per_call": {c: s["usec_per_call"] for c, s in stats.items()
                              if c in ("scan", "hscan", "hgetall")}}


def ping_loop(url: str, seconds: float) -> dict[str, Any]:
    """PING every 1 ms for ``seconds``; latencies in ms."""
    import redis

    r = redis.Redis.from_url(url)
    r.ping()
    lat: list[float] = []
    start = time.perf_counter()
    tick = start
    while True:
        now = time.perf_counter()
        if now - start >= seconds:
            break
        if now < tick:
            time.sleep(tick - now)
        t0 = time.perf_counter()
        r.ping()
        lat.append((time.perf_counter() - t0) * 1000)
        tick += 0.001
        if tick < time.perf_counter() - 0.001:  # fell behind: do not burst to catch up
            tick = time.perf_counter()
    lat.sort()
    def q(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]
    return {"n": len(lat), "p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": lat[-1],
            "over_1ms": sum(1 for x in lat if x > 1.0), "over_5ms": sum(1 for x in lat if x > 5.0)}


def start_ping(url: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--ping-loop", url, str(seconds)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=10_000, help="consumer queue hashes")
    ap.add_argument("--queues", type=int, default=8, help="queues per hash")
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=None, help="commands per pipeline (default: the module's)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--ping-loop", nargs=2, metavar=("URL", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ping_loop:
        print(json.dumps(ping_loop(args.ping_loop[0], float(args.ping_loop[1]))))
        return 0

    svc, twin = devstack.start_redis(), devstack.start_redis()
    out = tempfile.mkdtemp(prefix="mqgw-snapbench-")
    try:
        url = svc.extra["url"]
        t0 = time.perf_counter()
        pop = populate(url, args.keys, args.queues, args.topics)
        populate(twin.extra["url"], args.keys, args.queues, args.topics)
        print(f"populated in {time.perf_counter() - t0:.1f} s: {pop}", flush=True)
        run_snapshot(url, out, args.chunk)  # warm-up: page cache, imports
        runs, pings = [], []
        for i in range(args.runs):
            a = alone(url, out, args.chunk)
            runs.append(a)
            seconds = max(2.0, a["wall_s"] + 1.0)
            base = json.loads(start_ping(url, seconds).communicate(timeout=120)[0])
            res = [base]
            for target in (twin.extra["url"], url):  # a twin Redis: the same CPU load, not on this one
                p = start_ping(url, seconds)
                time.sleep(0.4)
                run_snapshot(target, out, args.chunk)
                res.append(json.loads(p.communicate(timeout=120)[0]))
            pings.append(res)
            print(f"run {i + 1}: {a['rows']} rows, {a['wall_s']:.2f} s,"
                  f" redis cpu {a['redis_cpu_ms']:.0f} ms, "
                  f"{a['commands']} commands, slowest {a['slowest_cmd']} {a['slowest_cmd_us']:.0f} us, "
                  f"ping max {base['max']:.2f} / {res[1]['max']:.2f} / {res[2]['max']:.2f} ms", flush=True)
        # JSON Lines for comparison (the same rows)
        import pyarrow.parquet as pq

        rows = pq.read_table(runs[-1]["path"]).to_pylist()
        jl = "".join(json.dumps(r, default=str) + "\n" for r in rows).encode()
        report(pop, runs, pings, len(jl), len(gzip.compress(jl)), args)
        if args.json:
            Path(args.json).write_text(json.dumps({"populated": pop, "runs": runs, "pings": pings,
                                                   "jsonl_bytes": len(jl)}, indent=1))
    finally:
        svc.stop()
        twin.stop()
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    return 0


def report(pop: dict[str, Any], runs: list[dict[str, Any]], pings: list[tuple[dict, dict]],
           jl_bytes: int, jl_gz_bytes: int, args: argparse.Namespace) -> None:
    med = statistics.median
    a = runs[-1]
    print()
    print(f"Redis: {pop['queue_hashes']:,} consumer queue hashes x {args.queues} queues "
          f"({pop['groups']:,} consumers, {pop['db_keys']:,} keys in all, {pop['used_memory_mb']} MB); "
          f"pipelines of {args.chunk or 'default'} commands; {len(runs)} runs (median [min-max])")
    def row(name: str, xs: list[float], fmt: str) -> None:
        print(f"  {name:<38} {fmt.format(med(xs)):>10}   [{fmt.format(min(xs))} - {fmt.format(max(xs))}]")
    row("rows written", [r["rows"] for r in runs], "{:,.0f}")
    row("file size (KiB)", [r["bytes"] / 1024 for r in runs], "{:,.0f}")
    print(f"  {'  same rows as JSON Lines / gzipped':<38} {jl_bytes / 1024:>10,.0f}   "
          f"{jl_gz_bytes / 1024:,.0f} KiB")
    row("wall time, whole process (s)", [r["wall_s"] for r in runs], "{:.2f}")
    row("  reading Redis (ms)", [r["read_ms"] for r in runs], "{:.0f}")
    row("  writing the file (ms)", [r["write_ms"] for r in runs], "{:.0f}")
    row("Redis CPU, user+sys (ms)", [r["redis_cpu_ms"] for r in runs], "{:.0f}")
    row("commands processed by Redis", [r["commands"] for r in runs], "{:,.0f}")
    print(f"  {'  by command (last run)':<38} {json.dumps(a['by_command'])}")
    print(f"  {'  usec per call (last run)':<38} {json.dumps(a['usec_per_call'])}")
    row("slowest single command (us, p100)", [r["slowest_cmd_us"] for r in runs], "{:.0f}")
    row("commands >= 500 us (slowlog)", [r["slowlog_500us"] for r in runs], "{:.0f}")
    print()
    print(f"  {'  slowest call per command (us, last run)':<38} {json.dumps(a['p100_us'])}")
    print()
    print("  PING every 1 ms, latency in ms        n     p50     p99   p99.9     max   >1ms  >5ms"
          "  (median of runs)")
    labels = ("without a snapshot", "during a snapshot of a twin Redis *", "during a snapshot of this Redis")
    for idx, label in enumerate(labels):
        ps = [p[idx] for p in pings]
        print(f"  {label:<36} {med([p['n'] for p in ps]):>6,.0f} {med([p['p50'] for p in ps]):>7.3f}"
              f" {med([p['p99'] for p in ps]):>7.3f} {med([p['p999'] for p in ps]):>7.3f}"
              f" {med([p['max'] for p in ps]):>7.2f} {med([p['over_1ms'] for p in ps]):>6.0f}"
              f" {med([p['over_5ms'] for p in ps]):>5.0f}")
    print("  worst max of any run: " + ", ".join(f"{label} {max(p[i]['max'] for p in pings):.2f}"
                                                 for i, label in enumerate(("without", "twin", "this"))))
    print("  * the same snapshot process against another redis-server on this machine: the CPU it takes\n"
          "    from the PING loop and redis-server, without any command reaching the Redis being pinged")

if __name__ == "__main__":
    raise SystemExit(main())
