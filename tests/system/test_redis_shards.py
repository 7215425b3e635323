"""One consumer group over several Redis Cluster primaries (``shards``, store/shards.py): its
queues and broadcast clientIds live under several hash tags, on different primaries, and the
delivery rules hold as on one: nothing lost, every duplicate flagged, views, resets and deletes
see every shard; a primary that dies is failed over without losing a record.

Real redis-servers joined into a cluster, gateway nodes as uvicorn processes, the real broker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.cli import devstack
from gateway.store.shards import shard_name, shard_of

from ..support import Api, Tally, consume, read_checkpoint, start_node, unique, wait_for

pytestmark = [
    pytest.mark.slow,  # starts Redis Clusters
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
SHARDS = 3


def primaries(cluster: devstack.RedisCluster) -> list[int]:
    out = []
    for n in cluster.nodes:
        role = subprocess.run([CLI, "-p", str(n.port), "role"], capture_output=True, text=True,
                              timeout=5).stdout.split("\n", 1)[0].strip()
        if role == "master":
            out.append(n.port)
    return out


def keys_of(port: int, group: str) -> list[str]:
    """The group's keys (every shard: ``{G}``, ``{G#k...}``) that the primary on ``port`` holds."""
    with redis.Redis(port=port) as r:
        return [k.decode() for k in r.scan_iter(match=f"mqgw:{{{group}*", count=1000)
                if k.decode().startswith((f"mqgw:{{{group}}}", f"mqgw:{{{group}#"))]


@pytest.mark.timeout(240)
def test_one_group_spreads_over_three_primaries(redis_cluster: devstack.RedisCluster,
                                                bootstrap: str, make_topic: Any,
                                                tmp_path: Path) -> None:
    nodes = [start_node(redis_cluster.url, bootstrap, tmp_path, consume_timeout_ms=2000)
             for _ in range(2)]
    try:
        urls = [n.url for n in nodes]
        api = Api(urls)
        topic = make_topic(12)
        group = unique()
        r = api.http.put(api.url(f"/admin/consumers/{group}"),
                         json={"topics": [topic], "start": "earliest", "shards": SHARDS})
        assert r.status_code == 201 and r.json()["shards"] == SHARDS, r.text
        values = [f"v{i}" for i in range(600)]
        for i in range(0, len(values), 100):
            api.produce(topic, values[i:i + 100])
        tally = Tally()
        # batches dropped without an ack come back after the lock timeout, flagged
        asyncio.run(consume(urls, group, topic, len(values), tally, consumers=6, max_messages=10,
                            drop_every=7, deadline_s=150))
        assert set(tally.seen) == set(values), sorted(set(values) - set(tally.seen))[:5]
        assert tally.duplicate_not_redelivered == []
        assert tally.redelivered_batches >= 1
        # the batches dropped last come back once their locks ran out: take and ack them
        deadline = time.monotonic() + 60
        while True:
            body = api.message(consumer=group, topic=topic, max=50, wait_ms=3000).json()
            if body["status"] == "empty":
                break
            assert body["redelivered"] and time.monotonic() < deadline, body
            assert api.ack(body["requestId"]).json()["result"] == "committed"
        # the group's keys sit on every primary
        held = {p: keys_of(p, group) for p in primaries(redis_cluster)}
        assert all(held.values()), held
        rows = api.http.get(api.url(f"/consumers/{group}/queues")).json()["queues"]
        assert len(rows) == 12 and sum(q["committedOffset"] for q in rows) == len(values), rows
        # the count is fixed while offsets exist; REST v2 instances are refused
        r = api.http.patch(api.url(f"/admin/consumers/{group}"), json={"shards": 1})
        assert r.status_code == 409 and r.json()["error"]["code"] == "shards_fixed", r.text
        r = api.http.post(api.url(f"/consumers/{group}"), json={"format": "json"},
                          headers={"Content-Type": "application/vnd.kafka.v2+json"})
        assert r.status_code == 409 and r.json()["error_code"] == 40903, r.text
        # a reset moves the queues of every shard
        r = api.http.post(api.url(f"/admin/consumers/{group}/reset"),
                          json={"topic": topic, "to": "earliest"})
        assert r.status_code == 200, r.text
        rows = api.http.get(api.url(f"/consumers/{group}/queues")).json()["queues"]
        assert sum(q["committedOffset"] for q in rows) == 0
        # unregistering with the offsets leaves nothing on any primary
        out = api.http.delete(api.url(f"/admin/consumers/{group}"),
                              params={"deleteOffsets": "true"}).json()
        assert out["keysDeleted"] >= SHARDS, out
        assert not any(keys_of(p, group) for p in primaries(redis_cluster))
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.timeout(240)
def test_broadcast_client_ids_spread_over_primaries(redis_cluster: devstack.RedisCluster,
                                                    bootstrap: str, make_topic: Any,
                                                    tmp_path: Path) -> None:
    nodes = [start_node(redis_cluster.url, bootstrap, tmp_path) for _ in range(2)]
    try:
        urls = [n.url for n in nodes]
        api = Api(urls)
        topic = make_topic(4)
        group = unique()
        r = api.http.put(api.url(f"/admin/consumers/{group}"),
                         json={"topics": [topic], "mode": "broadcast", "start": "earliest",
                               "shards": SHARDS})
        assert r.status_code == 201, r.text
        values = [f"v{i}" for i in range(40)]
        api.produce(topic, values)
        clients = [f"c{i}" for i in range(6)]
        for c in clients:
            tally = Tally()
            asyncio.run(consume(urls, group, topic, len(values), tally, consumers=2,
                                max_messages=7, client_id=c, deadline_s=60))
            assert set(tally.seen) == set(values) and set(tally.seen.values()) == {1}, c
        listed = api.http.get(api.url(f"/consumers/{group}/clients")).json()
        assert sorted(c["clientId"] for c in listed["clients"]) == clients, listed
        assert sum(bool(keys_of(p, group)) for p in primaries(redis_cluster)) >= 2
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.timeout(300)
def test_a_primary_holding_a_shard_dies_and_nothing_is_lost(bootstrap: str, make_topic: Any,
                                                           tmp_path: Path) -> None:
    """3 primaries with a replica each; the group's shards on all three; one primary is
    SIGKILLed mid-run and its replica promoted: every record is delivered, every duplicate
    flagged (a failover may lose the primary's last writes: choose.lua's era flags them)."""
    cluster = devstack.start_redis_cluster(3, replicas=1, node_timeout_ms=1500)
    nodes = []
    try:
        ports = primaries(cluster)
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes)
        nodes = [start_node(url, bootstrap, tmp_path, consume_timeout_ms=2000) for _ in range(2)]
        urls = [n.url for n in nodes]
        api = Api(urls)
        topic = make_topic(6)
        group = unique()
        r = api.http.put(api.url(f"/admin/consumers/{group}"),
                         json={"topics": [topic], "start": "earliest", "shards": SHARDS})
        assert r.status_code == 201, r.text
        values = [f"v{i}" for i in range(300)]
        api.produce(topic, values)
        tally = Tally()
        spread: dict[int, list[str]] = {}

        async def run() -> None:
            async def kill_soon() -> None:
                while len(tally.seen) < 60:  # noqa: ASYNC110 - the tally has no event to wait on
                    await asyncio.sleep(0.05)
                spread.update({p: keys_of(p, group) for p in ports})
                victim = next(n for n in cluster.nodes if n.port == ports[1])
                os.kill(victim.proc.pid, signal.SIGKILL)
            await asyncio.gather(
                consume(urls, group, topic, len(values), tally, consumers=4, max_messages=10,
                        deadline_s=200, retry_503=True),
                kill_soon())
        asyncio.run(run())
        assert all(spread.values()), spread  # the killed primary held a shard
        assert set(tally.seen) == set(values), sorted(set(values) - set(tally.seen))[:5]
        assert tally.duplicate_not_redelivered == []
        assert len(primaries(cluster)) == 3  # the dead one's replica took its slots
    finally:
        for n in nodes:
            n.stop()
        cluster.stop()


@pytest.mark.timeout(300)
def test_a_cluster_emptied_mid_run_loses_nothing_and_files_every_queue_in_its_shard(
        bootstrap: str, make_topic: Any, tmp_path: Path) -> None:
    """FLUSHALL on every primary in the middle of a run of a group with 3 shards: the registry
    comes back from its copy in the broker (shards included) before any queue is given a
    position again, the positions from the checkpoint, nothing is lost, every duplicate is
    flagged, and each queue is filed again in its own shard (a node still believing 3 shards
    was told "1" by the empty Redis, and asked for the registry's copy first)."""
    cluster = devstack.start_redis_cluster(3)
    nodes = []
    try:
        nodes = [start_node(cluster.url, bootstrap, tmp_path, consume_timeout_ms=2000,
                            checkpoint_interval_ms=300) for _ in range(2)]
        urls = [n.url for n in nodes]
        api = Api(urls)
        parts = 6
        topic, group = make_topic(parts), unique()
        r = api.http.put(api.url(f"/admin/consumers/{group}"),
                         json={"topics": [topic], "start": "earliest", "shards": SHARDS})
        assert r.status_code == 201, r.text
        values = [f"v{i}" for i in range(600)]
        for i in range(0, len(values), 100):
            api.produce(topic, values[i:i + 100])
        ports = primaries(cluster)
        tally = Tally()
        # a third read and acked, its progress checkpointed and the registration copied
        asyncio.run(consume(urls, group, topic, 200, tally, consumers=4, max_messages=10))
        with redis.RedisCluster(host="127.0.0.1", port=ports[0]) as seed:
            wait_for(lambda: not seed.scard("mqgw:{reg}:copy_pending") and sum(read_checkpoint(
                bootstrap, "mqgw." + group, topic, parts).values()) >= 150,
                "the registration's copy and a checkpoint of the progress", timeout=60)
        for p in ports:  # every primary emptied
            with redis.Redis(port=p) as r:
                r.flushall()
        asyncio.run(consume(urls, group, topic, len(values), tally, consumers=4, max_messages=10,
                            deadline_s=200, retry_503=True))
        assert set(tally.seen) == set(values), sorted(set(values) - set(tally.seen))[:5]
        assert tally.duplicate_not_redelivered == []
        assert tally.redelivered_batches > 0  # restored from the checkpoint: below the end, flagged
        assert api.http.get(api.url(f"/admin/consumers/{group}")).json()["shards"] == SHARDS
        # every queue filed again in its own shard only (a shard the run had no need to look at
        # after the loss has no hash)
        everywhere: set[str] = set()
        for k in range(SHARDS):
            key = f"mqgw:{{{shard_name(group, k, SHARDS)}}}:q"
            for p in ports:
                with redis.Redis(port=p) as r:
                    if key in keys_of(p, group):
                        fields = [f.decode() for f in r.hkeys(key)]
                        filed = {f.split(":")[1] for f in fields
                                 if f.count(":") == 2 and f.startswith(topic + ":")}
                        assert all(shard_of(q, SHARDS) == k for q in filed), (k, filed)
                        everywhere |= filed
        assert everywhere, "no queue filed anywhere"
    finally:
        for n in nodes:
            n.stop()
        cluster.stop()
