"""Redis without a single point of failure (issue 34): Sentinel, Redis Cluster with several
seeds, and a failover that lost the last writes.

Real ``redis-server`` processes, real sentinels (``redis-server --sentinel``), gateway nodes as
uvicorn processes. A Redis failover costs seconds of 503 (the clients here send those again, as
a client riding through one would); nothing may be lost and every record delivered a second
time must come flagged ``redelivered``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.cli import devstack

from ..support import LEVELS, Api, Node, Tally, consume, start_node, unique

pytestmark = [
    pytest.mark.slow,  # sentinels take ~5 s to know the replicas, a failover 2-5 s
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def role(port: int) -> str:
    out = subprocess.run([CLI, "-p", str(port), "role"], capture_output=True, text=True,
                         timeout=5).stdout
    return out.split("\n", 1)[0].strip()


def wait_for(what: str, done: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def sentinel() -> Iterator[devstack.RedisSentinel]:
    rs = devstack.start_redis_sentinel(replicas=1, sentinels=3)
    try:
        yield rs
    finally:
        rs.stop()


@pytest.fixture
def nodes_on(bootstrap: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Node] = []

    def make(url: str, n: int = 1, **settings: Any) -> list[Node]:
        for _ in range(n):
            started.append(start_node(url, bootstrap, tmp_path, **settings))
        return started[-n:]
    try:
        yield make
    finally:
        for node in started:
            node.stop()


def promoted(rs: devstack.RedisSentinel, old: int) -> bool:
    try:
        port = rs.primary_port()
    except RuntimeError:
        return False
    return port != old and role(port) == "master"


@pytest.mark.every_broker
@pytest.mark.timeout(300)
def test_a_sentinel_failover_loses_nothing_and_flags_every_duplicate(
        sentinel: devstack.RedisSentinel, nodes_on: Any, make_topic: Any) -> None:
    """Three nodes on ``redis+sentinel://``, a registered consumer whose clients ack, drop and
    hand back batches, delayed records in the wheel; the primary is SIGKILLed mid-run. The
    sentinels promote the replica, the nodes follow it without a restart (the relay too),
    nothing is lost, every duplicate is flagged, and the old primary, started again, rejoins as
    a replica."""
    nodes = nodes_on(sentinel.url, 3, relay="true", delay_levels=LEVELS,
                     delay_topic_prefix=unique("ha"), delay_partitions=2, relay_lock_ms=2000)
    api = Api([n.url for n in nodes])
    topic, group = make_topic(4), unique()
    r = api.http.put(api.url(f"/admin/consumers/{group}"), json={
        "topics": [topic], "mode": "cluster", "start": "earliest", "consumeTimeoutMs": 2000})
    assert r.status_code == 201, r.text
    total, delayed = 3_000, 300
    api.produce(topic, [f"m{i}" for i in range(total - delayed)])
    r = api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": f"d{i}", "delayMs": 1000 + 10 * i} for i in range(delayed)]})  # due 1-4 s on
    assert r.status_code == 200 and r.json()["failed"] == 0, r.text
    tally = Tally()
    old = sentinel.primary_port()

    async def run() -> None:
        task = asyncio.create_task(consume(api.urls, group, topic, total, tally, consumers=6,
                                           max_messages=20, drop_every=13, unlock_every=7,
                                           deadline_s=200, retry_503=True))
        while len(tally.seen) < total * 0.3 and not task.done():  # noqa: ASYNC110 - a counter
            await asyncio.sleep(0.02)
        os.kill(sentinel.server(old).proc.pid, signal.SIGKILL)
        await task
    asyncio.run(run())
    assert promoted(sentinel, old)
    assert len(tally.seen) == total, f"lost {total - len(tally.seen)} messages"
    assert tally.duplicate_not_redelivered == [], tally.duplicate_not_redelivered[:10]
    sentinel.restart(old)  # empty, as a plain server: the sentinels make it a replica
    wait_for("the old primary to rejoin as a replica", lambda: role(old) == "slave", timeout=90)
    print(f"\n{sum(tally.seen.values())} deliveries of {total}; {tally.unavailable} answers were 503")


@pytest.mark.timeout(240)
def test_a_failover_that_lost_the_last_writes_flags_them_and_refuses_stale_acks(
        sentinel: devstack.RedisSentinel, nodes_on: Any, make_topic: Any) -> None:
    """Replication is asynchronous: the replica is paused (SIGSTOP) while batches are acked and
    fetched on the primary, then the primary is killed and the paused replica promoted: its
    commits, locks and tokens are older than what clients were told. Records acked in that
    window come again flagged (before: 40 of 40 unflagged, nothing marked them), the ack of a
    batch fetched then is refused although a new lock of the same offsets took the same place in
    the token sequence (before: taken), and nothing is lost (choose.lua's era: another Redis
    process wrote the hash last)."""
    node = nodes_on(sentinel.url)[0]
    topic, group = make_topic(1), unique()
    with httpx.Client(base_url=node.url, timeout=30) as c:
        def call(method: str, path: str, **kw: Any) -> dict[str, Any]:
            deadline = time.monotonic() + 60
            while True:  # a failover answers 503 for a few seconds
                r = c.request(method, path, **kw)
                if r.status_code != 503:
                    assert r.status_code in (200, 409), r.text
                    return dict(r.json())
                assert time.monotonic() < deadline, r.text
                time.sleep(0.1)

        def fetch() -> dict[str, Any]:
            return call("GET", "/message", params={"consumer": group, "topic": topic, "max": 10,
                                                    "wait_ms": 2000})

        c.patch(f"/admin/consumers/{group}",
                json={"start": "earliest", "consumeTimeoutMs": 60_000}).raise_for_status()
        values = [f"v{i}" for i in range(120)]
        assert c.post("/produce", json={"topic": topic, "messages": [
            {"value": v} for v in values]}).json()["failed"] == 0
        seen: dict[str, int] = {}
        unflagged_again: list[str] = []

        def take(body: dict[str, Any]) -> None:
            for m in body["messages"]:
                if seen.get(m["value"]) and not body["redelivered"]:
                    unflagged_again.append(m["value"])
                seen[m["value"]] = seen.get(m["value"], 0) + 1

        for _ in range(3):  # replicated: v0-v29 acked
            b = fetch()
            take(b)
            assert call("POST", "/ack", json={"requestId": b["requestId"]})["result"] == "committed"
        old = sentinel.primary_port()
        replica = next(s for s in sentinel.servers if s.port != old)
        wait_for("the replica to hold every write", lambda: subprocess.run(
            [CLI, "-p", str(old), "wait", "1", "1000"], capture_output=True, text=True,
            timeout=5).stdout.strip() == "1")
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            # The paused replica's socket buffers take a few MB of the stream still (it would
            # read them after SIGCONT): fill them, so that what follows stays in the primary's
            # memory and dies with it.
            with redis.Redis(port=old) as r:
                r.set("mqgw-test-filler", b"x" * (48 << 20))
            for _ in range(3):  # v30-v59 acked on the primary only
                b = fetch()
                take(b)
                assert call("POST", "/ack", json={"requestId": b["requestId"]})["result"] == \
                    "committed"
            held = fetch()  # v60-v69 fetched, its lock on the primary only
            take(held)
            os.kill(sentinel.server(old).proc.pid, signal.SIGKILL)
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        wait_for("the paused replica's promotion", lambda: promoted(sentinel, old), timeout=90)
        for _ in range(3):  # v30-v59 again (the promoted replica's commits stop at v30)
            b = fetch()
            take(b)
            assert call("POST", "/ack", json={"requestId": b["requestId"]})["result"] == \
                "committed"
        again = fetch()  # v60-v69 again: the same offsets as the held batch, and the 4th lock
        take(again)      # since the last replicated one, as the held batch's was
        late = call("POST", "/ack", json={"requestId": held["requestId"]})
        # Before the token jump, this lock reused the held batch's token: its stale ack committed.
        assert late["result"] == "lock_lost", late
        assert call("POST", "/ack", json={"requestId": again["requestId"]})["result"] == "committed"
        while len(seen) < len(values):
            b = fetch()
            assert b["status"] == "ok", (b, sorted(set(values) - set(seen))[:5])
            take(b)
            assert call("POST", "/ack", json={"requestId": b["requestId"]})["result"] == "committed"
    assert set(seen) == set(values)  # nothing lost
    assert all(seen[f"v{i}"] == 2 for i in range(30, 70)), seen  # the lost window, again
    assert unflagged_again == [], unflagged_again


def _slots_of(port: int) -> list[tuple[int, int]]:
    """The slot ranges the Redis Cluster primary on ``port`` serves."""
    with redis.Redis(port=port) as r:
        return [(int(a), int(b)) for a, b, primary, *_ in r.execute_command("CLUSTER", "SLOTS")
                if int(primary[1]) == port]


@pytest.mark.timeout(240)
def test_a_cluster_url_with_several_seeds_serves_after_its_first_seed_died(
        nodes_on: Any, make_topic: Any) -> None:
    """``redis+cluster://h1:p1,h2:p2`` was refused ("Port could not be cast to integer"), and a
    node started after its one seed was killed failed to start (RedisClusterUnreachableError)
    although the cluster had failed over and was healthy. A cluster of 3 primaries with a
    replica each; the first seed (a primary holding the consumer's slot) is SIGKILLed: the node
    started before goes on, a node started after it starts and serves, nothing is lost."""
    cluster = devstack.start_redis_cluster(3, replicas=1, node_timeout_ms=1500)
    try:
        primaries = [n.port for n in cluster.nodes if role(n.port) == "master"]
        first = primaries[0]
        others = [n.port for n in cluster.nodes if n.port != first]
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in (first, *others))
        ranges = _slots_of(first)
        with redis.Redis(port=first) as r:  # a consumer whose keys live on the first seed
            group = next(g for g in (unique() for _ in range(1000))
                         if any(a <= int(r.execute_command("CLUSTER", "KEYSLOT", g)) <= b
                                for a, b in ranges))
        before = nodes_on(url)[0]
        topic = make_topic(2)
        Api([before.url]).config(group, start="earliest")
        values = [f"v{i}" for i in range(40)]
        Api([before.url]).produce(topic, values)
        seen: set[str] = set()
        unflagged_again: list[str] = []

        def drain(node: Node, upto: int) -> None:
            with httpx.Client(base_url=node.url, timeout=30) as c:
                deadline = time.monotonic() + 60
                while len(seen) < upto:
                    assert time.monotonic() < deadline, sorted(set(values) - seen)[:5]
                    r = c.get("/message", params={"consumer": group, "topic": topic, "max": 5,
                                                  "wait_ms": 1000})
                    if r.status_code == 503:  # the slot's failover
                        time.sleep(0.2)
                        continue
                    body = r.json()
                    assert r.status_code == 200, body
                    if body["status"] == "ok":
                        unflagged_again.extend(m["value"] for m in body["messages"]
                                               if m["value"] in seen and not body["redelivered"])
                        seen.update(m["value"] for m in body["messages"])
                        a = c.post("/ack", json={"requestId": body["requestId"]})
                        assert a.status_code in (200, 409, 503), a.text

        drain(before, 10)
        os.kill(next(n for n in cluster.nodes if n.port == first).proc.pid, signal.SIGKILL)
        wait_for("the replica's promotion", lambda: any(
            role(p) == "master" and _slots_of(p) == ranges for p in others), timeout=60)
        after = nodes_on(url)[0]  # its first seed is dead
        drain(after, 25)
        drain(before, len(values))
        assert seen == set(values)
        assert unflagged_again == [], unflagged_again
    finally:
        cluster.stop()
