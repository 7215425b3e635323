"""Load generator for one benchmark phase; runs in its own process (not the gateway's).

Usage: ``python bench/loadgen.py '<json spec>'``. Prints ``start`` when the warm-up is
over and the measured window opens, ``end`` when it closes (run.py samples CPU at
those moments), then one JSON line with the results.

Spec kinds:
  produce  {port, topic, per_request, concurrency, duration, warmup, value_size}
  consume  {port, topic, group, max, concurrency, duration, warmup, ack: separate|piggyback,
            rate: offered records/s (0 = as fast as possible)}
With ``"dialect": "bridge"`` produce and consume speak the Strimzi HTTP bridge's API (its
Confluent-style v2 routes: bench/bridge.py) instead of the gateway's; with ``"dialect": "v2"``
the Confluent REST Proxy v2 API the gateway serves too (docs/rest-v2.md): the same calls, the
instance made with Confluent's field names and ``max.poll.records`` = ``max``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import sys
import time
from typing import Any
from urllib.parse import quote

import orjson
import uvloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import httpc

HOST = "127.0.0.1"
#: A connection kept while others are being placed is pinged again after this long (well under
#: the gateway's 5 s idle timeout: see open_connections).
KEEP_WARM_S = 1.0


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    if not samples_ns:
        return {"n": 0}
    s = sorted(samples_ns)
    n = len(s)

    def q(p: float) -> float:
        return round(s[min(n - 1, int(p * n))] / 1e6, 3)

    return {"n": n, "mean": round(sum(s) / n / 1e6, 3), "p50": q(0.50), "p90": q(0.90),
            "p99": q(0.99), "max": round(s[-1] / 1e6, 3)}


class Window:
    """The measured interval: [t0, t1) on perf_counter_ns, opened after the warm-up."""

    def __init__(self, warmup: float, duration: float) -> None:
        now = time.perf_counter_ns()
        self.t0 = now + int(warmup * 1e9)
        self.t1 = self.t0 + int(duration * 1e9)
        self.cpu0 = self.cpu1 = 0.0

    def inside(self, start_ns: int, end_ns: int) -> bool:
        return start_ns >= self.t0 and end_ns < self.t1

    def over(self) -> bool:
        return time.perf_counter_ns() >= self.t1

    async def announce(self) -> None:
        await asyncio.sleep(max(0.0, (self.t0 - time.perf_counter_ns()) / 1e9))
        self.cpu0 = _cpu()
        print("start", flush=True)
        await asyncio.sleep(max(0.0, (self.t1 - time.perf_counter_ns()) / 1e9))
        self.cpu1 = _cpu()
        print("end", flush=True)


async def _pinged(conn: httpc.Connection, ping: bytes) -> bool:
    """Whether ``conn`` answered ``ping`` (False: the server had closed it)."""
    if conn.lost:
        return False
    try:
        await conn.request(ping)
        return True
    except (httpc.HttpError, RuntimeError):  # uvloop: "unable to perform operation on ..."
        return False


def _server_inodes(port: int, client_ports: set[int]) -> dict[int, str]:
    """Client port -> inode of the gateway-side socket of that connection (from /proc/net/tcp)."""
    out = {}
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            lport = int(f[1].rsplit(":", 1)[1], 16)
            rport = int(f[2].rsplit(":", 1)[1], 16)
            if lport == port and rport in client_ports:
                out[rport] = f[9]
    return out


def _owner(inode: str, pids: list[int]) -> int:
    target = f"socket:[{inode}]"
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid
            except OSError:
                continue
    return 0


async def open_connections(port: int, n: int, workers: list[int]) -> tuple[list[httpc.Connection], dict]:
    """Open ``n`` keep-alive connections, spread evenly over the gateway's worker processes.

    uvicorn's workers share one listening socket and the first to wake accepts a whole burst
    of connections, so 16 connections opened at once often land 16/0 on two workers. With
    ``workers`` given, connections are opened one by one (each one served once, so it is
    accepted) and a connection whose worker already has its share is set aside and closed at
    the end: the measured clients are split like a balancer (or SO_REUSEPORT) would split them.

    Kept connections are pinged again while the others are placed: with many workers placing
    takes seconds (each try reads /proc), and a connection left idle for the gateway's
    ``keep_alive_timeout_ms`` (5 s then; 75 s now) is closed by it, as it should be: the first
    measured request on it then failed (``unable to perform operation on <TCPTransport
    closed=True>``: 8 workers, 64 connections, issue 23).
    """
    if not workers:
        return [await httpc.connect(HOST, port) for _ in range(n)], {"balanced": False}
    quota = {pid: n // len(workers) + (1 if i < n % len(workers) else 0) for i, pid in enumerate(workers)}
    have = {pid: 0 for pid in workers}
    keep: list[httpc.Connection] = []
    spare: list[httpc.Connection] = []
    ping = httpc.get("/healthz")
    attempts = 0
    used: dict[httpc.Connection, float] = {}
    owner: dict[httpc.Connection, int] = {}
    while len(keep) < n and attempts < 40 * n:
        attempts += 1
        for c in list(keep):
            if time.monotonic() - used[c] <= KEEP_WARM_S:
                continue
            if await _pinged(c, ping):
                used[c] = time.monotonic()
            else:  # closed all the same (a slower machine): its worker needs another
                keep.remove(c)
                c.close()
                have[owner.pop(c)] -= 1
        conn = await httpc.connect(HOST, port)
        await conn.request(ping)
        cport = conn._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        inode = _server_inodes(port, {cport}).get(cport)
        pid = _owner(inode, workers) if inode else 0
        if pid and have[pid] < quota[pid]:
            have[pid] += 1
            keep.append(conn)
            used[conn], owner[conn] = time.monotonic(), pid
        else:
            spare.append(conn)
            if len(spare) > 4 * n:  # the eager worker keeps winning: give the others time to wake
                for c in spare:
                    c.close()
                spare.clear()
                await asyncio.sleep(0.05)
    for c in spare:
        c.close()
    while len(keep) < n:  # could not balance: take what comes
        keep.append(await httpc.connect(HOST, port))
    await asyncio.sleep(0)  # a close the server sent with the last pings is seen now
    lost = [i for i, c in enumerate(keep) if c.lost]
    for i in lost:  # closed while idle all the same (a slower machine): a new one, unplaced
        if keep[i] in owner:
            have[owner.pop(keep[i])] -= 1
        keep[i] = await httpc.connect(HOST, port)
    return keep, {"balanced": all(have[p] == quota[p] for p in workers) and not lost,
                  "attempts": attempts, "replaced": len(lost),
                  "per_worker": {str(p): have[p] for p in workers}}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- produce ---------------------------------------------------------------------------------
#: The Strimzi bridge's embedded formats (application/vnd.kafka.<format>.v2+json).
BRIDGE_JSON = "application/vnd.kafka.json.v2+json"
BRIDGE_BINARY = "application/vnd.kafka.binary.v2+json"
BRIDGE_V2 = "application/vnd.kafka.v2+json"


def produce_requests(topic: str, per_request: int, value_size: int, variants: int = 64,
                     max_delay_ms: int = 0, dialect: str = "") -> list[bytes]:
    """Pre-built POST /produce requests: distinct keys spread records over all partitions; with
    ``max_delay_ms`` each record is delayed by a random 0..max_delay_ms. The bridge dialect:
    ``POST /topics/<topic>`` with the same keys and values as JSON strings."""
    out = []
    seq = 0
    rng = random.Random(7)
    for _ in range(variants):
        msgs = []
        for _ in range(per_request):
            head = f"v{seq:010d}-"
            msg: dict[str, Any] = {"key": f"k{seq}", "value": head + "x" * (value_size - len(head))}
            if max_delay_ms:
                msg["delayMs"] = rng.randrange(max_delay_ms)
            msgs.append(msg)
            seq += 1
        if dialect in ("bridge", "v2"):
            out.append(httpc.post(f"/topics/{quote(topic)}", orjson.dumps({"records": msgs}),
                                  content_type=BRIDGE_JSON))
        else:
            out.append(httpc.post("/produce", orjson.dumps({"topic": topic, "messages": msgs})))
    return out


async def run_produce(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "noop":  # GET /healthz through the same app, middleware and connections
        reqs = [httpc.get(spec.get("path", "/healthz"))]
    else:
        reqs = produce_requests(spec["topic"], spec["per_request"], spec["value_size"],
                                max_delay_ms=spec.get("max_delay_ms", 0),
                                dialect=spec.get("dialect", ""))
    bridge = spec.get("dialect") in ("bridge", "v2")
    conns, placement = await open_connections(spec["port"], spec["concurrency"], spec.get("balance", []))
    win = Window(spec["warmup"], spec["duration"])
    lat: list[int] = []
    stats = {"requests": 0, "records": 0, "errors": 0, "failed_records": 0, "error_samples": []}
    per = spec["per_request"]
    # With a rate, each connection sends a request every `interval` s (closed loop otherwise):
    # what a figure measured then (the delay relay's lateness) is at that load, not at saturation.
    interval = spec["concurrency"] * max(1, per) / spec["rate"] if spec.get("rate") else 0.0

    async def worker(i: int, conn: httpc.Connection) -> None:
        k = i * 7
        loop = asyncio.get_running_loop()
        next_at = loop.time() + interval * i / spec["concurrency"]
        while not win.over():
            if interval:
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                next_at += interval
            raw = reqs[k % len(reqs)]
            k += 1
            t0 = time.perf_counter_ns()
            status, body = await conn.request(raw)
            t1 = time.perf_counter_ns()
            if not win.inside(t0, t1):
                continue
            lat.append(t1 - t0)
            stats["requests"] += 1
            if not 200 <= status < 300:  # the bridge's /healthy answers 204
                stats["errors"] += 1
                if len(stats["error_samples"]) < 5:
                    stats["error_samples"].append(f"{status} {body[:200]!r}")
            elif per == 0:
                pass
            elif bridge:  # {"offsets":[{"partition":..,"offset":..}|{"error_code":..,"message":..}]}
                # (Confluent's v2, which the gateway answers, has "error_code":null on success)
                failed = body.count(b'"error_code"') - body.count(b'"error_code":null')
                stats["failed_records"] += failed
                stats["records"] += per - failed
            elif body.find(b'"failed":0,', 0, 120) < 0:
                failed = orjson.loads(body)["failed"]
                stats["failed_records"] += failed
                stats["records"] += per - failed
            else:
                stats["records"] += per

    announcer = asyncio.create_task(win.announce())
    await asyncio.gather(*(worker(i, c) for i, c in enumerate(conns)))
    await announcer
    for c in conns:
        c.close()
    d = spec["duration"]
    return {**stats, "placement": placement, "duration_s": d, "req_per_s": stats["requests"] / d,
            "records_per_s": stats["records"] / d, "latency_ms": percentiles(lat),
            "loadgen_cpu_pct": round(100 * (win.cpu1 - win.cpu0) / d, 1)}


# -- fetch + ack ------------------------------------------------------------------------------
_MSGS = b'"messages":['
_REC = b'{"offset":'


def parse_fetch(body: bytes, full: bool) -> tuple[dict[str, Any], int]:
    """(the response without its records, the number of records), cheaply.

    Parsing every 1000-record body (~170 KB) with orjson took the load generator to ~35%
    of a core in f1000 (5-8% this way), so the records are counted in place (each one is
    an object that starts with ``{"offset":`` in the gateway's compact JSON; the bench
    values never contain that text) and only the small envelope is parsed. ``full`` parses
    the whole body instead and is used on a sample of responses to check the count.
    """
    if full:
        r = orjson.loads(body)
        return r, len(r.get("messages") or ())
    i = body.find(_MSGS)
    if i < 0:
        return orjson.loads(body), 0
    j = body.rfind(b"]")
    n = body.count(_REC, i, j)
    return orjson.loads(body[:i] + b'"messages":[]' + body[j + 1:]), n


def consume_stats() -> dict[str, Any]:
    """The counters of a consume phase (the gateway's or the bridge's)."""
    return {"fetches": 0, "acks": 0, "records": 0, "empty": 0, "errors": 0, "ack_not_committed": 0,
            "count_mismatch": 0, "error_samples": []}


def record_error(stats: dict[str, Any], what: str, status: int, body: bytes) -> None:
    stats["errors"] += 1
    if len(stats["error_samples"]) < 5:
        stats["error_samples"].append(f"{what} {status} {body[:200]!r}")


def consume_result(spec: dict[str, Any], stats: dict[str, Any], win: Window, lat_msg: list[int],
                   lat_ack: list[int]) -> dict[str, Any]:
    d = spec["duration"]
    return {**stats, "duration_s": d, "records_per_s": stats["records"] / d,
            "fetch_per_s": stats["fetches"] / d, "ack_per_s": stats["acks"] / d,
            "message_latency_ms": percentiles(lat_msg), "ack_latency_ms": percentiles(lat_ack),
            "loadgen_cpu_pct": round(100 * (win.cpu1 - win.cpu0) / d, 1)}


async def run_consume(spec: dict[str, Any]) -> dict[str, Any]:
    base = (f"/message?consumer={quote(spec['group'])}&topic={quote(spec['topic'])}"
            f"&max={spec['max']}")
    fetch_req = httpc.get(base)
    piggyback = spec.get("ack", "separate") == "piggyback"
    conns, placement = await open_connections(spec["port"], spec["concurrency"], spec.get("balance", []))
    win = Window(spec["warmup"], spec["duration"])
    lat_msg: list[int] = []
    lat_ack: list[int] = []
    stats = consume_stats()

    seen = [0]

    def error(what: str, status: int, body: bytes) -> None:
        record_error(stats, what, status, body)

    # With a rate, each consumer starts a fetch every `interval` s (closed loop otherwise): the
    # latency is then measured at that offered load instead of at saturation.
    interval = spec["concurrency"] * spec["max"] / spec["rate"] if spec.get("rate") else 0.0

    async def worker(k: int, conn: httpc.Connection) -> None:
        pending_rid = ""
        pending_n = 0
        loop = asyncio.get_running_loop()
        next_at = loop.time() + interval * k / spec["concurrency"]
        while True:
            if interval:
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                next_at += interval
            over = win.over()
            if over and not pending_rid:
                return
            req = fetch_req
            if piggyback and pending_rid:
                req = httpc.get(f"{base}&requestId={pending_rid}")
            if over:  # piggyback mode: ack the last batch alone, outside the window
                req = httpc.post("/ack", orjson.dumps({"requestId": pending_rid}))
            t0 = time.perf_counter_ns()
            status, body = await conn.request(req)
            t1 = time.perf_counter_ns()
            if over:
                return
            inside = win.inside(t0, t1)
            if status != 200:
                if inside:
                    error("message", status, body)
                pending_rid = ""
                continue
            seen[0] += 1
            check = not seen[0] % 64  # a sample of the bodies is parsed in full, to check the count
            r, n = parse_fetch(body, check)
            if check and r.get("messages") and n != parse_fetch(body, False)[1]:
                stats["count_mismatch"] += 1
            if inside:
                lat_msg.append(t1 - t0)
                stats["fetches"] += 1
            if piggyback and pending_rid:
                ack = r.get("ack") or {}
                if ack.get("result") == "committed":
                    if inside:
                        stats["records"] += pending_n
                        stats["acks"] += 1
                elif inside:
                    stats["ack_not_committed"] += 1
                pending_rid = ""
            if r.get("status") != "ok":
                if inside:
                    stats["empty"] += 1
                continue
            if piggyback:
                pending_rid, pending_n = r["requestId"], n
                continue
            ack_req = httpc.post("/ack", orjson.dumps({"requestId": r["requestId"]}))
            t2 = time.perf_counter_ns()
            status, body = await conn.request(ack_req)
            t3 = time.perf_counter_ns()
            if not win.inside(t2, t3):
                continue
            lat_ack.append(t3 - t2)
            stats["acks"] += 1
            if status != 200:
                error("ack", status, body)
            elif orjson.loads(body).get("result") != "committed":
                stats["ack_not_committed"] += 1
            else:
                stats["records"] += n

    announcer = asyncio.create_task(win.announce())
    await asyncio.gather(*(worker(k, c) for k, c in enumerate(conns)))
    await announcer
    for c in conns:
        c.close()
    return {**consume_result(spec, stats, win, lat_msg, lat_ack), "placement": placement}


async def run_v2_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """f32/f1000 through consumer instances (the Strimzi bridge's, or the gateway's REST v2):
    one instance per connection, all in one group subscribed to the topic (on the bridge Kafka's
    group protocol spreads the partitions; on the gateway each fetch locks a free one); each
    round is ``GET .../records`` (``max.poll.records``: the bridge's own, bench/bridge.py; the
    gateway's instance is made with ``max``) and, when it brought records, ``POST .../offsets``
    with an empty body, which commits what the instance fetched: fetch + ack. The instances are
    deleted afterwards, outside the window."""
    group = quote(spec["group"])
    conns, _ = await open_connections(spec["port"], spec["concurrency"], spec.get("balance", []))
    bases = []
    for k, conn in enumerate(conns):
        made = {"name": f"c{k}", "format": "binary", "auto.offset.reset": "earliest",
                "enable.auto.commit": False} if spec.get("dialect") == "bridge" else {
                "name": f"c{k}", "format": "binary", "auto.offset.reset": "earliest",
                "auto.commit.enable": "false", "max.poll.records": spec["max"]}
        status, body = await conn.request(httpc.post(f"/consumers/{group}", orjson.dumps(made),
                                                     content_type=BRIDGE_V2))
        if status != 200:
            raise SystemExit(f"bridge: create consumer c{k}: {status} {body[:300]!r}")
        base = f"/consumers/{group}/instances/c{k}"
        status, body = await conn.request(httpc.post(f"{base}/subscription", orjson.dumps(
            {"topics": [spec["topic"]]}), content_type=BRIDGE_V2))
        if status not in (200, 204):
            raise SystemExit(f"bridge: subscribe c{k}: {status} {body[:300]!r}")
        bases.append(base)
    win = Window(spec["warmup"], spec["duration"])
    lat_msg: list[int] = []
    lat_ack: list[int] = []
    stats = consume_stats()

    def error(what: str, status: int, body: bytes) -> None:
        record_error(stats, what, status, body)

    async def worker(base: str, conn: httpc.Connection) -> None:
        poll = httpc.get(f"{base}/records?timeout=1000", accept=BRIDGE_BINARY)
        commit = httpc.post(f"{base}/offsets", b"", content_type=BRIDGE_V2)
        seen = 0
        while not win.over():
            t0 = time.perf_counter_ns()
            status, body = await conn.request(poll)
            t1 = time.perf_counter_ns()
            inside = win.inside(t0, t1)
            if status != 200:
                if inside:
                    error("records", status, body)
                continue
            n = body.count(b'"offset":')
            seen += 1
            if not seen % 64 and n != len(orjson.loads(body)):
                stats["count_mismatch"] += 1
            if inside:
                lat_msg.append(t1 - t0)
                stats["fetches"] += 1
            if not n:
                if inside:
                    stats["empty"] += 1
                continue
            t2 = time.perf_counter_ns()
            status, body = await conn.request(commit)
            t3 = time.perf_counter_ns()
            if not win.inside(t2, t3):
                continue
            lat_ack.append(t3 - t2)
            stats["acks"] += 1
            if status not in (200, 204):
                error("offsets", status, body)
            else:
                stats["records"] += n

    announcer = asyncio.create_task(win.announce())
    await asyncio.gather(*(worker(b, c) for b, c in zip(bases, conns, strict=True)))
    await announcer
    for base, conn in zip(bases, conns, strict=True):
        await conn.request(httpc.post(base, b"", method="DELETE", content_type=BRIDGE_V2))
        conn.close()
    return consume_result(spec, stats, win, lat_msg, lat_ack)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("key"):
        httpc.EXTRA_HEADERS = f"Authorization: Bearer {spec['key']}\r\n"
    fn = {"produce": run_produce, "noop": run_produce, "consume": run_consume}[spec["kind"]]
    if spec["kind"] == "consume" and spec.get("dialect") in ("bridge", "v2"):
        fn = run_v2_consume
    result = uvloop.run(fn(spec))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
