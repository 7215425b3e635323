"""Idle gateway nodes cost the broker next to nothing (issue 10).

Before: every pooled fetch consumer stayed assigned to the partition it last read, and an
assigned consumer at the end of its partition asks the broker for more every
``fetch.wait.max.ms`` (10 ms). Two idle nodes kept the broker at ~41 % of a core, three at 63 %
(bench/idle.py), with no client at all. Now a consumer unused for ``PARK_AFTER_S`` gives its
partition up.

The broker here is a Tansu of this test's own, so that the nodes of other tests (the session's
cluster) are not counted; its CPU is its own process's, which other load on the machine does
not raise.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from gateway.broker.kafka.fetch import PARK_AFTER_S
from gateway.cli import devstack

from ..support import ON_ROCKETMQ, TLS, start_node, unique

#: the broker adapter itself: run on every broker (tests/conftest.py)
pytestmark = [pytest.mark.every_broker, pytest.mark.skipif(
    ON_ROCKETMQ, reason="the Kafka adapter's pooled consumers (a RocketMQ pull is made per fetch "
    "and nothing polls the broker while idle)")]

PARTITIONS = 8


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # SC_CLK_TCK is 100 on Linux


def test_idle_nodes_leave_the_broker_idle(redis_url: str, tmp_path: Path) -> None:
    broker = devstack.start_broker()
    nodes = []
    try:
        bs = broker.extra["bootstrap"]
        topic = unique("idle")
        devstack.create_topic(bs, topic, PARTITIONS)
        nodes = [start_node(redis_url, bs, tmp_path, workers=2, start_position="earliest")
                 for _ in range(2)]
        group = unique("idle")
        with httpx.Client(timeout=30, verify=TLS) as http:
            msgs = [{"value": str(i), "partition": i % PARTITIONS} for i in range(PARTITIONS * 4)]
            r = http.post(f"{nodes[0].url}/produce", json={"topic": topic, "messages": msgs})
            assert r.status_code == 200, r.text
            got = 0
            for i in range(PARTITIONS * 8):  # warm every worker's fetch pool on both nodes
                r = http.get(f"{nodes[i % 2].url}/message",
                             params={"topic": topic, "consumer": group, "max": 2, "wait_ms": 0})
                assert r.status_code == 200, r.text
                body = r.json()
                if body.get("requestId"):
                    got += len(body["messages"])
                    assert http.post(f"{nodes[i % 2].url}/ack",
                                     json={"requestId": body["requestId"]}).status_code == 200
            assert got > 0
        time.sleep(PARK_AFTER_S * 2)  # the consumers park after PARK_AFTER_S unused
        before, t0 = _cpu_s(broker.proc.pid), time.monotonic()
        time.sleep(3)
        share = (_cpu_s(broker.proc.pid) - before) / (time.monotonic() - t0)
        # Measured: 0.7 % of a core for 3 idle nodes now; 20-30 % per node before.
        assert share < 0.08, f"the broker used {share:.0%} of a core while every node was idle"
    finally:
        for n in nodes:
            n.stop()
        broker.stop()
