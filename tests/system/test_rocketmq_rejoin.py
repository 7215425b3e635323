"""A RocketMQ broker that dropped out of its name server and came back: nodes serve again within
seconds, by themselves (issue 32's RocketMQ case, ``make chaos``).

RocketMQ's equivalent of a fenced Kafka broker: the name server forgets a broker whose
heartbeats stop (the broker SIGSTOPped: a GC pause, a stalled host), and routes then name no
broker for its topics; once it runs again it registers anew. Timings shortened through
settings so that the fault is made on purpose and soon: the broker sends a heartbeat every
500 ms and is dropped after 3 s without one (``brokerNotActiveTimeoutMillis``, which the name
server applies to brokers that heartbeat: ``enableSlaveActingMaster``; without it the name
server waits 120 s), the name server scans every second. Measured: dropped 3.3 s after SIGSTOP,
registered again ~22 s after SIGCONT (its registration period, at least 10 s). A RocketMQ of
the test's own: the session's is shared with other tests."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..support import ON_ROCKETMQ, TLS, serves, start_node, unique, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.rocketmq, pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(not ON_ROCKETMQ or bool(os.environ.get("ROCKETMQ_NAMESRV")),
                                 reason="starts a RocketMQ of its own (the RocketMQ pass)")]

#: How soon a node must serve again once the name server lists the broker again (issue 32).
RECOVERY_S = 10.0


@pytest.fixture
def mq() -> Iterator[Any]:
    from gateway.cli.rocketmq_dist import start_rocketmq

    m = start_rocketmq(namesrv_settings={"scanNotActiveBrokerInterval": 1000},
                       enableSlaveActingMaster="true", brokerHeartbeatInterval=500,
                       brokerNotActiveTimeoutMillis=3000)
    try:
        yield m
    finally:
        m.stop()


def _listed(namesrv: str) -> bool:
    from gateway.cli.rocketmq_dist import BROKER_NAME, broker_addrs

    try:
        return bool(broker_addrs(namesrv).get(BROKER_NAME))
    except Exception:  # noqa: BLE001 - a name server that does not answer lists nothing we know
        return False


def test_nodes_serve_again_after_the_broker_left_the_name_server(mq: Any, redis_url: str,
                                                                 tmp_path: Path) -> None:
    from gateway.cli.rocketmq_dist import create_topic

    topic = unique("rejoin")
    create_topic(mq.namesrv, topic, 2)
    node = start_node(redis_url, mq.namesrv, tmp_path, start_position="earliest")
    group = unique("rejoin")
    statuses: dict[int, int] = {}
    stop = threading.Event()

    def traffic() -> None:  # clients calling all along: an outage is 503, never 404
        with httpx.Client(timeout=15, verify=TLS) as http:
            while not stop.is_set():
                try:
                    code = http.get(f"{node.url}/message", params={
                        "consumer": unique("t"), "topic": topic, "wait_ms": 200}).status_code
                except httpx.HTTPError:
                    code = 0
                statuses[code] = statuses.get(code, 0) + 1
                stop.wait(0.05)

    try:
        with httpx.Client(timeout=15, verify=TLS) as http:
            wait_for(lambda: serves(http, node, topic, group), "the node to serve", timeout=60)
            t = threading.Thread(target=traffic, daemon=True)
            t.start()
            try:
                assert mq.broker is not None
                os.killpg(mq.broker.pid, signal.SIGSTOP)
                try:
                    wait_for(lambda: not _listed(mq.namesrv), "the name server to drop the broker",
                             timeout=120)
                finally:
                    os.killpg(mq.broker.pid, signal.SIGCONT)
                wait_for(lambda: _listed(mq.namesrv), "the broker to register again", timeout=120)
                back = time.monotonic()
                while not serves(http, node, topic, group):
                    waited = time.monotonic() - back
                    assert waited < RECOVERY_S, (
                        f"the node still fails {waited:.0f} s after the broker registered again; "
                        f"traffic: {statuses}\n{node.log.read_text()[-3000:]}")
                    time.sleep(0.2)
                took = time.monotonic() - back
            finally:
                stop.set()
                t.join(30)
    finally:
        node.stop()
    assert 404 not in statuses and 500 not in statuses, statuses
    print(f"served again {took:.1f} s after the broker registered again; traffic {statuses}")
