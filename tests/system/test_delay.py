"""Delayed records (issue 12): the wheel's arithmetic, delivery on time through several relaying
nodes, a relay killed mid-run, cancel, and bad delays.

Real redis-server, the real broker, gateway nodes as uvicorn processes. Each test gives its nodes
level topics of their own (``delay_topic_prefix``) and fewer levels than the default (20 topics
of 2 partitions instead of 45 of 4), so creating them stays quick on Apache Kafka.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core.wheel import DEFAULT_LEVELS_MS, Wheel, parse_levels

from ..support import HMAC_KEY, LEVELS, ON_ROCKETMQ, TEST_BROKER, Node, start_node, topic_queues, unique

#: the broker adapter itself: run on every broker (tests/conftest.py)
pytestmark = pytest.mark.every_broker

YEAR_MS = 365 * 24 * 3600 * 1000


# -- the arithmetic, without waiting -----------------------------------------------------------

@pytest.mark.parametrize("levels", [DEFAULT_LEVELS_MS, parse_levels(LEVELS)])
def test_levels_never_overshoot_and_leave_less_than_the_smallest(levels: tuple[int, ...]) -> None:
    w = Wheel(levels)
    rng = random.Random(7)
    delays = [1, 99, 100, 101, 999, 1000, 29_999, 30_000, 86_400_000, 2 * YEAR_MS,
              *(rng.randrange(1, 2 * YEAR_MS) for _ in range(300)),
              *(rng.randrange(1, 30_000) for _ in range(300))]
    for d in delays:
        loops, hops = w.plan(d)
        travelled = loops * levels[-1] + sum(hops)
        assert travelled <= d, d  # never early
        assert d - travelled < w.smallest, d  # what is left is waited out in memory: < 100 ms
        assert all(h in levels for h in hops)
        assert all(a >= b for a, b in itertools.pairwise(hops)), (d, hops)  # hops only shrink
        assert len(hops) <= 1 + 9 * len(levels), d
        assert loops == max(0, d // levels[-1] - 1)
    if levels == DEFAULT_LEVELS_MS:
        assert w.plan(29_700) == (0, [20_000, 9_000, 700])  # one hop per decimal digit
        loops, hops = w.plan(2 * YEAR_MS)
        assert loops + len(hops) < 7_100  # a loop per 2.5 h, then the digits
        assert w.plan(86_400_000) == (8, [9_000_000, 5_000_000, 400_000])  # a day: 11 hops


def test_ready_at_and_level_choice() -> None:
    w = Wheel((100, 1000, 10_000))
    assert w.level_for(99) is None and w.level_for(100) == 100 and w.level_for(9_999) == 1000
    assert w.level_for(10 ** 12) == 10_000  # longer than the top: loop on it
    assert w.ready_at(hop_due=5000, due=5050) == 5050  # less than 100 ms left then: wait for due
    assert w.ready_at(hop_due=5000, due=5000) == 5000
    assert w.ready_at(hop_due=5000, due=4000) == 5000  # late already: at once
    assert w.ready_at(hop_due=5000, due=9000) == 5000  # next hop at the hop due
    assert w.topics()[0] == "mqgw.delay.100ms"
    with pytest.raises(ValueError):
        parse_levels("0ms")
    with pytest.raises(ValueError):
        parse_levels("soon")


# -- end to end ------------------------------------------------------------------------------

def _nodes(redis_url: str, bootstrap: str, tmp: Path, n: int, prefix: str, **kw: Any) -> list[Node]:
    settings = {"relay": "true", "delay_levels": LEVELS, "delay_topic_prefix": prefix,
                "delay_partitions": 2, "relay_lock_ms": 2000, **kw}
    return [start_node(redis_url, bootstrap, tmp, **settings) for _ in range(n)]


class Collector:
    """Consumers on every node, recording when each value arrived (time.time() ms)."""

    def __init__(self, urls: list[str], topic: str, group: str, threads: int = 4) -> None:
        self.arrived: dict[str, list[int]] = {}
        self.written: dict[str, int] = {}  # the record's timestamp: when the relay wrote it
        self.due: dict[str, int] = {}  # its mqgw-delay-due header
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.polled = 0  # threads that had an answer: the group's start position is taken
        self.threads = [threading.Thread(target=self._run, args=(urls[i % len(urls)], topic, group),
                                         daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, url: str, topic: str, group: str) -> None:
        with httpx.Client(timeout=10) as http:
            ack = ""
            first = True
            while not self.stop.is_set():
                params = {"topic": topic, "consumer": group, "max": 200, "wait_ms": 300}
                if ack:
                    params["requestId"] = ack
                try:
                    r = http.get(f"{url}/message", params=params)
                except httpx.HTTPError:
                    ack = ""
                    time.sleep(0.05)
                    continue
                now = int(time.time() * 1000)
                ack = ""
                if r.status_code != 200:
                    time.sleep(0.05)
                    continue
                body = r.json()
                with self.lock:
                    self.polled += first
                    first = False
                    for m in body.get("messages", []):
                        self.arrived.setdefault(m["value"], []).append(now)
                        self.written[m["value"]] = m.get("timestamp", -1)
                        for name, value in m.get("headers") or []:
                            if name == "mqgw-delay-due":
                                self.due[m["value"]] = int(value)
                ack = body.get("requestId", "")

    def wait_polled(self, timeout_s: float = 60) -> None:
        """Until every thread had an answer: the group's start (latest) is taken, so records
        written from now on are all read. A first /message can take seconds on a loaded machine
        (a fresh Kafka loads its group coordinator), and a record written before it is behind
        the start: with no wait, the first records (due 200 and 260 ms after the produce) were
        never read (Tansu, load ~15)."""
        deadline = time.monotonic() + timeout_s
        while self.polled < len(self.threads):
            assert time.monotonic() < deadline, f"{self.polled} of {len(self.threads)} consumers answered"
            time.sleep(0.05)

    def wait_for(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.arrived) < n:
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def _produce_delayed(url: str, topic: str, delays: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Produce ``{value: delayMs}`` in batches; returns ``{value: {delayId, deliverAt}}``."""
    out: dict[str, dict[str, Any]] = {}
    items = list(delays.items())
    with httpx.Client(timeout=30) as http:
        for i in range(0, len(items), 250):
            chunk = items[i:i + 250]
            r = http.post(f"{url}/produce", json={"topic": topic, "messages": [
                {"value": v, "delayMs": d} for v, d in chunk]})
            assert r.status_code == 200, r.text
            for (v, _), res in zip(chunk, r.json()["results"], strict=True):
                assert "error" not in res, res
                out[v] = res
    return out


@pytest.mark.slow
def test_a_relaying_node_serves_once_its_level_topics_exist(
        redis_url: str, bootstrap: str, tmp_path: Path) -> None:
    """The level topics are made before a relaying node serves (DelayService.start). Before, the
    relay began making them as the node started serving: its first delayed produce waited for
    them (1.3-3.8 s on Apache Kafka under load), a record due within that wait went straight to
    its topic during the request, and a consumer started after the answer (at 'latest') never
    saw it (the repro failed 5 times in 9 so)."""
    prefix = unique("dr") + "."
    levels = "100ms,300ms,1s"
    node, = _nodes(redis_url, bootstrap, tmp_path, 1, prefix, delay_levels=levels)
    try:  # looked at right after /healthz answered (start_node): no waiting here
        listed = topic_queues(bootstrap)
        for t in Wheel(parse_levels(levels), prefix).topics():
            assert listed.get(t) == 2, (t, sorted(listed))
    finally:
        node.stop()


@pytest.mark.slow
def test_delayed_records_arrive_on_time_through_several_nodes(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(4)
    nodes = _nodes(redis_url, bootstrap, tmp_path, 2, unique("dl") + ".")
    group = unique("late")
    coll = Collector([n.url for n in nodes], topic, group)
    try:
        coll.wait_polled()  # start=latest is taken before the first record
        rng = random.Random(12)
        total = 5000
        delays = {f"v{i}": rng.randrange(0, 30_000) for i in range(total)}
        produced: dict[str, dict[str, Any]] = {}
        half = dict(list(delays.items())[:total // 2]), dict(list(delays.items())[total // 2:])
        threads = [threading.Thread(target=lambda d, u: produced.update(_produce_delayed(u, topic, d)),
                                    args=(half[i], nodes[i].url)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(produced) == total
        coll.wait_for(total, 60)
    finally:
        coll.close()
        for n in nodes:
            n.stop()
    missing = [v for v in delays if v not in coll.arrived]
    assert not missing, f"{len(missing)} never arrived, e.g. {missing[:5]}"
    late: list[int] = []
    for v, res in produced.items():
        due = res.get("deliverAt")
        first = min(coll.arrived[v])
        if due is None:  # delayMs 0: written at once
            continue
        assert first >= due, (v, first - due)  # never before its due time
        assert coll.due[v] == due  # and it says when it was due
        late.append(first - due)
    # Lateness: when the relay wrote the record to its topic (the record's timestamp, the
    # producer's clock on this machine) after its due time; and when a consumer got it.
    written = sorted(coll.written[v] - res["deliverAt"] for v, res in produced.items() if "deliverAt" in res)
    assert written[0] >= 0, written[0]
    late.sort()
    print(f"lateness over {len(late)} delayed records, written: p50 {pct(written, 50)} ms, "
          f"p99 {pct(written, 99)} ms, max {written[-1]} ms; received: p50 {pct(late, 50)} ms, "
          f"p99 {pct(late, 99)} ms, max {late[-1]} ms")
    # How late is a measurement, not a rule load cannot break: the target (250 ms at p99) is
    # measured by `make bench` (bench/delay.py; BENCHMARKS.md has the distribution). A p99 bound
    # here failed at load 12 on 2 cores (2.4 s). Only a relay that stalls is caught: 30 s.
    assert pct(written, 99) < 30_000, written[-50:]


def pct(sorted_ms: list[int], p: int) -> int:
    return sorted_ms[min(len(sorted_ms) - 1, len(sorted_ms) * p // 100)]


@pytest.mark.slow
def test_relay_killed_mid_run_loses_nothing(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    """Two nodes relay, and `mqgw relay` on its own as a third; the latter is SIGKILLed while it
    holds level queues: they are taken over when its locks expire (relay_lock_ms), nothing is
    lost and nothing comes early."""
    topic = make_topic(2)
    prefix = unique("dk") + "."
    nodes = _nodes(redis_url, bootstrap, tmp_path, 2, prefix)
    env = {**os.environ, "MQGW_REDIS_URL": redis_url, "MQGW_KAFKA_BOOTSTRAP": bootstrap,
           "MQGW_HMAC_KEY": HMAC_KEY, "MQGW_DELAY_LEVELS": LEVELS, "MQGW_DELAY_TOPIC_PREFIX": prefix,
           "MQGW_DELAY_PARTITIONS": "2", "MQGW_RELAY_LOCK_MS": "2000", "MQGW_METADATA_REFRESH_MS": "100"}
    log = open(tmp_path / "relay.log", "wb")  # noqa: SIM115 - closed below, after the process
    alone = subprocess.Popen([sys.executable, "-m", "gateway", "relay"], env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    group = unique("kill")
    coll = Collector([n.url for n in nodes], topic, group)
    try:
        deadline = time.monotonic() + 30
        while b"Ctrl-C stops" not in (tmp_path / "relay.log").read_bytes():
            assert alone.poll() is None and time.monotonic() < deadline, (tmp_path / "relay.log").read_text()
            time.sleep(0.1)
        time.sleep(1)
        rng = random.Random(3)
        delays = {f"k{i}": rng.randrange(200, 8_000) for i in range(1500)}
        produced = _produce_delayed(nodes[0].url, topic, delays)
        time.sleep(2)  # the three relays are moving records
        os.killpg(alone.pid, signal.SIGKILL)
        alone.wait(10)
        coll.wait_for(len(delays), 60)
    finally:
        coll.close()
        if alone.poll() is None:
            os.killpg(alone.pid, signal.SIGKILL)
            alone.wait(10)
        log.close()
        for n in nodes:
            n.stop()
    missing = [v for v in delays if v not in coll.arrived]
    assert not missing, f"{len(missing)} never arrived, e.g. {missing[:5]}"
    early = [v for v, res in produced.items() if min(coll.arrived[v]) < res["deliverAt"]]
    assert not early, early[:5]
    duplicates = sum(len(t) - 1 for t in coll.arrived.values())
    print(f"{duplicates} duplicates after the kill (the killed relay's sends that it had not committed)")
    if TEST_BROKER == "kafka":  # each hop a transaction: the killed relay's open one is aborted
        assert duplicates == 0, f"{duplicates} records delivered twice"


def test_cancel_before_and_after_the_due_time(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(1)
    node, = _nodes(redis_url, bootstrap, tmp_path, 1, unique("dc") + ".")
    group = unique("cancel")
    coll = Collector([node.url], topic, group, threads=1)
    try:
        time.sleep(1)
        with httpx.Client(timeout=30) as http:
            r = http.post(f"{node.url}/produce", json={"topic": topic, "messages": [
                # 3 s: a cancel must come delay_cancel_cutoff_ms (1 s) before the due time
                {"value": "keep", "delayMs": 3000}, {"value": "drop", "delayMs": 3000},
                {"value": "now"}]})
            assert r.status_code == 200, r.text
            keep, drop, now = r.json()["results"]
            assert "offset" in now and "delayId" not in now
            assert keep["deliverAt"] > time.time() * 1000
            for padded in (f"{drop['delayId']}=", f"{drop['delayId']}=="):  # one spelling per id
                r = http.delete(f"{node.url}/delayed/{padded}")
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_delay_id", r.text
            r = http.delete(f"{node.url}/delayed/{drop['delayId']}")
            assert r.status_code == 200, r.text
            assert r.json() == {"result": "cancelled", "delayId": drop["delayId"],
                                "deliverAt": drop["deliverAt"], "topic": topic,
                                "alreadyCancelled": False}
            again = http.delete(f"{node.url}/delayed/{drop['delayId']}")  # again: fine, and said
            # the wheel's mark tells a second cancel; RocketMQ's own timers (the broker holds
            # the record) answer a recall alike either time: always false there
            assert again.status_code == 200 and again.json()["alreadyCancelled"] is (not ON_ROCKETMQ)
            coll.wait_for(2, 30)
            assert set(coll.arrived) == {"keep", "now"}
            r = http.delete(f"{node.url}/delayed/{keep['delayId']}")
            assert r.status_code == 409 and r.json()["error"]["code"] == "already_delivered", r.text
            time.sleep(1)  # the cancelled one stays cancelled after its due time
            assert "drop" not in coll.arrived
            forged = keep["delayId"][:-2] + ("AA" if not keep["delayId"].endswith("AA") else "BB")
            r = http.delete(f"{node.url}/delayed/{forged}")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_delay_id", r.text
            r = http.delete(f"{node.url}/delayed/garbage")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_delay_id", r.text
    finally:
        coll.close()
        node.stop()


def test_bad_delays_are_refused_with_a_code(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(1)
    node = start_node(redis_url, bootstrap, tmp_path)  # refused before any relay matters
    try:
        # The whole table of refused delays is proven in process (tests/unit/test_produce_wire.py);
        # over HTTP, one case of each code: a 400 with the code, through a real node.
        cases: list[tuple[dict[str, Any], str]] = [
            ({"value": "x", "delayMs": -1}, "invalid_delay"),
            ({"value": "x", "deliverAt": "2026-11-25T20:00:00"}, "invalid_deliver_at"),  # no offset
            ({"messages": [{"value": "x"}], "delayMs": 5, "deliverAt": 10}, "conflicting_delay"),
            ({"messages": [{"value": "x", "deliverAt": 1_795_636_800.0}]}, "deliver_at_in_seconds"),
        ]
        with httpx.Client(timeout=10) as http:
            for body, code in cases:
                r = http.post(f"{node.url}/produce", json={"topic": topic, **body})
                assert r.status_code == 400, (body, r.text)
                assert r.json()["error"]["code"] == code, (body, r.text)
            seconds = http.post(f"{node.url}/produce", json={"topic": topic, "value": "x",
                                                             "deliverAt": 1_795_636_800})
            assert "milliseconds" in seconds.json()["error"]["message"]
            assert "1795636800000" in seconds.json()["error"]["message"]
            # 0 and a past deliverAt are written at once, as a plain produce; RFC 3339 allows
            # a lower-case t and z, and a leap second (before, both were refused)
            r = http.post(f"{node.url}/produce", json={"topic": topic, "messages": [
                {"value": "a", "delayMs": 0}, {"value": "b", "deliverAt": "2001-01-01T00:00:00Z"},
                {"value": "c", "deliverAt": 10 ** 11}, {"value": "d", "deliverAt": "2001-01-01t00:00:00z"},
                {"value": "e", "deliverAt": "2016-12-31T23:59:60Z"}]})
            assert r.status_code == 200, r.text
            assert all("offset" in x for x in r.json()["results"]), r.text
    finally:
        node.stop()


@pytest.mark.slow
def test_delivered_records_leave_nothing_in_redis(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    """Redis holds per delayed record only what is pending: a delivered record (straight or
    through a nack's retry, both through the wheel) leaves no key, a cancel leaves one mark, and
    a cancel inside the cutoff before the due time is refused (it could race the delivery).
    Before: one ``{delay}:m:<id>`` key per delivered record, kept 7 days (~945,000 keys an hour
    under a steady 200 delayed records/s)."""
    import redis as redis_lib

    topic = make_topic(1)
    prefix = unique("km")
    node, = _nodes(redis_url, bootstrap, tmp_path, 1, unique("dm") + ".", key_prefix=prefix)
    rds = redis_lib.Redis.from_url(redis_url)
    group = unique("marks")
    try:
        with httpx.Client(timeout=30) as http:
            # The consumer's start (latest) is taken before the first record: the first are due
            # 150 ms after the produce, sooner than its answer may come on a loaded machine.
            r = http.get(f"{node.url}/message", params={"topic": topic, "consumer": group,
                                                         "wait_ms": 0})
            assert r.status_code == 200, r.text
            values = [f"v{i}" for i in range(30)]
            r = http.post(f"{node.url}/produce", json={"topic": topic, "messages": [
                *({"value": v, "delayMs": 150 + 40 * i} for i, v in enumerate(values)),
                {"value": "cancelled", "delayMs": 60_000}, {"value": "close", "delayMs": 700}]})
            assert r.status_code == 200, r.text
            *_, cancelled, close = r.json()["results"]
            assert http.delete(f"{node.url}/delayed/{cancelled['delayId']}").status_code == 200
            r = http.delete(f"{node.url}/delayed/{close['delayId']}")  # due within the cutoff
            assert r.status_code == 409 and r.json()["error"]["code"] == "already_delivered", r.text
            got: list[str] = []
            nacked = False
            deadline = time.monotonic() + 60
            while len(set(got)) < len(values) + 1 and time.monotonic() < deadline:
                r = http.get(f"{node.url}/message", params={
                    "topic": topic, "consumer": group, "max": 50, "wait_ms": 500})
                assert r.status_code == 200, r.text
                body = r.json()
                msgs = body.get("messages", [])
                if msgs and not nacked:  # the first batch goes round the retry path once
                    r = http.post(f"{node.url}/nack", json={"requestId": body["requestId"],
                                                           "delayMs": 200})
                    assert r.status_code == 200, r.text
                    nacked = True
                    continue
                got += [m["value"] for m in msgs]
                if msgs:
                    http.post(f"{node.url}/ack", json={"requestId": body["requestId"]})
            assert sorted(set(got)) == sorted([*values, "close"]), got
        marks = list(rds.scan_iter(match=f"{prefix}:{{delay}}:m:*", count=1000))
        assert marks == [f"{prefix}:{{delay}}:m:{cancelled['delayId']}".encode()], marks
    finally:
        rds.close()
        node.stop()


def _checkpointed(rds: Any, consumer: str) -> bool:
    """Every queue of the consumer's hash has its committed offset in the broker's checkpoint."""
    h = {k.decode(): v for k, v in rds.hgetall(f"mqgw:{{{consumer}}}:q").items()}
    coms = {k[:-4]: v for k, v in h.items() if k.endswith(":com")}
    return bool(coms) and all(h.get(f"{q}:ckp") == v for q, v in coms.items())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_redis_lost_the_relay_resumes_where_it_was(
        bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    """The relay's positions in the level topics are checkpointed like a consumer's: a Redis
    emptied after delayed records were delivered delivers none of them again. Before: the relay
    started every level at its earliest retained record and delivered them all a second time."""
    import redis as redis_lib

    from gateway.cli import devstack

    svc = devstack.start_redis()
    url = svc.extra["url"]
    rds = redis_lib.Redis.from_url(url)
    topic = make_topic(1)
    node, = _nodes(url, bootstrap, tmp_path, 1, unique("dr") + ".", checkpoint_interval_ms=300)
    group = unique("relayloss")
    coll = Collector([node.url], topic, group, threads=1)
    try:
        coll.wait_polled()  # start=latest is taken before the first record
        first = {f"a{i}": 200 + 60 * i for i in range(20)}
        _produce_delayed(node.url, topic, first)
        coll.wait_for(len(first), 60)
        assert set(coll.arrived) == set(first)
        deadline = time.monotonic() + 60
        while not (_checkpointed(rds, "_mqgw.relay") and _checkpointed(rds, group)):
            assert time.monotonic() < deadline, "the relay's and the consumer's checkpoints"
            time.sleep(0.1)
        rds.flushall()
        second = {f"b{i}": 300 for i in range(10)}
        _produce_delayed(node.url, topic, second)
        coll.wait_for(len(first) + len(second), 60)
        assert set(second) <= set(coll.arrived)
        time.sleep(1)  # room for duplicates to show
        twice = sorted(v for v, times in coll.arrived.items() if len(times) > 1)
        assert not twice, f"delivered again after the Redis loss: {twice}"
    finally:
        coll.close()
        node.stop()
        rds.close()
        svc.stop()


def _delivered(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """Each value in ``topic`` as read_committed readers (every gateway read) see it, counted."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("count"),
                  "enable.auto.commit": False, "isolation.level": "read_committed",
                  "enable.partition.eof": True, "log_level": 0})
    counts: dict[str, int] = {}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        deadline = time.monotonic() + 60
        while len(ended) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                ended.add(m.partition())
                continue
            v = (m.value() or b"").decode()
            counts[v] = counts.get(v, 0) + 1
    finally:
        c.close()
    return counts


@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.skipif(TEST_BROKER != "kafka",
                    reason="exactly-once hops are Kafka transactions (the Apache Kafka pass)")
def test_stalled_relays_write_each_delayed_record_once(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    """Issue 33: a relay whose lock (``relay_lock_ms``) ran out while a hop was in flight saw
    its queue taken over, and both wrote the hop: 412 of 2,930 delayed records written 2-5 times
    under load, up to 53 copies with a 300 ms lock. Two relaying nodes here with a 400 ms lock,
    each SIGSTOPped for 1.5 s in turn while they move 1,500 records (the stall a GC pause or a
    starved host makes): with each hop a Kafka transaction that fences the stalled relay, every
    record is written to its topic once. (With ``relay_exactly_once`` off the same run wrote
    some records twice: see BENCHMARKS.md.)"""
    topic = make_topic(2)
    prefix = unique("eo") + "."
    nodes = _nodes(redis_url, bootstrap, tmp_path, 2, prefix, relay_lock_ms=400)
    try:
        rng = random.Random(5)
        delays = {f"e{i}": rng.randrange(300, 7_000) for i in range(1500)}
        produced = _produce_delayed(nodes[0].url, topic, delays)
        for n in (*nodes, *nodes):  # stall each twice while hops are in flight
            os.killpg(n.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(1.5)
            finally:
                os.killpg(n.proc.pid, signal.SIGCONT)
            time.sleep(0.3)
        deadline = time.monotonic() + 120
        while True:
            counts = _delivered(bootstrap, topic, 2)
            if len(counts) >= len(delays) or time.monotonic() > deadline:
                break
            time.sleep(1)
        time.sleep(3)  # a late second copy would be written by now
        counts = _delivered(bootstrap, topic, 2)
    finally:
        for n in nodes:
            n.stop()
    missing = [v for v in delays if v not in counts]
    assert not missing, f"{len(missing)} never arrived, e.g. {missing[:5]}"
    twice = {v: n for v, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} of {len(delays)} written more than once, e.g. {list(twice.items())[:5]}"
    assert len(produced) == len(delays)
