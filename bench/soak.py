"""Soak: minutes of steady produce/delay/nack load through two gateway nodes, watching whether
Redis (keys, memory) or the workers (RSS) grow with the records delivered.

    .venv/bin/python bench/soak.py --minutes 5 --broker kafka    # or: make soak SOAK_ARGS="..."

It starts redis-server, the broker (Tansu, or Apache Kafka from its Maven jars) and two gateway
nodes (``mqgw serve``, relay on, the gateway's default delay wheel) with bench/run.py's helpers,
then, for ``--minutes``, offers ``--rate`` records/s (batches of ``--batch``, paced), of which
``--delayed-pct`` are delayed by a random 0..``--max-delay-s``, through both nodes; consumers on
both nodes fetch (long polls) and ack, and nack ``--nack-pct`` of the first deliveries (retried
once through the wheel after ``--retry-delay-ms``); ``--cancel-pct`` of the records delayed by
5 s or more are cancelled (a cancel is the one thing that leaves a Redis key per record). Every
``--sample-s`` it samples Redis (DBSIZE; INFO memory: used_memory less the clients' buffers, the
least of 5 readings; the ``*{delay}:m:*`` marks, counted with SCAN), the RSS of every gateway
worker, the records produced / consumed / overdue (not consumed ``--grace-s`` after their due
time: lost so far) and the 5xx answered. After the load it drains (waits for every record still
due), then fits slopes per hour over the second half of the load (the delayed records in
flight are at steady state after ``--max-delay-s``) and fails (exit 1) when:

- Redis keys grow faster than the cancels (+10 %) plus ``--key-tolerance`` of the delayed and
  retried records (rates over the same window);
- Redis memory grows faster than the cancels' marks (``--mark-bytes`` each) plus
  ``--mem-tolerance`` bytes per delayed or retried record, at least ``--mem-floor-mb`` MB/hour;
  both growth checks need the slope above the limit by twice its standard error: Redis memory
  moves by ~0.5 MB between samples, so a 5-minute run catches tens of MB/hour, not less (the
  keys are exact);
- a record is lost (not consumed by the end of the drain; the lost ones are then looked for in
  every topic of the broker), a failed record was committed without being retried, a cancelled
  record was delivered, or a request was answered 5xx (or an unexpected 4xx, or not at all).

Duplicates are counted and explained (the same offset delivered again, or two copies in the
broker: written twice by the relay, or by a produce), not judged; so is worker RSS (MB/hour).
``--sizing`` (on by default) then measures what Redis holds per consumer, per queue and per
cancel mark (docs/redis.md, Redis sizing). Output: a table (``--json``: the JSON instead);
the JSON is also written to bench/results/soak-latest.json (and a timestamped copy). Not part
of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import heapq
import os
import random
import subprocess
import sys
import time
from array import array
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import redis  # noqa: E402
import uvloop  # noqa: E402

import httpc  # noqa: E402
import run as bench_run  # noqa: E402
import runargs  # noqa: E402
from gateway.cli import devstack  # noqa: E402

TOPIC = "soak"
GROUP = "soak"
MARKS = "*{delay}:m:*"

# Per-record states (one byte per sequence number).
IN_FLIGHT, PENDING, DONE, CANCELLED, REFUSED = 0, 1, 2, 3, 4


def now_ms() -> int:
    return int(time.time() * 1000)


# -- processes -----------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def start_node(stack: bench_run.Stack, name: str, redis_url: str, bootstrap: str, workers: int,
               env: dict[str, str], src: Path) -> dict[str, Any]:
    """One gateway node through run.py's start_gateway; its log is renamed to ``<name>.log`` (the
    node keeps writing to it), so that the next node's log does not truncate this one's."""
    svc, pids = bench_run.start_gateway(stack, redis_url, bootstrap, workers, env, src)
    log = runargs.RESULTS / f"soak-{name}.log"
    os.replace(runargs.RESULTS / "gateway.log", log)
    return {"name": name, "port": svc.port, "master": svc.proc.pid,
            "workers": pids or [svc.proc.pid], "log": os.path.relpath(log, ROOT)}


# -- the load ------------------------------------------------------------------------------------
class Ledger:
    """What the load generator knows of every record it offered, by sequence number."""

    def __init__(self) -> None:
        self.state = bytearray()
        # Where each record was last delivered: a duplicate is explained by comparing the two
        # (the same offset again: a redelivery; another offset: the broker holds two copies).
        self.at_topic = bytearray()  # 1: the topic, 2: the retry topic
        self.at_queue = array("l")
        self.at_offset = array("q")
        self.dups = {"same_offset": 0, "other_offset_from_wheel": 0, "other_offset_produced": 0}
        self.due: dict[int, int] = {}  # pending records: when they are due (ms), + grace = overdue
        self.heap: list[tuple[int, int]] = []  # (overdue at, seq), lazily checked against ``due``
        self.overdue: set[int] = set()
        self.c = {"offered": 0, "produced": 0, "delayed": 0, "refused": 0, "consumed": 0,
                  "first_deliveries": 0, "retries_delivered": 0, "nacked": 0, "duplicates": 0,
                  "cancel_sent": 0, "cancelled": 0, "cancel_too_late": 0,
                  "cancelled_but_delivered": 0, "delivered_after_refusal": 0, "requests": 0,
                  "status_5xx": 0, "unexpected_4xx": 0, "transport_errors": 0,
                  "acks_not_committed": 0, "nack_dropped": 0, "harness_errors": 0,
                  "empty_polls": 0}
        self.error_samples: list[str] = []
        self.dup_samples: list[str] = []

    def new_seqs(self, n: int) -> range:
        start = len(self.state)
        self.state.extend(bytes(n))
        self.at_topic.extend(bytes(n))
        self.at_queue.extend([-1] * n)
        self.at_offset.extend([-1] * n)
        self.c["offered"] += n
        return range(start, start + n)

    def expect(self, seq: int, due_ms: int, grace_ms: int) -> None:
        self.due[seq] = due_ms + grace_ms
        heapq.heappush(self.heap, (due_ms + grace_ms, seq))

    def settle(self, seq: int) -> None:
        self.due.pop(seq, None)
        self.overdue.discard(seq)

    def error(self, what: str, status: int, body: bytes) -> None:
        if status >= 500:
            self.c["status_5xx"] += 1
        elif status:
            self.c["unexpected_4xx"] += 1
        else:
            self.c["transport_errors"] += 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{what}: {status} {body[:300]!r}")

    def tick(self) -> int:
        """Move the records past their overdue time into ``overdue``; the records lost so far."""
        t = now_ms()
        while self.heap and self.heap[0][0] <= t:
            at, seq = heapq.heappop(self.heap)
            if self.due.get(seq) == at:
                self.overdue.add(seq)
        return len(self.overdue)


class Client:
    """One keep-alive connection to a node, opened anew after a failure and before a request on a
    connection idle for :data:`IDLE_S` (uvicorn closes idle ones after 5 s: a request racing that
    close would fail for a reason that is not the gateway's)."""

    IDLE_S = 3.0

    def __init__(self, port: int, led: Ledger) -> None:
        self.port = port
        self.led = led
        self.conn: httpc.Connection | None = None
        self.used = 0.0

    async def call(self, raw: bytes, what: str) -> tuple[int, bytes] | None:
        """(status, body), or None when the request failed without an answer (counted)."""
        self.led.c["requests"] += 1
        try:
            if self.conn is None or time.monotonic() - self.used > self.IDLE_S:
                self.close()
                self.conn = await httpc.connect("127.0.0.1", self.port)
            out: tuple[int, bytes] = await asyncio.wait_for(self.conn.request(raw), 60)
            self.used = time.monotonic()
            return out
        except (TimeoutError, httpc.HttpError, OSError, RuntimeError) as e:
            self.led.error(what, 0, repr(e).encode())
            self.close()
            return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Load:
    """Producers, consumers and cancels on both nodes, in this process (asyncio, bench/httpc.py)."""

    def __init__(self, args: argparse.Namespace, ports: list[int]) -> None:
        self.a = args
        self.ports = ports
        self.led = Ledger()
        self.rng = random.Random(args.seed)
        self.producing = True
        self.consuming = True
        self.cancels: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        self.pad = "x" * max(0, args.value_size - 12)
        self.grace_ms = int(args.grace_s * 1000)
        self.drained = asyncio.Event()  # set once production stopped and nothing is due

    async def guard(self, task: Coroutine[Any, Any, None]) -> None:
        """Run one load task; a bug in it fails the soak instead of silently ending the task."""
        try:
            await task
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - reported, and the run fails
            self.led.c["harness_errors"] += 1
            self.led.error_samples.append(f"load task died: {e!r}")

    def check_drained(self) -> None:
        if not self.producing and not self.led.due:
            self.drained.set()

    async def producer(self, i: int, port: int, n: int) -> None:
        a, led = self.a, self.led
        client = Client(port, led)
        interval = n * a.batch / a.rate
        loop = asyncio.get_running_loop()
        next_at = loop.time() + interval * i / n
        while self.producing:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at + interval, loop.time() - 1.0)  # never more than 1 s of catch-up
            seqs = led.new_seqs(a.batch)
            sent = now_ms()
            msgs, delays = [], []
            for seq in seqs:
                m: dict[str, Any] = {"key": f"k{seq}", "value": f"s{seq:010d}-{self.pad}"}
                d = 0
                if self.rng.random() * 100 < a.delayed_pct:
                    d = self.rng.randrange(a.max_delay_s * 1000 + 1)
                    m["delayMs"] = d
                msgs.append(m)
                delays.append(d)
            raw = httpc.post("/produce", orjson.dumps({"topic": TOPIC, "messages": msgs}))
            answer = await client.call(raw, "produce")
            if answer is None:
                for seq in seqs:  # may or may not be written: a record delivered later is counted
                    led.state[seq] = REFUSED
                    led.c["refused"] += 1
                continue
            status, body = answer
            if status != 200:
                led.error("produce", status, body)
                for seq in seqs:
                    led.state[seq] = REFUSED
                led.c["refused"] += len(seqs)
                continue
            results = orjson.loads(body)["results"]
            for seq, d, r in zip(seqs, delays, results, strict=True):
                if "error" in r:
                    led.state[seq] = REFUSED
                    led.c["refused"] += 1
                    if len(led.error_samples) < 20:
                        led.error_samples.append(f"produce record: {r['error']}")
                    continue
                led.c["produced"] += 1
                if d:
                    led.c["delayed"] += 1
                if led.state[seq] == IN_FLIGHT:  # not consumed before this answer came
                    led.state[seq] = PENDING
                    led.expect(seq, sent + d, self.grace_ms)
                    if d >= 5000 and self.rng.random() * 100 < a.cancel_pct:
                        self.cancels.put_nowait((seq, r["delayId"]))
        client.close()

    async def canceller(self, port: int) -> None:
        led = self.led
        client = Client(port, led)
        while True:
            seq, delay_id = await self.cancels.get()
            led.c["cancel_sent"] += 1
            answer = await client.call(httpc.post(f"/delayed/{quote(delay_id)}", b"", method="DELETE"),
                                       "cancel")
            if answer is None:
                continue
            status, body = answer
            if status == 200 and orjson.loads(body).get("result") == "cancelled":
                led.c["cancelled"] += 1
                if led.state[seq] == DONE:
                    led.c["cancelled_but_delivered"] += 1
                    led.error_samples.append(f"cancel: seq {seq} was delivered, then cancelled")
                led.state[seq] = CANCELLED
                led.settle(seq)
                self.check_drained()
            elif status == 409:
                led.c["cancel_too_late"] += 1
            else:
                led.error("cancel", status, body)

    async def consumer(self, port: int) -> None:
        a, led = self.a, self.led
        fetch = httpc.get(f"/message?consumer={GROUP}&topic={TOPIC}&max={a.max}&wait_ms=1000")
        client = Client(port, led)
        while self.consuming:
            answer = await client.call(fetch, "message")
            if answer is None:
                await asyncio.sleep(0.2)
                continue
            status, body = answer
            if status != 200:
                led.error("message", status, body)
                await asyncio.sleep(0.2)
                continue
            r = orjson.loads(body)
            if r.get("status") != "ok":
                led.c["empty_polls"] += 1
                continue
            failed: list[int] = []
            done: list[tuple[int, int, int, int]] = []
            where = (2 if r.get("retryTopic") else 1, int(r["queue"]))
            wheel = 0
            for m in r["messages"]:
                seq = int(m["value"][1:11])
                attempt = int(m.get("attempt", 1))
                wheel = int(any(h[0] == "mqgw-delay-due" for h in m.get("headers") or ()))
                if attempt == 1 and (seq * 7919) % 10_000 < a.nack_pct * 100:  # spread out
                    failed.append(m["offset"])
                    done.append((seq, -1, m["offset"], wheel))
                else:
                    done.append((seq, attempt, m["offset"], wheel))
            ack: dict[str, Any] = {"requestId": r["requestId"]}
            if failed:
                ack["failed"] = failed
            answer = await client.call(httpc.post("/ack", orjson.dumps(ack)), "ack")
            if answer is None:
                continue
            status, body = answer
            if status == 409:  # lock_lost / offset_reset: redelivered elsewhere, nothing lost
                led.c["acks_not_committed"] += 1
                continue
            if status != 200:
                led.error("ack", status, body)
                continue
            answer = orjson.loads(body)
            if answer.get("result") != "committed":  # already_committed
                led.c["acks_not_committed"] += 1
                continue
            if failed:  # every failed offset must be retried (or dead-lettered), never dropped
                handled = {x["offset"] for x in answer.get("retried", [])}
                handled.update(answer.get("deadLettered", []))
                dropped = sorted(set(failed) - handled)
                if dropped:
                    led.c["nack_dropped"] += len(dropped)
                    if len(led.error_samples) < 20:
                        led.error_samples.append(
                            f"ack failed={failed} of batch {r['topic']}/{r.get('retryTopic', '')}"
                            f" queue {r['queue']} [{r['offset']}, {r['nextOffset']}): offsets "
                            f"{dropped} neither retried nor dead-lettered: {body[:400]!r}")
            t = now_ms()
            for seq, attempt, offset, wheel in done:
                self.consumed(seq, attempt, t, (*where, offset), wheel)
        client.close()

    def consumed(self, seq: int, attempt: int, t: int, where: tuple[int, int, int],
                 wheel: int = 0) -> None:
        """One record acknowledged (attempt -1: nacked, to come back after the retry delay)."""
        led = self.led
        st = led.state[seq] if seq < len(led.state) else REFUSED
        if st == CANCELLED:
            led.c["cancelled_but_delivered"] += 1
            if len(led.error_samples) < 20:
                led.error_samples.append(f"seq {seq} delivered after its cancel")
            return
        if st == DONE:
            led.c["duplicates"] += 1
            before = (led.at_topic[seq], led.at_queue[seq], led.at_offset[seq])
            kind = "same_offset" if before == where else (
                "other_offset_from_wheel" if wheel else "other_offset_produced")
            led.dups[kind] += 1
            if led.c["duplicates"] <= 5:
                led.dup_samples.append(f"duplicate: seq {seq} delivered at (topic, queue, offset) "
                                         f"{before}, then at {where} (1: topic, 2: retry topic)")
            return
        if st == REFUSED:
            led.c["delivered_after_refusal"] += 1
            return
        led.at_topic[seq], led.at_queue[seq], led.at_offset[seq] = where
        if attempt == -1:
            led.c["nacked"] += 1
            led.c["first_deliveries"] += 1
            led.state[seq] = PENDING
            led.expect(seq, t + self.a.retry_delay_ms, self.grace_ms)
            return
        led.c["consumed"] += 1
        led.c["first_deliveries" if attempt == 1 else "retries_delivered"] += 1
        led.state[seq] = DONE
        led.settle(seq)
        self.check_drained()


# -- sampling ------------------------------------------------------------------------------------
def count_keys(r: redis.Redis, pattern: str) -> int:
    n = 0
    for _ in r.scan_iter(match=pattern, count=5000):
        n += 1
    return n


def redis_sample(r: redis.Redis) -> dict[str, Any]:
    """``data_memory`` is ``used_memory`` less the clients' buffers (which come and go by
    megabytes with long polls and pub/sub), the least of 5 readings 0.1 s apart: what is held,
    not what a command in flight allocated for a moment."""
    reads = []
    for i in range(5):
        if i:
            time.sleep(0.1)
        mem = r.info("memory")
        used, clients = int(mem["used_memory"]), int(mem.get("mem_clients_normal", 0))
        reads.append((used - clients, used, clients, int(mem["used_memory_dataset"]),
                      int(mem["used_memory_rss"]), int(mem.get("number_of_cached_scripts", 0))))
    data, used, clients, dataset, rss, scripts = min(reads)
    return {"keys": int(r.dbsize()), "used_memory": used, "mem_clients": clients,
            "data_memory": data, "data_memory_spread": max(x[0] for x in reads) - data,
            "used_memory_dataset": dataset, "used_memory_rss": rss, "cached_scripts": scripts,
            "delay_marks": count_keys(r, MARKS)}


def ledger_sample(led: Ledger) -> dict[str, Any]:
    """The load's side of a sample (on the event loop's thread, which owns the ledger)."""
    s = {"lost_so_far": led.tick(), "in_flight": len(led.due)}
    for k in ("offered", "produced", "delayed", "consumed", "nacked", "cancelled", "duplicates",
              "status_5xx", "unexpected_4xx"):
        s[k] = led.c[k]
    return s


def system_sample(r: redis.Redis, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Redis and the workers (in a thread: a SCAN of many marks must not stall the load)."""
    s = redis_sample(r)
    rss = {str(p): round(rss_mb(p), 1) for n in nodes for p in n["workers"]}
    s["worker_rss_mb"] = rss
    s["rss_mb"] = round(sum(rss.values()), 1)
    s["loadavg"] = round(os.getloadavg()[0], 2)
    return s


def fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares slope of ys over xs (seconds) and its standard error, both per hour."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    ssr = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return 3600 * b, 3600 * (ssr / (n - 2) / sxx) ** 0.5


def slope_per_hour(xs: list[float], ys: list[float]) -> float | None:
    f = fit(xs, ys)
    return None if f is None else f[0]


# -- the run ---------------------------------------------------------------------------------------
async def drive(args: argparse.Namespace, nodes: list[dict[str, Any]], r: redis.Redis,
                t0: float) -> tuple[Load, list[dict[str, Any]]]:
    ports = [n["port"] for n in nodes]
    load = Load(args, ports)
    samples: list[dict[str, Any]] = []
    np_ = args.producers
    producers = [asyncio.create_task(load.guard(load.producer(i, ports[i % len(ports)], np_)))
                 for i in range(np_)]
    consumers = [asyncio.create_task(load.guard(load.consumer(ports[i % len(ports)])))
                 for i in range(args.consumers)]
    cancellers = [asyncio.create_task(load.guard(load.canceller(p))) for p in ports]
    duration = args.minutes * 60

    async def take(phase: str) -> None:
        s = {"t": round(time.monotonic() - t0, 1), "phase": phase, **ledger_sample(load.led)}
        s.update(await asyncio.to_thread(system_sample, r, nodes))
        samples.append(s)
        if not args.json:
            print(row(s), flush=True)

    if not args.json:
        print(header(), flush=True)
    start = time.monotonic()
    await take("load")
    while time.monotonic() - start < duration:
        await asyncio.sleep(min(args.sample_s, max(0.0, start + duration - time.monotonic())))
        await take("load")
    load.producing = False
    await asyncio.gather(*producers)
    # Drain: everything produced is due by now + the longest delay (+ a retry); give it the grace.
    drain_until = time.monotonic() + args.max_delay_s + args.retry_delay_ms / 1000 + args.grace_s + 30
    load.check_drained()
    try:
        await asyncio.wait_for(load.drained.wait(), max(0.0, drain_until - time.monotonic()))
    except TimeoutError:
        pass  # what is still due is lost
    load.consuming = False
    await asyncio.gather(*consumers)
    for c in cancellers:
        c.cancel()
    await take("drained")
    return load, samples


def verdict(args: argparse.Namespace, load: Load, samples: list[dict[str, Any]],
            duration_s: float) -> dict[str, Any]:
    led = load.led
    half = [s for s in samples if s["phase"] == "load" and s["t"] >= samples[0]["t"] + duration_s / 2]
    xs = [s["t"] for s in half]
    series = {"keys_per_hour": [s["keys"] for s in half],
              "redis_mb_per_hour": [s["data_memory"] / 2**20 for s in half]}
    stderr = {k: (f[1] if (f := fit(xs, v)) else None) for k, v in series.items()}
    slopes = {"keys_per_hour": slope_per_hour(xs, [s["keys"] for s in half]),
              "delay_marks_per_hour": slope_per_hour(xs, [s["delay_marks"] for s in half]),
              "redis_mb_per_hour": slope_per_hour(xs, [s["data_memory"] / 2**20 for s in half]),
              "used_memory_mb_per_hour": slope_per_hour(xs, [s["used_memory"] / 2**20 for s in half]),
              "worker_rss_mb_per_hour": slope_per_hour(xs, [s["rss_mb"] for s in half])}
    # The rates over the fitted window itself (a loaded machine may not hold the offered rate).
    span_h = (xs[-1] - xs[0]) / 3600 if len(xs) > 1 else 0.0

    def rate(k: str) -> float:
        return (half[-1][k] - half[0][k]) / span_h if span_h else 0.0

    delayed_h, retried_h, cancels_h = rate("delayed"), rate("nacked"), rate("cancelled")
    mark_b = args.mark_bytes
    # Each cancel leaves a mark (+10 %: the cancels are counted a moment before Redis is sampled).
    keys_limit = 1.1 * cancels_h + args.key_tolerance * (delayed_h + retried_h)
    mem_limit = max(args.mem_floor_mb,
                    (cancels_h * mark_b + args.mem_tolerance * (delayed_h + retried_h)) / 2**20)
    lost = len(led.due)
    failures = []
    if slopes["keys_per_hour"] is None:
        failures.append("too few samples in the second half to fit a slope (run longer)")
    else:
        # Fails when the growth is above the limit by more than twice its standard error: the
        # samples' noise (Redis memory moves by ~0.5 MB from one sample to the next) cannot fail
        # a run, and a short run can only catch a larger growth.
        if slopes["keys_per_hour"] - 2 * (stderr["keys_per_hour"] or 0) > keys_limit:
            failures.append(f"Redis keys grow {slopes['keys_per_hour']:,.0f}/hour, above "
                            f"{keys_limit:,.0f}/hour (cancels {cancels_h:,.0f}/hour + 10 % + "
                            f"{args.key_tolerance:.0%} of {delayed_h + retried_h:,.0f} delayed and "
                            f"retried records/hour)")
        if (slopes["redis_mb_per_hour"] or 0) - 2 * (stderr["redis_mb_per_hour"] or 0) > mem_limit:
            failures.append(f"Redis memory grows {slopes['redis_mb_per_hour']:,.1f} "
                            f"± {stderr['redis_mb_per_hour']:,.1f} MB/hour, above {mem_limit:,.1f} MB/hour")
    if lost:
        failures.append(f"{lost:,} records lost (not consumed by the end of the drain), e.g. seq "
                        f"{sorted(led.due)[:5]}")
    warnings = []
    produced_s = led.c["produced"] / duration_s
    if produced_s < 0.9 * args.rate:
        warnings.append(f"produced {produced_s:,.0f} records/s of the {args.rate:,.0f} offered: the "
                        f"machine (load average {os.getloadavg()[0]:.1f}) or the gateway could not keep up")
    for k, what in (("status_5xx", "requests answered 5xx"),
                    ("unexpected_4xx", "requests answered an unexpected 4xx"),
                    ("transport_errors", "requests failed without an answer"),
                    ("cancelled_but_delivered", "cancelled records delivered"),
                    ("nack_dropped", "failed records an ack committed without retrying them"),
                    ("harness_errors", "load tasks that died (a bug of bench/soak.py)")):
        if led.c[k]:
            failures.append(f"{led.c[k]:,} {what}")
    return {"slopes_second_half": slopes, "stderr": stderr, "fit_samples": len(half),
            "rates_per_hour": {"delayed": round(delayed_h), "retried": round(retried_h),
                               "cancelled": round(cancels_h),
                               "produced": round(rate("produced"))},
            "limits": {"keys_per_hour": round(keys_limit), "redis_mb_per_hour": round(mem_limit, 2)},
            "produced_per_s": round(produced_s, 1), "lost": lost, "warnings": warnings,
            "failures": failures, "ok": not failures}


# -- where lost records are -------------------------------------------------------------------------
def locate(bootstrap: str, port: int, seqs: list[int], limit: int = 20) -> dict[str, Any]:
    """Where the first ``limit`` lost records are in the broker (every copy, in every topic: the
    soak topic, the retry topic, the wheel's level topics), with the consumers' committed offsets
    of those queues, to tell a record never written from one written but not delivered."""
    from confluent_kafka import Consumer, TopicPartition

    wanted = {f"s{q:010d}".encode(): q for q in seqs[:limit]}
    found: dict[int, list[dict[str, Any]]] = {q: [] for q in wanted.values()}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-locate",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        topics = {t: len(m.partitions) for t, m in c.list_topics(timeout=10).topics.items()
                  if not t.startswith("__") and not t.startswith("soak-size")}
        for t, n in sorted(topics.items()):
            parts = []
            for p in range(n):
                lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if hi > lo:
                    parts.append((TopicPartition(t, p, lo), hi))
            if not parts:
                continue
            c.assign([tp for tp, _ in parts])
            left = {tp.partition for tp, _ in parts}
            deadline = time.monotonic() + 60
            while left and time.monotonic() < deadline:
                for m in c.consume(10_000, 0.5):
                    if m.error():
                        left.discard(m.partition())
                        continue
                    seq = wanted.get((m.value() or b"")[:11])
                    if seq is not None:
                        headers = {k: v.decode(errors="replace") for k, v in (m.headers() or [])}
                        found[seq].append({"topic": t, "partition": m.partition(),
                                           "offset": m.offset(), "timestamp": m.timestamp()[1],
                                           "attempt": headers.get("mqgw-attempt"),
                                           "due": headers.get("mqgw-delay-due")})
            c.unassign()
    finally:
        c.close()
    queues = {}
    for g in (GROUP, "_mqgw.relay"):
        status, body = bench_run.http_json(port, "GET", f"/consumers/{g}/queues")
        queues[g] = body.get("queues") if status == 200 else f"{status} {body}"
    return {"records": {str(q): v for q, v in found.items()}, "queues": queues}


# -- sizing: what Redis holds per consumer, per queue and per cancel mark -------------------------------
def sizing(r: redis.Redis, nodes: list[dict[str, Any]], bootstrap: str, prefix: str,
           consumers: int) -> dict[str, Any]:
    """Unregistered consumers (``consumers`` of them) fetch and ack every queue once on topics of
    1, 16 and 128 partitions (one record per partition); what their keys hold is read with
    MEMORY USAGE (exact: SAMPLES 0). A hash is a compact listpack up to
    ``hash-max-listpack-entries`` fields (7 per queue), a hashtable beyond."""
    port = nodes[0]["port"]
    out: dict[str, Any] = {"consumer_hash": {}, "redis_config": {
        k: v for k, v in r.config_get("hash-max-listpack-*").items()}}
    for parts in (1, 16, 128):
        topic = f"soak-size-{parts}"
        devstack.create_topic(bootstrap, topic, parts)
        msgs = [{"value": "v", "partition": p} for p in range(parts)]
        status, body = bench_run.http_json(port, "POST", "/produce", {"topic": topic, "messages": msgs})
        if status != 200 or body.get("failed"):
            raise RuntimeError(f"sizing produce: {status} {body}")
        before = redis_sample(r)["data_memory"]
        keys_before = int(r.dbsize())
        for i in range(consumers):
            g = f"size{parts}-{i}"
            bench_run.http_json(port, "PATCH", f"/admin/consumers/{g}", {"start": "earliest"})
            for _ in range(parts):  # lock and commit every queue once
                status, body = bench_run.http_json(
                    port, "GET", f"/message?consumer={g}&topic={topic}&max=10")
                if status != 200 or body.get("status") != "ok":
                    break
                bench_run.http_json(port, "POST", "/ack", {"requestId": body["requestId"]})
        after = redis_sample(r)["data_memory"]
        keys = list(r.scan_iter(match=f"{prefix}:{{size{parts}-*", count=5000))
        usage = [int(r.memory_usage(k, samples=0) or 0) for k in keys]
        qkeys = [k for k in keys if k.endswith(b"}:q")]
        q_usage = [int(r.memory_usage(k, samples=0) or 0) for k in qkeys]
        hlen = [int(r.hlen(k)) for k in qkeys]
        enc = {r.object("encoding", k).decode() for k in qkeys[:5]}
        out["consumer_hash"][parts] = {
            "consumers": consumers,
            "keys_per_consumer": round((int(r.dbsize()) - keys_before) / consumers, 2),
            "q_hash_bytes": round(sum(q_usage) / max(1, len(q_usage))),
            "q_hash_fields": round(sum(hlen) / max(1, len(hlen)), 1), "q_hash_encoding": sorted(enc),
            "all_keys_bytes_per_consumer": round(sum(usage) / consumers),
            "data_memory_per_consumer": round((after - before) / consumers)}
    marks = [k for _, k in zip(range(200), r.scan_iter(match=MARKS, count=5000), strict=False)]
    if marks:
        out["delay_mark_bytes"] = round(sum(int(r.memory_usage(k, samples=0) or 0) for k in marks)
                                        / len(marks))
    for name, key in (("relay_hash", f"{prefix}:{{_mqgw.relay}}:q"),
                      ("soak_consumer_hash", f"{prefix}:{{{GROUP}}}:q")):
        if r.exists(key):
            out[name] = {"bytes": int(r.memory_usage(key, samples=0) or 0), "fields": int(r.hlen(key)),
                         "encoding": r.object("encoding", key).decode()}
    return out


# -- report ----------------------------------------------------------------------------------------
COLS = [("t", "t s", 7), ("produced", "produced", 10), ("consumed", "consumed", 10),
        ("in_flight", "in flight", 9), ("lost_so_far", "lost", 6), ("status_5xx", "5xx", 5),
        ("keys", "redis keys", 10), ("delay_marks", "marks", 9), ("data_memory", "redis MB", 9),
        ("mem_clients", "clients MB", 10),
        ("rss_mb", "worker RSS MB", 13), ("loadavg", "load", 6)]


def header() -> str:
    return "  ".join(h.rjust(w) for _, h, w in COLS)


def row(s: dict[str, Any]) -> str:
    cells = []
    for k, _, w in COLS:
        v = s[k]
        if k in ("data_memory", "mem_clients"):
            v = f"{v / 2**20:.2f}"
        elif isinstance(v, int):
            v = f"{v:,}"
        cells.append(str(v).rjust(w))
    return "  ".join(cells) + ("  (drained)" if s["phase"] == "drained" else "")


def summary(res: dict[str, Any]) -> str:
    v, c = res["verdict"], res["counts"]
    sl = v["slopes_second_half"]

    def f(x: float | None, nd: int = 0) -> str:
        return "n/a" if x is None else f"{x:,.{nd}f}"

    lines = [
        "",
        f"records: offered {c['offered']:,}, produced {c['produced']:,} "
        f"({v['produced_per_s']:,.0f}/s; {c['delayed']:,} delayed), "
        f"consumed {c['consumed']:,} ({c['retries_delivered']:,} retries), nacked {c['nacked']:,}, "
        f"cancelled {c['cancelled']:,} (+{c['cancel_too_late']:,} too late), lost {v['lost']:,}, "
        f"duplicates {c['duplicates']:,}, refused {c['refused']:,}",
        f"requests {c['requests']:,}: 5xx {c['status_5xx']}, unexpected 4xx {c['unexpected_4xx']}, "
        f"no answer {c['transport_errors']}, acks not committed {c['acks_not_committed']}",
        f"slopes over the second half ({v['fit_samples']} samples):",
        f"  redis keys       {f(sl['keys_per_hour']):>12} /hour   ± {f(v['stderr']['keys_per_hour'])} "
        f"(limit {v['limits']['keys_per_hour']:,})",
        f"  delay marks      {f(sl['delay_marks_per_hour']):>12} /hour   "
        f"(delayed {v['rates_per_hour']['delayed']:,}/hour, retried {v['rates_per_hour']['retried']:,}/hour,"
        f" cancelled {v['rates_per_hour']['cancelled']:,}/hour)",
        f"  redis memory     {f(sl['redis_mb_per_hour'], 2):>12} MB/hour ± "
        f"{f(v['stderr']['redis_mb_per_hour'], 2)} (limit {v['limits']['redis_mb_per_hour']:,}; "
        f"used_memory less the clients' buffers; "
        f"used_memory itself {f(sl['used_memory_mb_per_hour'], 2)} MB/hour)",
        f"  worker RSS (sum) {f(sl['worker_rss_mb_per_hour'], 1):>12} MB/hour (reported, not judged)",
    ]
    sz = res.get("sizing")
    if sz:
        lines.append("sizing (MEMORY USAGE, exact):")
        for parts, d in sz["consumer_hash"].items():
            lines.append(f"  consumer on a {parts}-partition topic: q hash {d['q_hash_bytes']:,} B "
                         f"({d['q_hash_fields']} fields, {'/'.join(d['q_hash_encoding'])}), all its keys "
                         f"{d['all_keys_bytes_per_consumer']:,} B, used_memory - clients "
                         f"{d['data_memory_per_consumer']:+,} B")
        for k in ("relay_hash", "soak_consumer_hash"):
            if k in sz:
                lines.append(f"  {k}: {sz[k]['bytes']:,} B ({sz[k]['fields']} fields, {sz[k]['encoding']})")
        if "delay_mark_bytes" in sz:
            lines.append(f"  a delay mark: {sz['delay_mark_bytes']} B (MEMORY USAGE of the key)")
    d = res["duplicates"]
    if c["duplicates"]:
        lines.append(f"duplicates: {d['same_offset']:,} at the offset delivered before (redelivered); "
                     f"two copies in the broker: {d['other_offset_from_wheel']:,} written by the relay "
                     f"(mqgw-delay-due), {d['other_offset_produced']:,} by a produce; e.g. "
                     + "; ".join(d["samples"][:2]))
    lines += [f"WARNING: {w}" for w in v["warnings"]]
    if res["error_samples"]:
        lines.append("errors (first ones): " + "; ".join(res["error_samples"][:5]))
    lines.append("SOAK OK" if v["ok"] else "SOAK FAILED:\n  - " + "\n  - ".join(v["failures"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = runargs.parser(
        __doc__, out=runargs.RESULTS / "soak-latest.json", workers_help="uvicorn workers per node (2)",
        env_help="extra environment for the gateway nodes",
        src_help="serve the gateway package found in DIR (default: this checkout), e.g. an earlier"
                 " commit's: git archive <commit> gateway | tar -x -C DIR")
    ap.add_argument("--minutes", type=float, default=5.0, help="minutes of load (5)")
    ap.add_argument("--broker", choices=("tansu", "kafka"), default="kafka")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s offered (1000)")
    ap.add_argument("--batch", type=int, default=20, help="records per POST /produce (20)")
    ap.add_argument("--delayed-pct", type=float, default=10.0, help="%% of records delayed (10)")
    ap.add_argument("--max-delay-s", type=int, default=20, help="delays are random 0..this (20)")
    ap.add_argument("--nack-pct", type=float, default=1.0, help="%% of first deliveries nacked (1)")
    ap.add_argument("--retry-delay-ms", type=int, default=2000, help="the consumer's retry delay (2000)")
    ap.add_argument("--cancel-pct", type=float, default=1.0,
                    help="%% of the records delayed by 5 s or more that are cancelled (1)")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the soak topic (8)")
    ap.add_argument("--producers", type=int, default=16,
                    help="producer connections, spread over the nodes; each sends a batch every "
                         "producers x batch / rate seconds (16: 320 ms at the defaults)")
    ap.add_argument("--consumers", type=int, default=8,
                    help="consumer connections (long polls), spread over the nodes (8)")
    ap.add_argument("--max", type=int, default=100, help="max records per /message (100)")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (10)")
    ap.add_argument("--grace-s", type=float, default=30.0,
                    help="a record not consumed this long after its due time counts as lost so far")
    ap.add_argument("--key-tolerance", type=float, default=0.01,
                    help="Redis keys may grow by this fraction of the delayed + retried records/hour,"
                         " beyond the cancels' marks (0.01)")
    ap.add_argument("--mem-tolerance", type=float, default=32.0,
                    help="bytes of Redis memory growth allowed per delayed or retried record, a tenth"
                         " of what a 7-day mark per record cost (32)")
    ap.add_argument("--mem-floor-mb", type=float, default=8.0,
                    help="MB/hour of Redis memory growth always allowed (8)")
    ap.add_argument("--mark-bytes", type=int, default=300,
                    help="Redis memory (used_memory) a cancel's mark is allowed: key, value, and "
                         "its entries in the keyspace and expires tables (300)")
    ap.add_argument("--no-sizing", dest="sizing", action="store_false",
                    help="skip the per-consumer / per-queue memory measurement at the end")
    ap.add_argument("--sizing-consumers", type=int, default=10,
                    help="consumers per topic in the sizing (MEMORY USAGE is exact: a few suffice)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print the JSON result instead of the table")
    args = ap.parse_args(argv)

    base = {"MQGW_AUTH": "false", "MQGW_OPEN_MODE": "true", "MQGW_RELAY": "true",
            "MQGW_HMAC_KEY": "soak-" + os.urandom(16).hex(), "MQGW_ACCESS_LOG": "false"}
    if args.broker == "tansu":  # Tansu's tail race: holes are looked at twice (as run.py)
        base["MQGW_GAP_RECHECK_MS"] = "30"
    env = runargs.gateway_env(args, base)
    prefix = env.get("MQGW_KEY_PREFIX", os.environ.get("MQGW_KEY_PREFIX", "mqgw"))
    src = runargs.gateway_src(args)
    stamp = runargs.stamp()
    res = runargs.record(args, dt.datetime.now(dt.UTC))
    res.update({
        "uptime_at_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "gateway_src": str(src), "git_head": runargs.git_head(src), "gateway_env": env,
    })
    stack = bench_run.Stack()
    out = Path(args.out)

    def save() -> str:
        return runargs.write(res, out, f"soak-{stamp}.json")

    runargs.stop_on_sigterm()
    log = (lambda *_: None) if args.json else (lambda *a: print(*a, flush=True))
    try:
        rsvc = stack.add(devstack.start_redis())
        broker = bench_run.start_broker(stack, args.broker)
        bs = broker.extra["bootstrap"]
        devstack.create_topic(bs, TOPIC, args.partitions)
        nodes = [start_node(stack, f"node{i + 1}", rsvc.extra["url"], bs, args.workers, env, src)
                 for i in range(2)]
        res["nodes"] = nodes
        log(f"redis {rsvc.extra['url']}  broker {args.broker} {bs}  nodes "
            + ", ".join(f"{n['name']} :{n['port']} workers {n['workers']}" for n in nodes))
        status, body = bench_run.http_json(nodes[0]["port"], "PATCH", f"/admin/consumers/{GROUP}", {
            "start": "earliest", "retry": {"delaysMs": [args.retry_delay_ms]}})
        if status != 200:
            raise RuntimeError(f"consumer settings: {status} {body}")
        r = redis.Redis.from_url(rsvc.extra["url"])
        log(f"{args.minutes:g} min of {args.rate:,.0f} records/s ({args.delayed_pct:g} % delayed "
            f"0-{args.max_delay_s} s, {args.nack_pct:g} % nacked, {args.cancel_pct:g} % of the delayed "
            f"cancelled), a sample every {args.sample_s:g} s; then the drain")
        t0 = time.monotonic()
        load, samples = uvloop.run(drive(args, nodes, r, t0))
        res["samples"] = samples
        res["counts"] = dict(load.led.c)
        res["error_samples"] = load.led.error_samples
        res["duplicates"] = {**load.led.dups, "samples": load.led.dup_samples}
        res["verdict"] = verdict(args, load, samples, args.minutes * 60)
        if res["verdict"]["lost"]:
            log("locating the lost records in the broker ...")
            res["lost_located"] = locate(bs, nodes[0]["port"], sorted(load.led.due))
            for q, where in list(res["lost_located"]["records"].items())[:5]:
                log(f"  seq {q}: {where or 'nowhere in the broker'}")
        res["uptime_at_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        save()  # the soak's figures are kept even if the sizing is interrupted
        if args.sizing:
            log(f"sizing: {args.sizing_consumers} consumers on 1-, 16- and 128-partition topics ...")
            res["sizing"] = sizing(r, nodes, bs, prefix, args.sizing_consumers)
        r.close()
    except KeyboardInterrupt as e:
        stack.stop()
        print(f"\ninterrupted ({e or 'Ctrl-C'}); every process this run started is stopped", file=sys.stderr)
        return 130
    finally:
        stack.stop()
    text = save()
    if args.json:
        print(text)
    else:
        print(summary(res))
        print(f"{res['uptime_at_end']}\nJSON: {os.path.relpath(out, ROOT)} (+ soak-{stamp}.json)")
    return 0 if res["verdict"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
