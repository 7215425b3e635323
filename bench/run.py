"""mq-gateway benchmark: for each broker (--broker: Apache Kafka, then Apache RocketMQ by default)
one run starts redis-server, the broker and the gateway
(2 uvicorn workers, the same command line as ``mqgw serve``), measures, and stops them all.

    .venv/bin/python bench/run.py            # or: make bench  (BENCH_ARGS="--duration 5")

--broker takes a comma-separated list of kafka, rocketmq and tansu (Tansu: the in-memory stand-in
of the tests), measured in that order in one run; ``both`` is tansu,kafka (the default until
issue 22), ``all`` is tansu,kafka,rocketmq.

Phases (each measured for --duration seconds after --warmup seconds):
  noop     GET /healthz, 16 connections: the HTTP stack alone (server, app, middleware), the
           ceiling the other phases' request rates are compared with ("vs noop")
  noopredis  GET /noop-redis on bench/noopredis.py: the same server stack plus one Redis script
           call per request ("vs noop+redis": what a request that must touch Redis can reach)
  raw      confluent-kafka produce (100 B values, the gateway's producer settings) and
           consume (assign at offset 0, fetch.queue.backoff.ms=0) on the same broker.
           On RocketMQ (bench/rawrocketmq.py): the gateway's own remoting client (the adapter,
           batches of 100 to one queue, 32 in flight; pulls of 32 from offset 0) and Apache's
           Java client; each ceiling is the faster of the two, named in the tables
  p1       POST /produce, 1 record per request, 16 connections
  p100     POST /produce, 100 records per request, 16 connections
  f32      GET /message max=32 + POST /ack, 16 consumers in one group, over a backlog
  f1000    the same with max=1000
  f32pb    (extra) max=32 with the ack piggy-backed on the next /message (requestId=...)
  p1v2     p1 through the REST v2 API (POST /topics/<t>, json), 16 connections
  f32v2    f32 through REST v2 consumer instances: GET .../records + POST .../offsets (no
           body), 16 instances in one group, max.poll.records=32
  f32r     (extra) f32 paced at the target's 40,000 records/s: latency at that load, not at saturation
  delay    POST /produce of 100 records with random delays up to --max-delay-ms, 16 connections:
           delayed records/s the wheel takes at saturation, then each record's lateness
           (on RocketMQ such delays go to the broker's timers: its timer wheel is measured)
  delayr   the same paced at --delay-rate (10,000/s): the lateness at that load

The load generator (bench/loadgen.py) is a separate process: asyncio on uvloop with a
minimal keep-alive HTTP/1.1 client (bench/httpc.py); its connections are spread evenly
over the gateway's workers (--no-balance: as the shared accept socket deals them).
Results: a table on stdout and JSON in bench/results/latest.json (plus a timestamped
copy). --profile adds py-spy and perf profiles of every phase; --gateway-src DIR serves
another copy of the gateway package (e.g. an earlier commit's, for a before/after figure).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import bridge as bench_bridge  # noqa: E402
import delay as bench_delay  # noqa: E402
import procstat  # noqa: E402
import rawkafka  # noqa: E402
import rawrocketmq  # noqa: E402
import runargs  # noqa: E402
from gateway.cli import devstack, maven  # noqa: E402
from gateway.cli.main import _serve_cmd  # noqa: E402

RESULTS = runargs.RESULTS
BACKLOG_TOPIC = "bench-backlog"
PRODUCE_TOPIC = "bench-produce"  # a fresh topic per produce phase (-p1, -p100), so that what one
                                 # phase left in the broker does not slow the next one down

#: The brokers --broker names, and its shorthands.
BROKERS = ("tansu", "kafka", "rocketmq")
BROKER_SETS = {"both": ["tansu", "kafka"], "all": ["tansu", "kafka", "rocketmq"]}
#: RocketMQ: the topic of the Java client's produce ceiling (the backlog is prefilled by the
#: remoting client), and how long the prefill may take (the remoting client is slower than
#: librdkafka: 30 s would leave too small a backlog for the consume phases).
JAVA_RAW_TOPIC = "bench-raw-java"
ROCKETMQ_PREFILL_S = 60.0

TARGETS = {
    "p1": "single-record produce >= 8,000 req/s at concurrency 16 with p99 < 10 ms",
    "p100": "100 records/request >= 150,000 records/s",
    "f32": "fetch+ack max=32, 16 consumers >= 40,000 records/s, /message p50 < 3 ms, p99 < 15 ms",
    "f1000": "fetch+ack max=1000 >= 250,000 records/s",
    "delay": "10,000 delayed records/s accepted through the wheel (at saturation)",
    "delayr": "p99 lateness < 250 ms with 10,000 delayed records/s offered",
}


def check_target(name: str, r: dict[str, Any]) -> bool | None:
    if name == "p1":
        return r["req_per_s"] >= 8000 and r["latency_ms"].get("p99", 1e9) < 10
    if name == "p100":
        return r["records_per_s"] >= 150_000
    if name == "delay":
        d = r.get("deliveries", {})
        return d.get("delivered", 0) >= d.get("expected", 1) and r["records_per_s"] >= 10_000
    if name == "delayr":
        d = r.get("deliveries", {})
        p99 = d.get("lateness_ms", {}).get("p99")
        return (d.get("delivered", 0) >= d.get("expected", 1) and r["records_per_s"] >= 9_500
                and p99 is not None and p99 < 250)
    if name == "f32":
        m = r["message_latency_ms"]
        return r["records_per_s"] >= 40_000 and m.get("p50", 1e9) < 3 and m.get("p99", 1e9) < 15
    if name == "f1000":
        return r["records_per_s"] >= 250_000
    return None


class Stack:
    """Every process this run starts; ``stop()`` ends them all, in reverse order."""

    def __init__(self) -> None:
        self.services: list[devstack.Service] = []
        self.loadgen: subprocess.Popen | None = None
        self.profilers: list[subprocess.Popen] = []

    def add(self, svc: devstack.Service) -> devstack.Service:
        self.services.append(svc)
        return svc

    def stop(self) -> None:
        for p in [self.loadgen, *self.profilers]:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        for svc in reversed(self.services):
            try:
                svc.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the others
                print(f"warning: stopping {svc.name}: {e}", file=sys.stderr)
        self.services.clear()


#: API key sent by every harness call (set in --secure runs).
AUTH: dict[str, str] = {}
#: The run's Redis, for counting the commands a phase costs.
REDIS_URL = ""


def redis_calls() -> dict[str, int]:
    """Commands Redis has processed so far: in total, and script calls (EVALSHA/EVAL)."""
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    try:
        stats = r.info("commandstats")
        total = int(r.info("stats")["total_commands_processed"])
    finally:
        r.close()
    scripts = sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return {"commands": total, "scripts": scripts}


def http_json(port: int, method: str, path: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"content-type": "application/json", **AUTH})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def start_gateway(stack: Stack, redis_url: str, bootstrap: str, workers: int,
                  extra_env: dict[str, str], src: Path,
                  broker: str = "kafka", server: str = "uvicorn") -> tuple[devstack.Service, list[int]]:
    """The gateway on ``bootstrap``: Kafka's bootstrap servers, or RocketMQ's name server(s)
    with ``broker="rocketmq"``. ``server="granian"``: under granian instead of ``mqgw serve``'s
    uvicorn (an experiment: granian has none of api/server.py's connection limits)."""
    port = devstack.free_port()
    target = ({"MQGW_BROKER": "rocketmq", "MQGW_ROCKETMQ_NAMESRV": bootstrap} if broker == "rocketmq"
              else {"MQGW_BROKER": "kafka", "MQGW_KAFKA_BOOTSTRAP": bootstrap})
    env = {**os.environ, "MQGW_REDIS_URL": redis_url, **target, **extra_env}
    RESULTS.mkdir(parents=True, exist_ok=True)
    # ``python -m uvicorn`` puts its working directory first on sys.path: ``src`` decides which
    # gateway package is served (this checkout, or a patched copy given with --gateway-src).
    cmd = _serve_cmd("127.0.0.1", port, workers)
    if server == "granian":  # the HTTP-stack experiment of issue 23: the same app under granian
        import importlib.util
        import tempfile

        if importlib.util.find_spec("granian") is None:
            raise RuntimeError("--server granian: install it first (.venv/bin/pip install granian);"
                               " it is no dependency of the gateway")

        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="mqgw-prom-")
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory",
               "gateway.api.app:factory", "--host", "127.0.0.1", "--port", str(port), "--workers",
               str(workers), "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning",
               "--runtime-threads", "1"]
    with open(RESULTS / "gateway.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env=env, cwd=src, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    svc = stack.add(devstack.Service("gateway", port, proc))
    devstack.wait_port(port, timeout=30, proc=proc)
    deadline = time.monotonic() + 30
    while True:  # every worker has run its lifespan (broker clients connected) once /readyz is ok
        try:
            status, _ = http_json(port, "GET", "/readyz")
            if status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("gateway not ready after 30 s; see bench/results/gateway.log")
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    find = procstat.uvicorn_workers if server == "uvicorn" else procstat.children
    while len(pids := find(proc.pid)) < workers and time.monotonic() < deadline:
        time.sleep(0.1)
    return svc, pids


def run_phase(stack: Stack, name: str, spec: dict[str, Any], named: dict[str, int], port: int,
              workers: list[int], profile_dir: Path | None) -> dict[str, Any]:
    """Run one loadgen process; sample CPU and connections over exactly its measured window."""
    cmd = [sys.executable, str(HERE / "loadgen.py"), json.dumps(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT)
    stack.loadgen = proc
    limit = spec["warmup"] + spec["duration"] + 60
    watchdog = threading.Timer(limit, lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    named = {**named, "loadgen": proc.pid}
    snap0 = snap1 = None
    t0 = t1 = 0.0
    conns: dict[int, int] = {}
    result: dict[str, Any] | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line == "start":
                snap0, t0 = procstat.snapshot(named), time.monotonic()
                calls0 = redis_calls()
                conns = procstat.connections_per_pid(port, workers)
                if profile_dir is not None:
                    others = [p for k, p in named.items() if k in ("redis", "broker")]
                    start_profilers(stack, name, workers or [named["gateway_master"]], others,
                                    spec["duration"], profile_dir)  # --workers 1: one process
            elif line == "end":
                snap1, t1 = procstat.snapshot(named), time.monotonic()
                calls1 = redis_calls()
            elif line.startswith("{"):
                result = json.loads(line)
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:  # interrupted: do not leave the load generator running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        stack.loadgen = None
    if result is None or snap0 is None or snap1 is None:
        raise RuntimeError(f"phase {name}: load generator failed (exit {proc.returncode})")
    for p in stack.profilers:
        p.wait(30)
    stack.profilers.clear()
    if profile_dir is not None:
        perf_summary(profile_dir / f"{name}.perf.data", profile_dir / f"{name}.perf.txt")
    result["cpu_pct"] = procstat.usage(snap0, snap1, t1 - t0)
    # Redis work per HTTP request over the window: script calls (EVALSHA: one round trip each) and
    # all commands, including those a script runs inside Redis (the two INFO calls excluded).
    requests = (result.get("fetches", 0) + result.get("acks", 0) if spec["kind"] == "consume"
                else result.get("requests", 0)) or 1
    result["redis_per_request"] = {
        "commands": round((calls1["commands"] - calls0["commands"] - 2) / requests, 3),
        "scripts": round((calls1["scripts"] - calls0["scripts"]) / requests, 3)}
    result["connections_per_worker"] = {str(k): v for k, v in conns.items()}
    result["spec"] = spec
    return result


def start_profilers(stack: Stack, phase: str, workers: list[int], others: list[int], duration: float,
                    out: Path) -> None:
    """py-spy (Python stacks) on every worker and, if installed, perf (native, every thread
    including librdkafka's) on the workers, redis and the broker, for the measured window."""
    perf = shutil.which("perf")
    if perf:
        pids = ",".join(str(p) for p in [*workers, *others])
        stack.profilers.append(subprocess.Popen(
            [perf, "record", "-F", "499", "-g", "-p", pids, "-o", str(out / f"{phase}.perf.data"),
             "--", "sleep", str(duration)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    for pid in workers:
        path = out / f"{phase}-{pid}.txt"
        stack.profilers.append(subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(duration))), "--rate", "100",
             "--nonblocking", "--threads", "--format", "raw", "-o", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))


def perf_summary(data: Path, out: Path) -> None:
    """CPU by thread name, then by thread name + symbol, from a perf recording."""
    perf = shutil.which("perf")
    if not perf or not data.exists():
        return
    with open(out, "w") as fh:
        for sort in ("comm", "comm,dso", "comm,sym"):
            fh.write(f"==== perf report --sort {sort}\n")
            fh.flush()
            subprocess.run([perf, "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio",
                            "-g", "none", "--percent-limit", "0.5"], stdout=fh,
                           stderr=subprocess.DEVNULL, timeout=120)


def configure_consumer(port: int, group: str, shards: int = 1) -> None:
    """Start the bench consumer at the earliest offset (the pre-registry API for old sources);
    ``shards`` > 1: its offsets over that many Redis Cluster slots (store/shards.py)."""
    settings: dict[str, Any] = {"start": "earliest", **({"shards": shards} if shards > 1 else {})}
    status, body = http_json(port, "PATCH", f"/admin/consumers/{group}", settings)
    if status in (404, 405):
        status, body = http_json(port, "PUT", f"/consumers/{group}/config", {"start": "earliest"})
    if status != 200:
        raise RuntimeError(f"config of {group}: {status} {body}")


def secure_setup(redis_url: str, port: int, specs: dict[str, dict[str, Any]], phases: list[str]) -> str:
    """Register the bench's producer and consumers and return one key bound to all of them."""
    import asyncio

    from gateway.core.auth import KeyStore
    from gateway.store import OffsetStore
    from gateway.store import connect as connect_redis

    async def admin_key() -> str:
        r = connect_redis(redis_url)
        try:
            return (await KeyStore(OffsetStore(r)).create("bench-admin", admin=True))[0]
        finally:
            await r.aclose()

    AUTH["authorization"] = f"Bearer {asyncio.run(admin_key())}"
    used = [specs[p] for p in phases]
    topics = sorted({s["topic"] for s in used if s["kind"] == "produce"})
    groups = sorted({s["group"] for s in used if s["kind"] == "consume"})
    calls: list[tuple[str, str, Any]] = [
        ("PUT", "/admin/producers/bench", {"topics": topics or [BACKLOG_TOPIC]})]
    calls += [("PUT", f"/admin/consumers/{g}", {"topics": [BACKLOG_TOPIC], "start": "earliest",
                                                 "rateLimit": {"messagesPerSecond": 1e8}}) for g in groups]
    calls.append(("POST", "/admin/keys", {"name": "bench", "producers": ["bench"], "consumers": groups}))
    for method, path, body in calls:
        status, out = http_json(port, method, path, body)
        if status not in (200, 201):
            raise RuntimeError(f"{method} {path}: {status} {out}")
    return out["key"]


def queue_backlog(port: int, group: str) -> dict[str, int]:
    status, body = http_json(port, "GET", f"/consumers/{group}/queues")
    if status != 200:
        return {}
    qs = [q for q in body["queues"] if q["topic"] == BACKLOG_TOPIC]
    return {"committed": sum(q["committedOffset"] for q in qs), "backlog": sum(q["backlog"] for q in qs)}


# -- report ------------------------------------------------------------------------------------
def _n(x: float) -> str:
    return f"{x:,.0f}"


def _ms(d: dict[str, Any], k: str) -> str:
    return f"{d[k]:.2f}" if k in d else "-"


def report(res: dict[str, Any], paced_rate: int, broker: str, delay_rate: int = 10_000) -> str:
    """One broker's figures in full (the side-by-side table is :func:`report_both`)."""
    raw, ph, ratios = res["raw"], res["phases"], res["ratios"]
    rows = [(f"figure ({broker})", "records/s", "req/s", "p50 ms", "p99 ms", "vs raw", "vs noop",
             "vs noop+redis", "target")]
    for kind, label in (("produce", "raw produce, 100 B"), ("consume", "raw consume from offset 0")):
        client = raw[kind].get("client", "confluent-kafka")
        rows.append((f"{label} ({client})", _n(raw[kind]["records_per_s"]), "", "", "", "1", "", "",
                     "ceiling"))
        for other in res.get("raw_all", {}).get(kind, {}).values():
            if other.get("client") != client:
                rows.append((f"  {label} ({other['client']})", _n(other["records_per_s"]), "", "", "",
                             f"{other['records_per_s'] / raw[kind]['records_per_s']:.3f}", "", "", ""))
    labels = {"noop": "GET /healthz (no-op), c=16",
              "noopredis": "no-op + 1 Redis script (bench/noopredis.py)",
              "p1": "HTTP produce 1 rec/req, c=16",
              "p100": "HTTP produce 100 rec/req, c=16",
              "f32": "fetch+ack max=32, 16 consumers", "f1000": "fetch+ack max=1000, 16 consumers",
              "f32pb": "fetch max=32 + piggy-backed ack",
              "p1v2": "REST v2 produce 1 rec/req, c=16",
              "f32v2": "REST v2 records+commit max=32, 16 instances",
              "f32r": f"fetch+ack max=32 offered {paced_rate:,}/s",
              "delay": "delayed produce 100 rec/req (random delays)",
              "delayr": f"delayed produce offered {delay_rate:,}/s"}
    for name, r in ph.items():
        met = res["targets"].get(name, {}).get("met")
        mark = "" if met is None else ("MET" if met else "MISSED")
        ratio = f"{ratios[name]:.3f}" if name in ratios else ""
        vs_noop = f"{ratios[name + '_vs_noop']:.3f}" if name + "_vs_noop" in ratios else ""
        vs_nr = f"{ratios[name + '_vs_noopredis']:.3f}" if name + "_vs_noopredis" in ratios else ""
        if name.startswith(("noop", "p", "delay")):
            lat = r["latency_ms"]
            rows.append((labels.get(name, name), "" if name.startswith("noop") else _n(r["records_per_s"]),
                         _n(r["req_per_s"]), _ms(lat, "p50"), _ms(lat, "p99"), ratio, vs_noop, vs_nr,
                         mark))
            d = r.get("deliveries")
            if d:
                lt = d["lateness_ms"]
                how = f"{d['early']} early" + (f", {d['direct']:,} direct" if "direct" in d else "")
                rows.append((f"  delivered {d['delivered']:,} of {d['expected']:,} ({how})",
                             _n(d["delivered_per_s"] or 0), "", f"late {lt['p50']}",
                             f"late {lt['p99']}", "", "", "", ""))
        else:
            m, a = r["message_latency_ms"], r["ack_latency_ms"]
            rows.append((labels.get(name, name), _n(r["records_per_s"]),
                         _n(r["fetch_per_s"] + (r["ack_per_s"] if a.get("n") else 0)),
                         f"msg {_ms(m, 'p50')}", f"msg {_ms(m, 'p99')}", ratio, vs_noop, vs_nr, mark))
            if a.get("n"):
                rows.append(("", "", "", f"ack {_ms(a, 'p50')}", f"ack {_ms(a, 'p99')}", "", "", "",
                             ""))
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r)))
        if j == 0:
            lines.append("  ".join("-" * x for x in w))
    lines.append("")
    lines.append("CPU during each measured window, % of one core ('others' = processes not "
                 "started by this run; for noopredis, 'workers' are its own):")
    for name, r in ph.items():
        c = r["cpu_pct"]
        workers = [f"{c[k]:.0f}" for k in c if k.startswith("worker")]
        conns = "/".join(str(v) for v in r["connections_per_worker"].values())
        extra = ""
        if r.get("empty"):
            extra += f"  EMPTY={r['empty']}"
        if any(r.get(k) for k in ("errors", "ack_not_committed", "failed_records", "count_mismatch")):
            extra += (f"  errors={r.get('errors', 0)} not_committed={r.get('ack_not_committed', 0)}"
                      f" failed={r.get('failed_records', 0)} count_mismatch={r.get('count_mismatch', 0)}")
        if not r.get("placement", {}).get("balanced", True):
            extra += "  (connections not balanced)"
        rpr = r.get("redis_per_request")
        if rpr:
            extra += (f"  redis/req: {rpr['scripts']:.2f} script calls,"
                      f" {rpr['commands']:.2f} cmds incl. in-script")
        lines.append(f"  {name:6} workers {'+'.join(workers):9} redis {c['redis']:3.0f}"
                     f"  broker {c['broker']:3.0f}  loadgen {c['loadgen']:3.0f}"
                     f"  others {c['others_pct_of_one_core']:3.0f}"
                     f"  machine busy {c['machine_busy_pct_of_all_cores']:3.0f}%"
                     f"  conns/worker {conns}{extra}")
    return "\n".join(lines)


def start_broker(stack: Stack, broker: str) -> devstack.Service:
    """The broker; ``extra["bootstrap"]`` is what the gateway and the raw clients connect to
    (RocketMQ: the name server)."""
    if broker == "kafka":
        from gateway.cli import kafka_dist

        return stack.add(kafka_dist.start_kafka(heap="1g"))
    if broker == "rocketmq":
        from gateway.cli import rocketmq_dist

        if not rocketmq_dist.is_resolved():
            print(f"resolving Apache RocketMQ {rocketmq_dist.VERSION} from Maven Central (once)", flush=True)
        mq = stack.add(rocketmq_dist.start_rocketmq(heap="1g"))
        mq.extra["bootstrap"] = mq.extra["namesrv"]
        return mq
    return stack.add(devstack.start_broker())


def broker_pids(broker: devstack.Service) -> dict[str, int]:
    """The processes whose CPU is the broker's: RocketMQ's broker JVM (``proc`` is its name
    server, reported apart), else the broker's one process."""
    jvm = getattr(broker, "broker", None)
    if jvm is not None:
        return {"broker": jvm.pid, "namesrv": broker.proc.pid}
    return {"broker": broker.proc.pid}


def create_topic(broker_name: str, bs: str, topic: str, partitions: int) -> None:
    if broker_name == "rocketmq":
        from gateway.cli import rocketmq_dist

        rocketmq_dist.create_topic(bs, topic, partitions)
    else:
        devstack.create_topic(bs, topic, partitions)


def raw_kafka(res: dict[str, Any], bs: str, args: argparse.Namespace, named: dict[str, int]) -> None:
    print(f"raw produce: {args.prefill:,} x {args.value_size} B into {BACKLOG_TOPIC} ...", flush=True)
    s0, w0 = procstat.snapshot(named), time.monotonic()
    res["raw"]["produce"] = rawkafka.produce(bs, BACKLOG_TOPIC, args.prefill, args.value_size)
    res["raw"]["produce"]["cpu_pct"] = procstat.usage(s0, procstat.snapshot(named), time.monotonic() - w0)
    res["raw"]["produce"]["client"] = "confluent-kafka"
    total = res["raw"]["produce"]["total_in_topic"]
    print(f"  {res['raw']['produce']['records_per_s']:,.0f} msgs/s", flush=True)
    s0, w0 = procstat.snapshot(named), time.monotonic()
    res["raw"]["consume"] = rawkafka.consume(bs, BACKLOG_TOPIC, args.partitions, total)
    res["raw"]["consume"]["cpu_pct"] = procstat.usage(s0, procstat.snapshot(named), time.monotonic() - w0)
    res["raw"]["consume"]["client"] = "confluent-kafka"
    print(f"raw consume: {res['raw']['consume']['records_per_s']:,.0f} msgs/s", flush=True)


def raw_rocketmq(res: dict[str, Any], ns: str, args: argparse.Namespace, named: dict[str, int]) -> None:
    """Both raw clients (bench/rawrocketmq.py); the faster of each kind is the ceiling. The
    remoting client prefills the backlog; the Java client produces into a topic of its own."""
    cands: dict[str, dict[str, dict[str, Any]]] = {"produce": {}, "consume": {}}
    jvm_named = {k: v for k, v in named.items() if k != "raw_client"}

    def measure(kind: str, what: str, fn: Any, *a: Any, **kw: Any) -> None:
        java = what == rawrocketmq.JAVA
        s0, w0 = procstat.snapshot(jvm_named if java else named), time.monotonic()
        try:
            r = fn(*a, **kw)
        except Exception as e:  # the other client's figure stands
            if not java:
                raise
            print(f"  {what}: not measured ({str(e)[:300]})", flush=True)
            return
        r["cpu_pct"] = procstat.usage(s0, procstat.snapshot(jvm_named if java else named),
                                      time.monotonic() - w0)
        cands[kind][what] = r
        print(f"  {kind} {what}: {r['records_per_s']:,.0f} msgs/s ({r['records']:,} in {r['seconds']} s,"
              f" errors {r['errors']})", flush=True)

    print(f"raw produce (remoting client): up to {args.prefill:,} x {args.value_size} B into "
          f"{BACKLOG_TOPIC}, at most {ROCKETMQ_PREFILL_S:g} s ...", flush=True)
    measure("produce", rawrocketmq.REMOTING, rawrocketmq.produce, ns, BACKLOG_TOPIC, args.prefill,
            args.value_size, max_seconds=ROCKETMQ_PREFILL_S)
    total = cands["produce"][rawrocketmq.REMOTING]["total_in_topic"]
    print(f"raw produce (Java client) into {JAVA_RAW_TOPIC} ...", flush=True)
    measure("produce", rawrocketmq.JAVA, rawrocketmq.java_produce, ns, JAVA_RAW_TOPIC, args.prefill,
            args.value_size)
    print(f"raw consume of {total:,} records from offset 0 ...", flush=True)
    measure("consume", rawrocketmq.REMOTING, rawrocketmq.consume, ns, BACKLOG_TOPIC, total)
    measure("consume", rawrocketmq.JAVA, rawrocketmq.java_consume, ns, BACKLOG_TOPIC, total)
    res["raw_all"] = cands
    for kind, c in cands.items():
        best = max(c.values(), key=lambda r: r["records_per_s"])
        res["raw"][kind] = {**best, "ceiling_of": sorted(c)}
        print(f"ceiling {kind}: {best['client']} ({best['records_per_s']:,.0f} msgs/s)", flush=True)
    res["raw"]["produce"]["total_in_topic"] = total  # the backlog's, whichever client won


def start_noopredis(stack: Stack, redis_url: str, workers: int) -> tuple[devstack.Service, list[int]]:
    """bench/noopredis.py on the gateway's server stack: the one-script-call ceiling."""
    port = devstack.free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / "noopredis.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "noopredis.py"), str(port), str(workers),
                                 redis_url], env=env, cwd=HERE, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    svc = stack.add(devstack.Service("noopredis", port, proc))
    devstack.wait_port(port, timeout=30, proc=proc)
    deadline = time.monotonic() + 10
    while len(pids := procstat.uvicorn_workers(proc.pid)) < workers and time.monotonic() < deadline:
        time.sleep(0.1)
    return svc, pids


def phase_specs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each phase's load-generator spec, without the port, connections and timing (the
    caller's ``common``): bench/run.py's phases and bench/scaleout.py's are the same."""
    return {
        "noop": {"kind": "noop", "per_request": 0, "value_size": 0},
        "noopredis": {"kind": "noop", "per_request": 0, "value_size": 0, "path": "/noop-redis"},
        "p1": {"kind": "produce", "topic": f"{PRODUCE_TOPIC}-p1", "per_request": 1,
               "value_size": args.value_size},
        "p100": {"kind": "produce", "topic": f"{PRODUCE_TOPIC}-p100", "per_request": 100,
                 "value_size": args.value_size},
        "f32": {"kind": "consume", "topic": BACKLOG_TOPIC, "group": "bench-f32", "max": 32,
                "ack": "separate"},
        "f1000": {"kind": "consume", "topic": BACKLOG_TOPIC, "group": "bench-f1000", "max": 1000,
                  "ack": "separate"},
        "f32pb": {"kind": "consume", "topic": BACKLOG_TOPIC, "group": "bench-f32pb", "max": 32,
                  "ack": "piggyback"},
        "p1v2": {"kind": "produce", "topic": f"{PRODUCE_TOPIC}-p1v2", "per_request": 1,
                 "value_size": args.value_size, "dialect": "v2"},
        "f32v2": {"kind": "consume", "topic": BACKLOG_TOPIC, "group": "bench-f32v2", "max": 32,
                  "ack": "separate", "dialect": "v2"},
        "f32r": {"kind": "consume", "topic": BACKLOG_TOPIC, "group": "bench-f32r", "max": 32,
                 "ack": "separate", "rate": args.paced_rate},
        "delay": {"kind": "produce", "topic": f"{PRODUCE_TOPIC}-delay", "per_request": 100,
                  "value_size": args.value_size, "max_delay_ms": args.max_delay_ms},
        "delayr": {"kind": "produce", "topic": f"{PRODUCE_TOPIC}-delayr", "per_request": 100,
                   "value_size": args.value_size, "max_delay_ms": args.max_delay_ms,
                   "rate": args.delay_rate},
    }


def run_broker(stack: Stack, broker_name: str, args: argparse.Namespace, phases: list[str],
               extra_env: dict[str, str], profile_dir: Path | None) -> dict[str, Any]:
    """Every measurement on one broker: its own Redis, broker, raw client, gateway and ceilings."""
    res: dict[str, Any] = {"raw": {}, "phases": {}, "ratios": {}, "targets": {}}
    t0_broker = time.monotonic()
    print(f"=== broker: {broker_name}", flush=True)
    if broker_name == "tansu":  # Tansu's tail race: holes are looked at twice (Settings)
        extra_env = {"MQGW_GAP_RECHECK_MS": "30", **extra_env}
    extra_env = {**bench_delay.env(), **extra_env}
    redis = stack.add(devstack.start_redis())
    global REDIS_URL
    REDIS_URL = redis.extra["url"]
    broker = start_broker(stack, broker_name)
    bs = broker.extra["bootstrap"]
    topics = [BACKLOG_TOPIC, *(f"{PRODUCE_TOPIC}-{p}" for p in phases if p.startswith("p")),
              *(f"{PRODUCE_TOPIC}-{p}" for p in phases if p.startswith("delay"))]
    if broker_name == "rocketmq":
        topics.append(JAVA_RAW_TOPIC)
    for t in topics:
        create_topic(broker_name, bs, t, args.partitions)
    unit = "queues" if broker_name == "rocketmq" else "partitions"
    print(f"redis {redis.extra['url']}  broker {bs}  topics {args.partitions} {unit}", flush=True)

    bpids = broker_pids(broker)
    named = {"redis": redis.proc.pid, **bpids, "raw_client": os.getpid()}
    if broker_name == "rocketmq":
        raw_rocketmq(res, bs, args, named)
    else:
        raw_kafka(res, bs, args, named)

    src = runargs.gateway_src(args)
    gw, workers = start_gateway(stack, redis.extra["url"], bs, args.workers, extra_env, src,
                                broker="rocketmq" if broker_name == "rocketmq" else "kafka",
                                server=args.server)
    nr, nr_workers = start_noopredis(stack, redis.extra["url"], args.workers)
    print(f"gateway ({src}/gateway) on 127.0.0.1:{gw.port}, master {gw.proc.pid}, workers {workers}",
          flush=True)
    named = {"redis": redis.proc.pid, **bpids, "gateway_master": gw.proc.pid,
             **{f"worker{i + 1}": p for i, p in enumerate(workers)}}
    res["gateway"] = {"port": gw.port, "cmd": _serve_cmd("127.0.0.1", gw.port, args.workers),
                      "workers": workers, "src": str(src), "git_head": runargs.git_head(src)}

    common = {"port": gw.port, "concurrency": args.concurrency, "duration": args.duration,
              "warmup": args.warmup, "balance": [] if args.no_balance else workers}
    specs = phase_specs(args)
    specs["noopredis"].update(port=nr.port, balance=[] if args.no_balance else nr_workers)
    if args.secure:
        common["key"] = secure_setup(redis.extra["url"], gw.port, specs, phases)
    for name in phases:
        spec = {**common, **specs[name]}
        if name == "noopredis":
            named_now = {**named, **{f"worker{i + 1}": p for i, p in enumerate(nr_workers)}}
            r = run_phase(stack, name, spec, named_now, nr.port, nr_workers, profile_dir)
            res["phases"][name] = r
            print(f"  {r['req_per_s']:,.0f} req/s", flush=True)
            continue
        if spec["kind"] == "consume":
            configure_consumer(gw.port, spec["group"])
        print(f"phase {name}: {args.warmup:g} s warm-up + {args.duration:g} s ...", flush=True)
        r = run_phase(stack, name, spec, named, gw.port, workers, profile_dir)
        if spec["kind"] == "consume":
            r["after"] = queue_backlog(gw.port, spec["group"])
            r["backlog_held"] = r["empty"] == 0 and r["after"].get("backlog", 0) > 0
        if name in ("delay", "delayr"):  # wait for the last due time, read what was delivered
            wait_s = args.max_delay_ms / 1000 + 5
            print(f"  {r['records_per_s']:,.0f} delayed records/s accepted; reading deliveries "
                  f"(up to {wait_s:.0f} s) ...", flush=True)
            if broker_name == "rocketmq":  # delays up to 3 days are the broker's timers there
                r["deliveries"] = bench_delay.lateness_rocketmq(bs, spec["topic"], int(r["records"]),
                                                                timeout_s=wait_s + 60)
            else:
                r["deliveries"] = bench_delay.lateness(bs, spec["topic"], args.partitions,
                                                       int(r["records"]), timeout_s=wait_s + 60)
            print(f"  {r['deliveries']}", flush=True)
        res["phases"][name] = r
        if name in TARGETS:
            res["targets"][name] = {"target": TARGETS[name], "met": check_target(name, r)}
        if spec["kind"] == "noop":
            print(f"  {r['req_per_s']:,.0f} req/s", flush=True)
            continue
        raw_ref = res["raw"]["produce" if spec["kind"] == "produce" else "consume"]["records_per_s"]
        res["ratios"][name] = r["records_per_s"] / raw_ref
        req_s = (r["req_per_s"] if spec["kind"] == "produce"
                 else r["fetch_per_s"] + r.get("ack_per_s", 0))
        for ceiling in ("noop", "noopredis"):
            if ceiling in res["phases"]:
                res["ratios"][f"{name}_vs_{ceiling}"] = req_s / res["phases"][ceiling]["req_per_s"]
        print(f"  {r['records_per_s']:,.0f} records/s", flush=True)
    if broker_name == "kafka" and args.peers == "strimzi":
        run_bridge(stack, res, bs, args, phases, {"redis": redis.proc.pid, **bpids}, profile_dir)
    res["wall_s"] = round(time.monotonic() - t0_broker, 1)
    print()
    print(report(res, args.paced_rate, broker_name, args.delay_rate), flush=True)
    if res.get("peer"):
        print(report_peer(res), flush=True)
    return res


#: The phases the Strimzi bridge has an equivalent of (its ``GET /healthy`` for the no-op, as
#: ``GET /healthz`` is the gateway's).
PEER_PHASES = ("noop", "p1", "p100", "f32", "f1000")


def run_bridge(stack: Stack, res: dict[str, Any], bs: str, args: argparse.Namespace,
               phases: list[str], named: dict[str, int], profile_dir: Path | None) -> None:
    """The Strimzi HTTP bridge's figures on the same broker, in the same run (bench/bridge.py):
    ``res["peer"]``. One bridge for the no-op and produce phases, one per consume phase (its
    ``max.poll.records`` is per bridge). Skipped with a line saying why where it cannot run."""
    todo = [p for p in phases if p in PEER_PHASES]
    why = bench_bridge.available()
    if why or not todo:
        if why:
            print(why, flush=True)
            res["peer"] = {"name": bench_bridge.NAME, "skipped": why}
        return
    print(f"=== peer: {bench_bridge.NAME} on the same broker", flush=True)
    if not maven.is_resolved(maven.cache_dir("MQGW_BRIDGE_HOME", f"strimzi-bridge-{bench_bridge.VERSION}")):
        print("resolving its dependencies with Maven (once)", flush=True)
    peer: dict[str, Any] = {"name": bench_bridge.NAME, "java": bench_bridge.find_java(), "phases": {}}
    res["peer"] = peer
    common = {"concurrency": args.concurrency, "duration": args.duration, "warmup": args.warmup,
              "balance": [], "dialect": "bridge"}
    # The gateway's phases in the bridge's dialect: its own topics and groups, its health route;
    # the 16 instances join one group one by one (the broker's first rebalance waits
    # group.initial.rebalance.delay.ms, 3 s), so a consume window opens after the group settled.
    ours = phase_specs(args)
    settle = max(args.warmup, 8.0)
    specs: dict[str, dict[str, Any]] = {
        "noop": {**ours["noop"], "path": "/healthy"},
        "p1": {**ours["p1"], "topic": f"{PRODUCE_TOPIC}-bridge-p1"},
        "p100": {**ours["p100"], "topic": f"{PRODUCE_TOPIC}-bridge-p100"},
        "f32": {**ours["f32"], "group": "bench-bridge-f32", "warmup": settle},
        "f1000": {**ours["f1000"], "group": "bench-bridge-f1000", "warmup": settle},
    }
    running: devstack.Service | None = None
    for name in todo:
        spec = {**common, **specs[name]}
        want = spec.get("max", 500)  # 500: Kafka's default max.poll.records
        if spec["kind"] == "produce":
            create_topic("kafka", bs, spec["topic"], args.partitions)
        if running is None or running.extra["max_poll_records"] != want:
            if running is not None:
                running.stop()
                stack.services.remove(running)
            running = stack.add(bench_bridge.start(bs, want, RESULTS / "bridge.log"))
        spec["port"] = running.port
        print(f"peer phase {name}: {spec['warmup']:g} s warm-up + {args.duration:g} s ...", flush=True)
        r = run_phase(stack, f"bridge-{name}", spec, {**named, "bridge": running.proc.pid},
                      running.port, [], profile_dir)
        peer["phases"][name] = r
        rate = r["req_per_s"] if name == "noop" else r["records_per_s"]
        print(f"  {rate:,.0f} {'req' if name == 'noop' else 'records'}/s", flush=True)
    if running is not None:
        running.stop()
        stack.services.remove(running)


def _rate(name: str, r: dict[str, Any]) -> float:
    return float(r["req_per_s"] if name == "noop" else r["records_per_s"])


def report_peer(res: dict[str, Any]) -> str:
    """gateway / bridge per phase, same broker, same run (or why the peer was skipped: its folder
    missing, no Java; that ended the run with ``KeyError: 'phases'`` before)."""
    peer = res["peer"]
    if "phases" not in peer:
        return f"{peer['name']}: skipped ({peer.get('skipped', 'not run')})"
    rows = [("phase (req/s for noop, else records/s)", "mq-gateway", "p99 ms", peer["name"], "p99 ms",
             "gateway / bridge")]
    for name, b in peer["phases"].items():
        g = res["phases"].get(name)
        if g is None:
            continue
        glat = g.get("message_latency_ms") or g["latency_ms"]
        blat = b.get("message_latency_ms") or b["latency_ms"]
        rows.append((name, _n(_rate(name, g)), _ms(glat, "p99"), _n(_rate(name, b)), _ms(blat, "p99"),
                     f"{_rate(name, g) / max(_rate(name, b), 1e-9):.2f}"))
        v2 = res["phases"].get(f"{name}v2")  # the same through the gateway's REST v2 API
        if v2 is not None:
            vlat = v2.get("message_latency_ms") or v2["latency_ms"]
            rows.append((f"{name} (REST v2)", _n(_rate(name, v2)), _ms(vlat, "p99"),
                         _n(_rate(name, b)), _ms(blat, "p99"),
                         f"{_rate(name, v2) / max(_rate(name, b), 1e-9):.2f}"))
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "|".join(" --- " for _ in rows[0]) + "|")
    lines.append("")
    lines.append("CPU of the bridge's phases, % of one core:")
    for name, b in peer["phases"].items():
        c = b["cpu_pct"]
        lines.append(f"  {name:6} " + "  ".join(f"{k} {v:.0f}" for k, v in c.items()))
    return "\n".join(lines)


def report_both(full: dict[str, Any]) -> str:
    """Every phase with the brokers side by side: records/s (or req/s), p99, and the ratios to
    the raw client on the same broker (its name in the raw rows' req/s column: on RocketMQ the
    faster of our remoting client and Apache's Java client), the no-op endpoint and the
    one-script no-op."""
    brokers = list(full["brokers"])
    head = ["phase"]
    for b in brokers:
        head += [f"{b} rec/s", "req/s", "p99 ms", "vs raw", "vs noop", "vs noop+redis"]
    rows = [tuple(head)]
    order = ["raw produce", "raw consume", *next(iter(full["brokers"].values()))["phases"]]
    for name in order:
        row = [name]
        for b in brokers:
            res = full["brokers"][b]
            if name.startswith("raw"):
                r = res["raw"][name.split()[1]]
                row += [_n(r["records_per_s"]), r.get("client", "confluent-kafka"), "", "1", "", ""]
                continue
            r = res["phases"].get(name)
            if r is None:
                row += [""] * 6
                continue
            ratios = res["ratios"]
            consume = "fetch_per_s" in r
            req_s = r["fetch_per_s"] + r.get("ack_per_s", 0) if consume else r["req_per_s"]
            lat = r["message_latency_ms"] if consume else r["latency_ms"]
            row += ["" if name.startswith("noop") else _n(r["records_per_s"]), _n(req_s),
                    _ms(lat, "p99"),
                    f"{ratios[name]:.3f}" if name in ratios else "",
                    f"{ratios[name + '_vs_noop']:.3f}" if name + "_vs_noop" in ratios else "",
                    f"{ratios[name + '_vs_noopredis']:.3f}" if name + "_vs_noopredis" in ratios else ""]
        rows.append(tuple(row))
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    lines.insert(1, "|" + "|".join(" --- " for _ in w) + "|")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = runargs.parser(
        __doc__, out=RESULTS / "latest.json", workers_help="uvicorn workers (2)",
        env_help="extra environment for the gateway, e.g. MQGW_FETCH_POOL_SIZE=16",
        src_help="serve the gateway package found in DIR (default: this checkout), e.g. an earlier"
                 " commit's: git archive <commit> gateway | tar -x -C DIR")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per phase (10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each phase (2)")
    ap.add_argument("--concurrency", type=int, default=16, help="connections / consumers (16)")
    ap.add_argument("--partitions", type=int, default=16, help="partitions of the bench topics (16)")
    ap.add_argument("--prefill", type=int, default=6_000_000,
                    help="records pre-filled through the raw producer; also the raw produce figure")
    ap.add_argument("--paced-rate", type=int, default=40_000, help="offered records/s of phase f32r")
    ap.add_argument("--delay-rate", type=int, default=10_000,
                    help="offered delayed records/s of phase delayr")
    ap.add_argument("--max-delay-ms", type=int, default=60_000,
                    help="phase delay: records are delayed by a random 0..this (an hour scaled "
                         "down 60 times, with the levels scaled likewise: bench/delay.py)")
    ap.add_argument("--phases",
                    default="noop,noopredis,p1,p100,f32,f1000,f32pb,p1v2,f32v2,f32r,delay,delayr")
    ap.add_argument("--broker", default="kafka,rocketmq",
                    help="the brokers to measure, one after the other in this run: a comma-separated"
                         " list of kafka, rocketmq, tansu; 'both' = tansu,kafka, 'all' = all three"
                         " (default: kafka,rocketmq)")
    ap.add_argument("--server", choices=("uvicorn", "granian"), default="uvicorn",
                    help="the gateway's HTTP server: mqgw serve's uvicorn (default), or granian for "
                         "the HTTP-stack comparison (needs granian installed; no connection limits)")
    ap.add_argument("--peers", choices=("strimzi", "none"), default="strimzi",
                    help="on Apache Kafka, also measure the Strimzi HTTP bridge 1.1.0 (bench/bridge.py;"
                         " skipped with a line saying why where its jar or Java 21+ is missing)")
    ap.add_argument("--no-balance", action="store_true",
                    help="open the connections all at once and let the workers' shared accept decide"
                         " (often 16/0); by default they are spread evenly over the workers")
    ap.add_argument("--profile", action="store_true",
                    help="during each phase, py-spy record every worker and (if installed) perf record"
                         " the workers, redis and the broker, into bench/results/profile-<time>/"
                         " (slows the gateway a little: do not compare these numbers)")
    ap.add_argument("--secure", action="store_true",
                    help="run as production does: API keys required, every consumer and producer "
                         "registered, and each consumer rate-limited (far above what it reaches, so "
                         "the token bucket runs on every /message without ever refusing)")
    args = ap.parse_args(argv)
    brokers = BROKER_SETS.get(args.broker) or [b.strip() for b in args.broker.split(",") if b.strip()]
    if not brokers or any(b not in BROKERS for b in brokers) or len(set(brokers)) < len(brokers):
        ap.error(f"--broker: a list of {', '.join(BROKERS)} (or both, all), not {args.broker!r}")
    phases = [p for p in args.phases.split(",") if p]
    mode = {"MQGW_AUTH": "true", "MQGW_OPEN_MODE": "false"} if args.secure else \
        {"MQGW_AUTH": "false", "MQGW_OPEN_MODE": "true"}
    mode["MQGW_HMAC_KEY"] = "bench-" + os.urandom(16).hex()  # auth refuses the public default
    extra_env = runargs.gateway_env(args, mode)

    stamp = runargs.stamp()
    profile_dir = None
    if args.profile:
        profile_dir = RESULTS / f"profile-{stamp}"
        profile_dir.mkdir(parents=True, exist_ok=True)

    res = runargs.record(args, dt.datetime.now())
    res["config"].update(gateway_env=extra_env, mqgw_env_inherited={
        k: v for k, v in os.environ.items() if k.startswith("MQGW_")})
    res["brokers"] = {}
    stack = Stack()
    runargs.stop_on_sigterm()
    t_start = time.monotonic()
    try:
        for b in brokers:
            res["brokers"][b] = run_broker(stack, b, args, phases, extra_env, profile_dir)
            stack.stop()
        res["wall_s"] = round(time.monotonic() - t_start, 1)
    except KeyboardInterrupt as e:
        stack.stop()
        print(f"\ninterrupted ({e or 'Ctrl-C'}); every process this run started is stopped", file=sys.stderr)
        return 130
    finally:
        stack.stop()
    out = Path(args.out)
    runargs.write(res, out, f"run-{stamp}.json")
    print()
    print(report_both(res))
    print(f"\nwall time {res['wall_s']} s; JSON: {os.path.relpath(out, ROOT)} (+ run-{stamp}.json)")
    if profile_dir is not None:
        print(f"profiles in {os.path.relpath(profile_dir, ROOT)}/: <phase>-<pid>.txt py-spy collapsed"
              " stacks (summarise: bench/profsummary.py FILES), <phase>.perf.txt perf summaries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
