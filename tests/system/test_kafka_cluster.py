"""A 3-broker Apache Kafka cluster (KRaft, replication factor 3, min.insync.replicas 2) under a
produce and fetch→ack load through two gateway nodes: the leader of a busy partition is killed
with SIGKILL and restarted; the whole cluster stops answering for 10 s. Apache Kafka only: the
stand-in broker has no replication."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli import devstack

from ..support import ON_TANSU, Api, Node, start_node, unique

pytestmark = [pytest.mark.skipif(ON_TANSU, reason="replication needs Apache Kafka"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def kcluster() -> Iterator[Any]:
    from gateway.cli import kafka_dist

    c = kafka_dist.start_cluster(3)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def gateway(kcluster: Any, tmp_path: Path) -> Iterator[tuple[Api, list[Node]]]:
    """Two nodes on a Redis of their own, against the cluster; short produce and lock timeouts so
    that answers during an outage come within seconds."""
    rsvc = devstack.start_redis()
    nodes: list[Node] = []
    try:
        nodes = [start_node(rsvc.extra["url"], kcluster.bootstrap, tmp_path, consume_timeout_ms=5000,
                            produce_timeout_ms=5000) for _ in range(2)]
        yield Api([n.url for n in nodes]), nodes
    finally:
        for n in nodes:
            n.stop()
        rsvc.stop()


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(md.topics[topic].partitions[partition].leader)


class Load:
    """One producer and two fetch→ack consumers on random nodes, in threads. Every answer is
    checked: 200, or 503 with Retry-After; anything else is recorded as bad."""

    def __init__(self, api: Api, topic: str, group: str) -> None:
        self.api, self.topic, self.group = api, topic, group
        self.acked: set[str] = set()  # produced and acknowledged by /produce
        self.consumed: set[str] = set()
        self.bad: list[str] = []
        self.unavailable = 0
        self._seq = 0
        self._stop_producing = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._produce, daemon=True)] + [
            threading.Thread(target=self._consume, daemon=True) for _ in range(2)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_producing.set()
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _check(self, r: httpx.Response) -> bool:
        if r.status_code == 200:
            return True
        with self._lock:
            if r.status_code == 503 and r.headers.get("retry-after"):
                self.unavailable += 1
            else:
                self.bad.append(f"{r.status_code} {r.headers.get('retry-after')} {r.text[:200]}")
        time.sleep(0.1)
        return False

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response | None:
        try:
            return self.api.http.request(method, self.api.url(path), timeout=60, **kw)
        except httpx.HTTPError as e:
            with self._lock:
                self.bad.append(f"{path}: {e!r}")
            return None

    def _produce(self) -> None:
        while not self._stop_producing.is_set():
            vals = [str(self._seq + i) for i in range(20)]
            self._seq += 20
            r = self._call("POST", "/produce", json={"topic": self.topic,
                                                      "messages": [{"value": v} for v in vals]})
            if r is None or not self._check(r):
                continue
            ok = [v for v, res in zip(vals, r.json()["results"], strict=True) if "error" not in res]
            with self._lock:
                self.acked.update(ok)
            time.sleep(0.01)

    def _consume(self) -> None:
        while not self._stop.is_set():
            r = self._call("GET", "/message", params={"consumer": self.group, "topic": self.topic,
                                                       "max": 50, "wait_ms": 1000})
            if r is None or not self._check(r):
                continue
            body = r.json()
            if body["status"] != "ok":
                continue
            with self._lock:
                self.consumed.update(m["value"] for m in body["messages"])
            a = self._call("POST", "/ack", json={"requestId": body["requestId"]})
            if a is not None:
                self._check(a)

    def stop_producing(self) -> None:
        self._stop_producing.set()

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, (
                f"timed out waiting for {what}: {len(self.acked)} acked, {len(self.consumed)} "
                f"consumed, {self.unavailable} 503s, bad {self.bad[:3]}")
            time.sleep(0.1)

    def all_delivered(self) -> bool:
        with self._lock:
            return self.acked <= self.consumed


@pytest.mark.timeout(400)
def test_leader_killed_under_load_loses_nothing(kcluster: Any, gateway: tuple[Api, list[Node]]) -> None:
    api, _nodes = gateway
    topic, g = unique("rep"), unique("g")
    devstack.create_topic(kcluster.bootstrap, topic, 3, timeout=60, replication=3)
    api.config(g, start="earliest")
    with Load(api, topic, g) as load:
        load.wait("a running load", lambda: len(load.acked) >= 500 and len(load.consumed) >= 300)
        victim = leader_of(kcluster.bootstrap, topic, 0)
        kcluster.kill(victim)  # SIGKILL: no clean shutdown, no leadership hand-over
        at_kill = (len(load.acked), len(load.consumed))
        load.wait("produce and consume to go on after the election",
                  lambda: len(load.acked) >= at_kill[0] + 500 and len(load.consumed) >= at_kill[1] + 500)
        assert leader_of(kcluster.bootstrap, topic, 0) != victim
        kcluster.start(victim)
        load.wait("more after the restart", lambda: len(load.acked) >= at_kill[0] + 1000)
        load.stop_producing()
        load.wait("every acknowledged record delivered", load.all_delivered, timeout=120)
    assert not load.bad, load.bad[:10]
    assert load.acked <= load.consumed
    print(f"\n{len(load.acked)} acknowledged, all delivered; {load.unavailable} answers were 503")


@pytest.mark.timeout(400)
def test_whole_cluster_outage_answers_503_and_offsets_never_go_back(
        kcluster: Any, gateway: tuple[Api, list[Node]]) -> None:
    api, _nodes = gateway
    topic, g = unique("out"), unique("g")
    devstack.create_topic(kcluster.bootstrap, topic, 3, timeout=60, replication=3)
    api.config(g, start="earliest")

    def committed() -> dict[str, int]:
        r = api.http.get(api.url(f"/consumers/{g}/queues"), timeout=30)
        assert r.status_code == 200, r.text  # the views need only Redis
        return {q["queue"]: q["committedOffset"] for q in r.json()["queues"] if q["topic"] == topic}

    with Load(api, topic, g) as load:
        load.wait("a running load", lambda: len(load.acked) >= 300 and len(load.consumed) >= 200)
        before = committed()
        during = load.unavailable
        kcluster.signal_all(signal.SIGSTOP)  # every broker stops answering, connections stay open
        try:
            # Until a 503 came, 10 s at least: how soon one comes depends on when a request
            # next needs the broker's answer (a metadata look-up times out after 5 s); a fixed
            # 10 s window saw none in 1 run of 4 on a loaded machine.
            deadline = time.monotonic() + 60
            time.sleep(10)
            while load.unavailable == during and time.monotonic() < deadline:
                time.sleep(0.5)
            now = committed()
            assert all(now[q] >= off for q, off in before.items()), (before, now)
        finally:
            kcluster.signal_all(signal.SIGCONT)
        assert load.unavailable > during, "no 503 in 60 s while the whole cluster was away"
        at_resume = len(load.acked)
        load.wait("produce to resume", lambda: len(load.acked) >= at_resume + 300, timeout=120)
        load.stop_producing()
        load.wait("every acknowledged record delivered", load.all_delivered, timeout=120)
    after = committed()
    assert all(after[q] >= off for q, off in before.items()), (before, after)
    assert not load.bad, load.bad[:10]
