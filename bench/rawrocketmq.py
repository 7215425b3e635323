"""The raw clients on Apache RocketMQ: the ceiling the HTTP figures are compared to (run.py).

Two clients, on the same broker, one after the other:

- the **remoting client**: the gateway's own adapter (``gateway.broker.rocketmq``, asyncio on
  uvloop) used directly, without HTTP or Redis: produce sends batches of ``batch`` keyed records
  to one queue each (``SEND_BATCH_MESSAGE``, as ``/produce`` does for the records of a request
  that go to one queue), ``in_flight`` batches at once over the queues in turn; consume pulls
  every queue from offset 0, 32 records a pull (the broker's most), ``depth`` pulls in flight per
  queue (consume-queue offsets are contiguous, so the next pulls' offsets are known);
- **Apache's Java client** (rocketmq-client 5.5.0, ``bench/java/RawRocketMQ.java``, compiled
  against ``rocketmq_dist.resolve()``'s jars): ``DefaultMQProducer.send`` of batches from
  threads, ``DefaultMQPullConsumer.pull`` from offset 0.

run.py prefills the backlog topic with the remoting client and takes as each ceiling the faster
of the two (``client`` in the result says which); both figures are kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gateway.broker.base import OutgoingMessage  # noqa: E402
from gateway.broker.rocketmq import RocketMQBroker  # noqa: E402
from gateway.cli import rocketmq_dist  # noqa: E402

JAVA_SOURCE = HERE / "java" / "RawRocketMQ.java"
REMOTING = "remoting client"
JAVA = "Java client"
T = TypeVar("T")


def value_for(seq: int, size: int) -> bytes:
    head = b"v%010d-" % seq
    return head + b"x" * (size - len(head))


def _run(factory: Callable[[], Awaitable[T]]) -> T:
    """On uvloop, as the gateway runs."""
    try:
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
            return r.run(factory())  # type: ignore[arg-type]
    except ImportError:
        return asyncio.run(factory())  # type: ignore[arg-type]


# -- our remoting client -------------------------------------------------------------------------
def produce(namesrv: str, topic: str, count: int, value_size: int = 100, max_seconds: float = 30.0,
            batch: int = 100, in_flight: int = 32) -> dict[str, Any]:
    """``count`` keyed records (fewer if ``max_seconds`` runs out) in batches of ``batch`` to one
    queue each, ``in_flight`` batches at once; records/s over the whole."""

    async def go() -> dict[str, Any]:
        b = RocketMQBroker(namesrv)
        await b.start()
        try:
            queues = await b.queues(topic)
            values = [value_for(i, value_size) for i in range(1024)]
            keys = [b"k%d" % i for i in range(1024)]
            for q in queues:  # connect and learn the route before the clock starts
                await b.produce(topic, [OutgoingMessage(values[0], keys[0], queue=q)])
            batches = itertools.count()
            stats = {"sent": 0, "errors": 0}
            t0 = time.perf_counter()
            deadline = t0 + max_seconds

            async def worker() -> None:
                while True:
                    n = next(batches)
                    if n * batch >= count or time.perf_counter() > deadline:
                        return
                    q = queues[n % len(queues)]
                    base = n * batch
                    msgs = [OutgoingMessage(values[(base + j) & 1023], keys[(base + j) & 1023], queue=q)
                            for j in range(min(batch, count - base))]
                    res = await b.produce(topic, msgs)
                    bad = sum(1 for r in res if r.error_code)
                    stats["errors"] += bad
                    stats["sent"] += len(msgs) - bad

            await asyncio.gather(*(worker() for _ in range(in_flight)))
            t1 = time.perf_counter()
            return {"records": stats["sent"], "seconds": round(t1 - t0, 3),
                    "records_per_s": stats["sent"] / (t1 - t0), "errors": stats["errors"],
                    "total_in_topic": stats["sent"] + len(queues), "batch": batch,
                    "in_flight": in_flight, "client": REMOTING}
        finally:
            await b.close()

    return _run(go)


def consume(namesrv: str, topic: str, expected: int, max_seconds: float = 30.0, pull: int = 32,
            depth: int = 2) -> dict[str, Any]:
    """Every queue read from offset 0, ``pull`` records a pull and ``depth`` pulls in flight per
    queue, until ``expected`` records (or ``max_seconds``); records/s."""

    async def go() -> dict[str, Any]:
        b = RocketMQBroker(namesrv)
        await b.start()
        try:
            queues = await b.queues(topic)
            wm = await b.watermarks(topic)
            await b.fetch(topic, queues[0], 0, 1)  # connect before the clock starts
            stats = {"got": 0, "errors": 0}
            t0 = time.perf_counter()
            deadline = t0 + max_seconds

            async def reader(q: str, first: int) -> None:
                hw = wm.get(q, (0, 0))[1]
                at = first * pull
                while at < hw and stats["got"] < expected and time.perf_counter() < deadline:
                    try:
                        r = await b.fetch(topic, q, at, pull)
                    except Exception:  # noqa: BLE001 - counted, the run goes on
                        stats["errors"] += 1
                        continue
                    stats["got"] += len(r.records)
                    if not r.records:
                        return
                    at += pull * depth  # the next offsets are this reader's: offsets are contiguous

            await asyncio.gather(*(reader(q, d) for q in queues for d in range(depth)))
            t1 = time.perf_counter()
            return {"records": stats["got"], "seconds": round(t1 - t0, 3),
                    "records_per_s": stats["got"] / (t1 - t0), "errors": stats["errors"],
                    "complete": stats["got"] >= expected, "depth": depth, "client": REMOTING}
        finally:
            await b.close()

    return _run(go)


# -- Apache's Java client ------------------------------------------------------------------------
def java_classes() -> Path:
    """RawRocketMQ.java compiled (once per source version) into bench/results/."""
    src = JAVA_SOURCE.read_bytes()
    out = HERE / "results" / f"java-{hashlib.sha256(src).hexdigest()[:12]}"
    if (out / "RawRocketMQ.class").exists():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac not found (Debian: apt-get install openjdk-17-jdk-headless)")
    done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", f"{rocketmq_dist.resolve()}/*",
                           "-d", str(out), str(JAVA_SOURCE)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"javac RawRocketMQ.java:\n{done.stderr[-3000:]}")
    return out


def _java(args: list[str], timeout: float) -> dict[str, Any]:
    classes = java_classes()
    home = HERE / "results" / "java-home"  # the client's logs (logs/rocketmqlogs) go here
    home.mkdir(parents=True, exist_ok=True)
    cmd = [rocketmq_dist.java(), "-Xms512m", "-Xmx512m", f"-Duser.home={home}",
           "-cp", f"{rocketmq_dist.resolve()}/*{os.pathsep}{classes}", "RawRocketMQ", *args]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    wall = time.monotonic() - w0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"RawRocketMQ {args[0]} exited {done.returncode}:\n"
                           f"{(done.stderr + done.stdout)[-3000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("{"))
    res: dict[str, Any] = json.loads(line)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    # the JVM's CPU over its whole life (start-up and warm-up included), % of one core
    res["jvm_cpu_pct_whole_life"] = round(100 * cpu / wall, 1)
    res["client"] = JAVA
    return res


def java_produce(namesrv: str, topic: str, count: int, value_size: int = 100, max_seconds: float = 30.0,
                 batch: int = 100, threads: int = 32) -> dict[str, Any]:
    return _java(["produce", namesrv, topic, str(count), str(value_size), str(batch), str(threads),
                  str(max_seconds)], timeout=max_seconds + 120)


def java_consume(namesrv: str, topic: str, expected: int, max_seconds: float = 30.0, pull: int = 32,
                 threads: int = 16) -> dict[str, Any]:
    return _java(["consume", namesrv, topic, str(expected), str(pull), str(threads), str(max_seconds)],
                 timeout=max_seconds + 120)
