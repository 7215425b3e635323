"""``mqgw snapshot``: Parquet samples of every consumer's queue state, read from Redis with SCAN
and pipelines only, written atomically into date/hour partitions."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from gateway.cli import devstack
from gateway.core.snapshot_format import SCHEMA
from gateway.ops import snapshot as snap

from ..support import ROOT, TEST_BROKER, Api, Monitor, queue_id, queue_index, start_node, unique

#: The broker column of the snapshot rows: the adapter's name (Tansu is the kafka adapter)
BROKER_NAME = "rocketmq" if TEST_BROKER == "rocketmq" else "kafka"

UTC = dt.UTC


def run_once(redis_url: str, out: Path, **env: str) -> dict[str, Any]:
    """The real command line, in a subprocess: one sample, its JSON summary."""
    p = subprocess.run([sys.executable, "-m", "gateway", "snapshot", "--once", "--out", str(out),
                        "--redis-url", redis_url], cwd=ROOT, env={**os.environ, **env},
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def ts_ms(table: pa.Table) -> list[int]:
    return table.column("ts").cast(pa.int64()).to_pylist()


def check_place(path: Path, out: Path, ts: int) -> None:
    """The file sits in the date/hour partition of its sample time, named after it (UTC)."""
    t = dt.datetime.fromtimestamp(ts / 1000, UTC)
    rel = path.relative_to(out).parts
    assert rel[:2] == (f"date={t:%Y-%m-%d}", f"hour={t:%H}"), rel
    assert re.fullmatch(rf"snap-{t:%Y%m%dT%H%M%S}{ts % 1000:03d}-[A-Za-z0-9._-]+-\d+(-\d+)?\.parquet",
                        rel[2]), rel[2]


def rows_of(table: pa.Table, consumers: set[str]) -> list[dict[str, Any]]:
    rows = [r for r in table.to_pylist() if r["consumer"] in consumers]
    return sorted(rows, key=lambda r: (r["consumer"], r["client_id"], r["topic"], queue_index(r["queue"])))


def hgetall(r: redis.Redis, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(key).items()}


# -- (a) end to end through real gateway nodes --------------------------------------------------------

@pytest.mark.slow  # real consumers on the cluster in every state, then a snapshot
@pytest.mark.timeout(120)
class Between:
    """Equal to any number in [lo, hi]: a value read at a moment the test only bounds."""

    def __init__(self, lo: float, hi: float) -> None:
        self.lo, self.hi = lo, hi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (int, float)) and self.lo <= other <= self.hi

    def __repr__(self) -> str:
        return f"Between({self.lo:.3f}, {self.hi:.3f})"


@pytest.mark.rocketmq  # also in the RocketMQ pass (issue 22): pause, broadcast, rate limit, snapshot
def test_snapshot_of_real_consumers_has_exact_rows(api: Api, make_topic, redis_url: str,
                                                   rds: redis.Redis, tmp_path: Path) -> None:
    topic = make_topic(3)
    q0, q1, q2 = (queue_id(i) for i in range(3))
    for q, n in ((0, 5), (1, 3)):  # one request per record: the bundled broker lists a batch of
        for i in range(n):         # several records as one offset (ListOffsets), which would
            api.produce(topic, [f"{q}-{i}"], partition=q)  # make the watermarks unknowable here
    plain, bcast, paused, limited = (unique(p) for p in ("snap-c", "snap-b", "snap-p", "snap-r"))

    def fetch(group: str, max_: int, **params: Any) -> dict[str, Any]:
        body = api.message(consumer=group, topic=topic, max=max_, **params).json()
        assert body["status"] == "ok", body
        return body

    def ack(body: dict[str, Any]) -> None:
        assert api.ack(body["requestId"]).json()["result"] == "committed"

    # cluster mode: queue 0 consumed and acked, queue 1 locked and held, queue 2 empty
    api.config(plain, start="earliest")
    b = fetch(plain, 10)
    assert (b["queue"], len(b["messages"])) == (q0, 5)
    ack(b)
    held = fetch(plain, 10)
    assert (held["queue"], len(held["messages"])) == (q1, 3)
    # a registered broadcast consumer with its own consume timeout; clientId c1 read 2 of queue 0
    r = api.http.put(api.url(f"/admin/consumers/{bcast}"), json={
        "topics": [topic], "mode": "broadcast", "start": "earliest", "consumeTimeoutMs": 45_000})
    assert r.status_code in (200, 201), r.text
    b = fetch(bcast, 2, clientId="c1")
    assert (b["queue"], b["nextOffset"]) == (q0, 2)
    ack(b)
    # paused after reading one record
    api.config(paused, start="earliest")
    pb = fetch(paused, 1)  # queue 0 (the larger backlog), unless its read came back empty: on a
    ack(pb)                # loaded machine a first read of Apache Kafka can, and the next is taken
    paused_com = {q: int(q == pb["queue"]) for q in (q0, q1, q2)}
    api.config(paused, paused=True)
    assert api.message(consumer=paused, topic=topic).json()["status"] == "paused"
    # rate limited to 5/s: the burst (5) is spent on queue 0
    api.config(limited, start="earliest", rateLimit={"messagesPerSecond": 5})
    b = fetch(limited, 10)
    assert len(b["messages"]) == 5
    ack(b)
    bucket = hgetall(rds, f"mqgw:{{{limited}}}:rl")  # nothing changes it before the snapshot
    assert float(bucket["tokens"]) == 0
    wm = hgetall(rds, f"mqgw:{{wm:{topic}}}")
    assert [(wm[f"{q}:lo"], wm[f"{q}:hi"]) for q in (q0, q1, q2)] == [("0", "5"), ("0", "3"), ("0", "0")]

    out = tmp_path / "snaps"
    before = int(time.time() * 1000)
    summary = run_once(redis_url, out, MQGW_BROKER=BROKER_NAME)  # configured as the nodes are
    after = int(time.time() * 1000)
    path = Path(summary["path"])
    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA, check_metadata=True)
    ts = summary["ts"]
    assert before <= ts <= after and set(ts_ms(table)) == {ts}
    check_place(path, out, ts)
    assert summary["rows"] == table.num_rows and summary["bytes"] == path.stat().st_size
    assert sorted(os.listdir(path.parent)) == [path.name]  # no temporary file left

    # The offsets are unchanged since (only the refresh stamps may move: the session's other nodes
    # share this Redis, and their backlog monitors refresh the watermarks of every consumer's
    # topic; a refresh writes `ts` and `vts` together, watermarks_put.lua: CI saw `vts` move).
    now_wm = hgetall(rds, f"mqgw:{{wm:{topic}}}")
    stamps = {"ts", "vts"}
    assert {k: v for k, v in now_wm.items() if k not in stamps} == \
        {k: v for k, v in wm.items() if k not in stamps}

    def expect(group: str, client: str, q: str, mx: int, com: int, **kw: Any) -> dict[str, Any]:
        h = hgetall(rds, f"mqgw:{{{group}}}:q" + (f":{client}" if client else ""))
        lock, acc = int(h.get(f"{topic}:{q}:lock", 0)), int(h.get(f"{topic}:{q}:acc", 0))
        row = {"ts": dt.datetime.fromtimestamp(ts / 1000, UTC), "consumer": group, "client_id": client,
               "mode": "broadcast" if client else "cluster", "broker": BROKER_NAME, "topic": topic,
               "queue": q, "max_offset": mx, "committed_offset": com, "low_watermark": 0,
               "high_watermark": int(wm[f"{q}:hi"]), "lock_age_ms": ts - lock if lock else None,
               "lock_timeout_ms": 60_000, "last_access_ms": acc or None, "paused": False,
               "registered": False, "rate_limit": None, "rate_tokens": None,
               "last_poll_ms": int(h["poll"])}
        row.update(kw)
        return row

    # the token bucket refilled as choose.lua does it: min(burst, tokens + dt * rate / 1000), to
    # Redis' time when the snapshot read it: some moment between `before` and `after` (on a busy
    # machine tens of ms from ts, which at 5/s is tenths of a token: no fixed tolerance holds)
    def refilled(at: int) -> float:
        return min(5, float(bucket["tokens"]) + (at - float(bucket["ts"])) * 5.0 / 1000)

    rate = {"rate_limit": 5.0, "rate_tokens": Between(refilled(before) - 0.01, refilled(after) + 0.01)}
    b_kw = {"lock_timeout_ms": 45_000, "registered": True}
    want = [
        expect(bcast, "c1", q0, 5, 2, **b_kw), expect(bcast, "c1", q1, 3, 0, **b_kw),
        expect(bcast, "c1", q2, 0, 0, **b_kw),
        expect(plain, "", q0, 5, 5), expect(plain, "", q1, 3, 0), expect(plain, "", q2, 0, 0),
        expect(paused, "", q0, 5, paused_com[q0], paused=True),
        expect(paused, "", q1, 3, paused_com[q1], paused=True),
        expect(paused, "", q2, 0, 0, paused=True),
        expect(limited, "", q0, 5, 5, **rate), expect(limited, "", q1, 3, 0, **rate),
        expect(limited, "", q2, 0, 0, **rate),
    ]
    got = rows_of(table, {plain, bcast, paused, limited})
    assert got == sorted(want, key=lambda r: (r["consumer"], r["client_id"], queue_index(r["queue"])))
    # what the test knows without Redis: one held lock, acks leave no lock, untouched queues no access
    held_row = next(r for r in got if r["consumer"] == plain and r["queue"] == q1)
    assert 0 <= held_row["lock_age_ms"] < 60_000
    assert [r["lock_age_ms"] is None for r in got].count(False) == 1
    assert all((r["last_access_ms"] is None) == (r["queue"] != q0) for r in got if r["consumer"] != plain)
    assert all(before - 60_000 < r["last_access_ms"] <= ts for r in got if r["last_access_ms"])
    # every consumer key polled (the paused one too): one poll time per key, on all its rows
    assert all(before - 60_000 < r["last_poll_ms"] <= ts for r in got)
    assert max(r["last_poll_ms"] for r in got if r["consumer"] == paused) > \
        max(r["last_access_ms"] or 0 for r in got if r["consumer"] == paused)
    # the same figures as the gateway's own view
    view = api.http.get(api.url(f"/consumers/{plain}/queues")).json()["queues"]
    assert [(v["maxOffset"], v["committedOffset"]) for v in view] == \
        [(r["max_offset"], r["committed_offset"]) for r in got if r["consumer"] == plain]
    assert api.unlock(held["requestId"]).status_code == 200


# -- (b) Redis Cluster ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_cluster():
    if os.environ.get("REDIS_URL"):
        pytest.skip("external Redis configured; the cluster test starts its own servers")
    c = devstack.start_redis_cluster(3)
    yield c
    c.stop()


@pytest.mark.slow  # Redis Cluster
@pytest.mark.timeout(120)
def test_snapshot_reads_every_primary_of_a_redis_cluster(redis_cluster, bootstrap: str, make_topic,
                                                         tmp_path: Path) -> None:
    from redis.cluster import RedisCluster

    rc = RedisCluster.from_url("redis://" + redis_cluster.url.split("://", 1)[1])
    # consumers whose keys live on each of the three primaries (two per primary)
    per_node: dict[str, list[str]] = {}
    while min((len(v) for v in per_node.values()), default=0) < 2 or len(per_node) < 3:
        g = unique("snapk")
        per_node.setdefault(rc.get_node_from_key(f"mqgw:{{{g}}}:q").name, []).append(g)
    groups = [g for gs in per_node.values() for g in gs[:2]]
    node = start_node(redis_cluster.url, bootstrap, tmp_path)
    try:
        api = Api([node.url])
        topic = make_topic(3)
        for q, n in ((0, 4), (2, 2)):  # one record per request (see the end-to-end test)
            for i in range(n):
                api.produce(topic, [f"v{i}"], partition=q)
        for g in groups:
            api.config(g, start="earliest")
            body = api.message(consumer=g, topic=topic, max=3).json()
            assert api.ack(body["requestId"]).json()["result"] == "committed"
            body = api.message(consumer=g, topic=topic, max=1, clientId="c1").json()  # held
            assert body["status"] == "ok", body
        api.config(groups[0], paused=True)
        out = tmp_path / "snaps"
        summary = run_once(redis_cluster.url, out)
        table = pq.read_table(summary["path"])
        assert table.schema.equals(SCHEMA)
        got = rows_of(table, set(groups))
        assert len(got) == len(groups) * 6  # 3 queues, cluster mode and clientId c1
        for g in groups:
            mine = [r for r in got if r["consumer"] == g]
            for client, path in (("", f"/consumers/{g}/queues"), ("c1", f"/consumers/{g}/clients/c1/queues")):
                view = api.http.get(api.url(path)).json()["queues"]
                rows = [r for r in mine if r["client_id"] == client]
                assert [(r["topic"], r["queue"], r["max_offset"], r["committed_offset"],
                         r["last_access_ms"], r["lock_age_ms"] is not None) for r in rows] == \
                    [(v["topic"], v["queue"], v["maxOffset"], v["committedOffset"], v["lastAccessMs"],
                      v["lockAgeMs"] is not None) for v in view]
            assert [r["committed_offset"] for r in mine if not r["client_id"]] == [3, 0, 0]
            assert [r["lock_age_ms"] is not None for r in mine if r["client_id"]] == [True, False, False]
            assert {r["paused"] for r in mine} == {g == groups[0]}
            assert {r["mode"] for r in mine} == {"cluster", "broadcast"}
            assert {(r["low_watermark"], r["high_watermark"]) for r in mine} == {(0, 4), (0, 0), (0, 2)}
    finally:
        node.stop()
        rc.close()


# -- (c) atomic files -------------------------------------------------------------------------------

def synthetic_rows(n: int, tag: str = "g") -> list[dict[str, Any]]:
    return [{"consumer": f"{tag}-{i // 8}", "client_id": "" if i % 3 else f"c{i % 5}",
             "topic": "orders", "queue": str(i % 8), "max_offset": 1000 + i, "committed_offset": i,
             "low_watermark": 0, "high_watermark": 1000 + i, "lock_age_ms": i % 7 or None,
             "lock_timeout_ms": 60_000, "last_access_ms": 1_700_000_000_000 + i, "paused": i % 11 == 0,
             "registered": i % 2 == 0, "rate_limit": 5.0 if i % 4 == 0 else None,
             "rate_tokens": 2.5 if i % 4 == 0 else None} for i in range(n)]


class SlowFile(io.FileIO):
    """A file that takes its time: each write is small and slow, so a file stays half written
    for a while under its temporary name."""

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        for i in range(0, len(view), 4096):
            time.sleep(0.0005)
            super().write(view[i:i + 4096])
        return len(view)


class Reader(threading.Thread):
    """Lists the directory in a loop and opens every visible file completely."""

    def __init__(self, out: Path) -> None:
        super().__init__(daemon=True)
        self.out, self.stop, self.failures = out, threading.Event(), []
        self.hidden_seen: set[str] = set()
        self.read: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            for d, _, files in os.walk(self.out):
                for f in files:
                    if f.startswith((".", "_")):
                        self.hidden_seen.add(f)
                        continue
                    try:
                        t = pq.read_table(os.path.join(d, f))
                        assert t.schema.equals(SCHEMA) and t.num_rows == 20_000, t.num_rows
                        self.read.add(f)
                    except Exception as e:  # noqa: BLE001 - every failure is the finding
                        self.failures.append((f, repr(e)))


@pytest.mark.timeout(120)
def test_a_reader_never_sees_half_a_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(snap, "_open", lambda p: SlowFile(p, "xb"))
    out = tmp_path / "snaps"
    reader = Reader(out)
    reader.start()
    rows = synthetic_rows(20_000)
    t0 = dt.datetime(2025, 3, 1, 10, 59, 58, tzinfo=UTC)
    written = []
    try:
        for i in range(6):  # across an hour boundary
            written.append(snap.write_snapshot_rows(rows, out, t0 + dt.timedelta(milliseconds=700 * i)))
        time.sleep(0.3)
    finally:
        reader.stop.set()
        reader.join(10)
    assert reader.failures == []
    assert reader.hidden_seen, "the reader never caught a file being written: the test proves nothing"
    assert reader.read == {p.name for p in written}
    assert sorted(p.parent.name for p in written) == ["hour=10"] * 3 + ["hour=11"] * 3
    assert all(not f.startswith(".") for _, _, fs in os.walk(out) for f in fs)
    # the check above does catch a half file: the first half of a real one does not open
    half = out / "half.parquet"
    data = written[0].read_bytes()
    half.write_bytes(data[: len(data) // 2])
    with pytest.raises(pa.ArrowInvalid):
        pq.read_table(half)


@pytest.mark.timeout(60)
def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    class Full(io.FileIO):
        def write(self, b: Any) -> int:
            if self.tell() > 10_000:
                raise OSError(28, "No space left on device")
            return super().write(b)

    monkeypatch.setattr(snap, "_open", lambda p: Full(p, "xb"))
    with pytest.raises(OSError):
        snap.write_snapshot_rows(synthetic_rows(20_000), tmp_path, 1_740_000_000_000)
    assert [f for _, _, fs in os.walk(tmp_path) for f in fs] == []


@pytest.mark.timeout(60)
def test_the_command_removes_writes_abandoned_by_a_killed_writer(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "snaps"
    hour = out / "date=2026-01-01" / "hour=00"
    hour.mkdir(parents=True)
    abandoned = hour / ".snap-20260101T000000000-other-host-4242.parquet.tmp"
    in_progress = hour / ".snap-20260101T000000000-other-host-4343.parquet.tmp"
    not_ours = hour / "notes.tmp"
    for f in (abandoned, in_progress, not_ours):
        f.write_bytes(b"PAR1 half a file")
    two_hours_ago = time.time() - 2 * 3600
    for f in (abandoned, not_ours):
        os.utime(f, (two_hours_ago, two_hours_ago))
    summary = run_once(redis_url, out)
    assert not abandoned.exists()
    assert in_progress.exists()  # recent: may belong to a live writer on another host
    assert not_ours.exists()
    assert Path(summary["path"]).is_file()
    # and the function alone, with an explicit clock
    assert snap.remove_abandoned(out, now=time.time() + 7200) == [in_progress]


def test_write_snapshot_rows_partitions_and_names() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        last_ms_of_2024 = dt.datetime(2024, 12, 31, 23, 59, 59, 999_000, UTC)
        a = snap.write_snapshot_rows(synthetic_rows(3), out, last_ms_of_2024)
        b = snap.write_snapshot_rows(synthetic_rows(3), out, 1_735_689_600_000)  # 2025-01-01T00:00:00Z
        c = snap.write_snapshot_rows([], out, 1_735_689_600_000)  # same name: never replaced
        check_place(a, out, 1_735_689_599_999)
        check_place(b, out, 1_735_689_600_000)
        assert c.name == b.name.replace(".parquet", "-2.parquet") and b.exists()
        t = pq.read_table(a)
        assert t.schema.equals(SCHEMA) and set(ts_ms(t)) == {1_735_689_599_999}
        assert t.to_pylist()[0]["mode"] == "broadcast" and t.to_pylist()[1]["mode"] == "cluster"
        # a whole directory reads as one dataset with the partition columns
        ds = pq.read_table(out)
        assert ds.num_rows == 6 and {"date", "hour"} <= set(ds.schema.names)
        with pytest.raises(ValueError):
            snap.write_snapshot_rows([{"consumer": "x"}], out, 0)  # required columns missing
        with pytest.raises(ValueError):
            snap.write_snapshot_rows([{**synthetic_rows(1)[0], "lag": 3}], out, 0)


def test_parse_interval() -> None:
    assert [snap.parse_interval(s) for s in ("60s", "2m", "500ms", "90", "0.5", "1h")] == \
        [60, 120, 0.5, 90, 0.5, 3600]
    for bad in ("", "0", "0s", "-1s", "5d", "s", "1.5.2"):
        with pytest.raises(ValueError):
            snap.parse_interval(bad)


# -- (d) the --every loop ---------------------------------------------------------------------------

def start_loop(redis_url: str, out: Path, every: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gateway", "snapshot", "--every", every, "--out",
                             str(out), "--redis-url", redis_url, "-v"], cwd=ROOT,
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def parquet_files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*.parquet") if not p.name.startswith("."))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.timeout(60)
def test_every_loop_writes_partitioned_files_and_stops_on_sigterm(redis_url: str, rds: redis.Redis,
                                                                  tmp_path: Path) -> None:
    prefix = unique("snaploop")
    rds.hset(f"{prefix}:{{g1}}:q", mapping={"t:0:max": 9, "t:0:com": 4})
    out = tmp_path / "snaps"
    proc = start_loop(redis_url, out, "300ms", MQGW_KEY_PREFIX=prefix)
    try:
        deadline = time.monotonic() + 30
        while len(parquet_files(out)) < 5 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        stop(proc)
    files = parquet_files(out)
    assert len(files) >= 5
    stamps = []
    for f in files:
        t = pq.read_table(f)
        assert t.schema.equals(SCHEMA)
        rows = [(r["consumer"], r["max_offset"], r["committed_offset"]) for r in t.to_pylist()]
        assert rows == [("g1", 9, 4)]
        (ts,) = set(ts_ms(t))
        check_place(f, out, ts)
        stamps.append(ts)
    stamps.sort()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # every 300 ms: the first sample is at once and later ones never early, so the mean gap is at
    # least the interval whatever the load. The ceiling only tells 300 ms from the 60 s default
    # (test_parse_interval checks the units); samples slowed by a loaded machine stay well below.
    assert all(g > 0 for g in gaps) and 200 <= sum(gaps) / len(gaps) <= 5000, gaps
    assert not [p for p in out.rglob(".*")], "temporary files left behind"
    assert proc.stderr is not None and proc.stderr.read().count("rows in") == len(files)


@pytest.mark.timeout(60)
def test_sigterm_does_not_wait_for_the_next_interval(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "snaps"
    proc = start_loop(redis_url, out, "60s", MQGW_KEY_PREFIX=unique("snapidle"))
    try:
        deadline = time.monotonic() + 30
        while not parquet_files(out) and time.monotonic() < deadline:  # the first sample is at once
            assert proc.poll() is None
            time.sleep(0.05)
        assert len(parquet_files(out)) == 1
        assert pq.read_table(parquet_files(out)[0]).num_rows == 0  # nothing under this prefix
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        # the next sample is 60 s away: stopping well before it (30 s of room) did not wait for it
        assert proc.wait(30) == 0 and time.monotonic() - t0 < 30
    finally:
        stop(proc)


def test_once_fails_when_redis_is_unreachable(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "gateway", "snapshot", "--once", "--out", str(tmp_path),
                        "--redis-url", f"redis://127.0.0.1:{devstack.free_port()}/0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 1 and "sample failed" in p.stderr
    assert parquet_files(tmp_path) == []


# -- (e) SCAN, never KEYS ---------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_reads_with_scan_and_pipelined_hash_reads_never_keys(redis_url: str, rds: redis.Redis,
                                                             tmp_path: Path) -> None:
    prefix = unique("snapmon")
    groups = [f"g{i}" for i in range(1500)]
    pipe = rds.pipeline(transaction=False)
    queue_keys = 0
    for i, g in enumerate(groups):
        clients = [f"{prefix}:{{{g}}}:q:c{j}" for j in range(2)] if i % 5 == 0 else []
        for key in [f"{prefix}:{{{g}}}:q", *clients]:
            pipe.hset(key, mapping={f"t{i % 3}:{q}:{a}": q for q in range(4) for a in ("max", "com", "lock")})
            queue_keys += 1
        if i % 4 == 0:
            pipe.hset(f"{prefix}:{{{g}}}:cfg", mapping={"paused": "1"})
    big = {f"wide:{q}:{a}": q for q in range(1000) for a in ("max", "com")}  # 2000 fields: HSCAN steps
    pipe.hset(f"{prefix}:{{big}}:q", mapping=big)
    for t in ("t0", "t1", "t2"):
        pipe.hset(f"{prefix}:{{wm:{t}}}", mapping={"queues": "0,1,2,3", "0:lo": 0, "0:hi": 5})
    pipe.execute()
    queue_keys += 1
    n_groups = len(groups) + 1
    assert rds.dbsize() > 2 * snap.SCAN_COUNT  # SCAN needs several steps

    with Monitor(redis_url) as mon:
        summary = run_once(redis_url, tmp_path / "snaps", MQGW_KEY_PREFIX=prefix)
    assert summary["queue_keys"] == queue_keys and summary["consumers"] == n_groups
    assert summary["rows"] == (queue_keys - 1) * 4 + 1000
    lines = list(zip(mon.conns, mon.lines, strict=True))  # (client address:port, command)
    assert not [c for _, c in lines if c.split(" ", 1)[0].upper() == "KEYS"]
    ports = {p for p, c in lines if c == "CLIENT SETNAME mqgw-snapshot"}
    assert len(ports) == 1, ports  # one connection did all the reading
    mine = [c for p, c in lines if p in ports]
    verbs = [c.split(" ", 1)[0].upper() for c in mine]
    assert set(verbs) <= {"HELLO", "CLIENT", "SELECT", "PING", "SCAN", "HSCAN", "HGETALL", "SCRIPT",
                          "EVALSHA"}, set(verbs)
    # the rate buckets, refilled to Redis' clock by bucket_level.lua: loaded once, one call each
    assert [c.split(" ", 2)[:2] for c in mine if c.startswith("SCRIPT")] == [["SCRIPT", "LOAD"]]
    assert verbs.count("EVALSHA") == n_groups
    scans = [c for c in mine if c.startswith("SCAN ")]
    assert len(scans) >= 3, scans
    assert all(c.endswith(f"MATCH {prefix}:{{*}}:q* COUNT 1000") for c in scans), scans[:3]
    hscans = [c for c in mine if c.startswith("HSCAN ")]
    first = [c for c in hscans if c.split()[2] == "0"]  # queue hashes, watermarks of t0-t2 and wide
    assert len(first) == queue_keys + 4 and all(c.endswith("COUNT 1000") for c in hscans)
    assert len(hscans) - len(first) >= 1  # the wide hash was read in steps
    assert verbs.count("HGETALL") == n_groups  # cfg of every consumer


@pytest.mark.timeout(60)
def test_collect_in_process_matches_the_files_it_writes(redis_url: str, rds: redis.Redis,
                                                        tmp_path: Path) -> None:
    """``take`` (what the CLI runs) against hand-made hashes, including odd ones it must skip."""
    prefix = unique("snapunit")
    now = int(time.time() * 1000)
    rds.hset(f"{prefix}:{{a}}:q", mapping={"t:0:max": 7, "t:0:com": 2, "t:0:lock": now - 500,
                                          "t:0:acc": now - 500, "t:0:rtok": 3, "t:1:com": 0,
                                          "poll": now - 100,
                                          # read half (deleted between HSCAN rounds): left out
                                          "t:2:max": 5, "t:3:com": 4})
    rds.hset(f"{prefix}:{{a}}:cfg", mapping={"rate": "2.0", "burst": "10", "consume_timeout_ms": "1500"})
    rds.hset(f"{prefix}:{{a}}:rl", mapping={"tokens": "1.5", "ts": str(now - 1000)})
    rds.hset(f"{prefix}:{{b}}:q:host.1", mapping={"u:3:max": 4, "u:3:com": 4})
    rds.hset(f"{prefix}:{{b}}:cfg", mapping={"rate": "3.0"})  # no bucket yet: a full one
    rds.set(f"{prefix}:{{c}}:q", "not a hash")  # matches the pattern, is skipped
    rds.hset(f"{prefix}:{{d}}:q", mapping={"t:0:max": "x"})  # not a number: skipped too
    rds.hset(f"{prefix}:{{c}}:quota", mapping={"x:0:max": 1})  # not a queue hash
    rds.hset(f"{prefix}:{{e}}:q", mapping={"t:0:max": 2**63, "t:0:com": 0})  # past int64: skipped
    rds.hset(f"{prefix}:{{b}}:q", mapping={"u:3:max": 6, "u:3:com": 6})
    rds.hset(f"{prefix}:{{b}}:cfg", mapping={"consume_timeout_ms": "1e30"})  # hand-edited: "never"
    rds.hset(f"{prefix}:{{wm:t}}", mapping={"queues": "0,1", "0:lo": 1, "0:hi": 9, "1:lo": 0, "1:hi": 0})

    async def go() -> dict[str, Any]:
        r = snap.connect(redis_url)
        try:
            return await snap.take(r, tmp_path, prefix, default_timeout_ms=30_000)
        finally:
            await r.aclose()

    summary = asyncio.run(go())
    assert summary["errors"] == 3 and summary["queue_keys"] == 6
    t = pq.read_table(summary["path"])
    ts = summary["ts"]
    rows = [{k: v for k, v in r.items() if k != "ts"} for r in t.to_pylist()]
    # the bucket refilled to Redis' time (read a moment apart from ts): within a few ms of it
    refilled = pytest.approx(min(10, 1.5 + (ts - (now - 1000)) * 2.0 / 1000), abs=0.05)
    assert rows == [
        {"consumer": "a", "client_id": "", "mode": "cluster", "broker": "kafka", "topic": "t", "queue": "0",
         "max_offset": 9, "committed_offset": 2, "low_watermark": 1, "high_watermark": 9,
         "lock_age_ms": ts - (now - 500), "lock_timeout_ms": 1500, "last_access_ms": now - 500,
         "paused": False, "registered": False, "rate_limit": 2.0,
         "rate_tokens": refilled, "last_poll_ms": now - 100},
        {"consumer": "a", "client_id": "", "mode": "cluster", "broker": "kafka", "topic": "t", "queue": "1",
         "max_offset": 0, "committed_offset": 0, "low_watermark": 0, "high_watermark": 0,
         "lock_age_ms": None, "lock_timeout_ms": 1500, "last_access_ms": None,
         "paused": False, "registered": False, "rate_limit": 2.0,
         "rate_tokens": refilled, "last_poll_ms": now - 100},
        {"consumer": "b", "client_id": "", "mode": "cluster", "broker": "kafka", "topic": "u",
         "queue": "3", "max_offset": 6, "committed_offset": 6, "low_watermark": None,
         "high_watermark": None, "lock_age_ms": None, "lock_timeout_ms": 2**63 - 1,
         "last_access_ms": None, "paused": False, "registered": False, "rate_limit": 3.0,
         "rate_tokens": 3.0, "last_poll_ms": None},
        {"consumer": "b", "client_id": "host.1", "mode": "broadcast", "broker": "kafka", "topic": "u",
         "queue": "3", "max_offset": 4, "committed_offset": 4, "low_watermark": None,
         "high_watermark": None, "lock_age_ms": None, "lock_timeout_ms": 2**63 - 1, "last_access_ms": None,
         "paused": False, "registered": False, "rate_limit": 3.0, "rate_tokens": 3.0,
         "last_poll_ms": None},
    ]
