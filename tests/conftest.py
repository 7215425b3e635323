"""Test harness: a real redis-server, the real broker, and gateway nodes as uvicorn processes.

The folders say what a test needs: ``tests/unit`` runs in process (fakeredis with the real Lua
scripts, the in-package memory broker; its own conftest), ``tests/system`` starts processes
(through the fixtures below, each started only when a test asks for it), ``tests/support`` is
the shared code. ``REDIS_URL`` / ``KAFKA_BOOTSTRAP`` point the suite at external services
instead. Every process started here is stopped here, and all traffic stays on loopback.

Markers, so that what does not depend on the broker runs once (see the Makefile's test targets):
a test that uses a broker (the ``bootstrap`` fixture, directly or through a node) is marked
``broker`` here; a module that proves the broker adapter itself (produce, reads, delays,
retries, checkpoints, topics, a broker going away) is marked ``every_broker`` and runs on each
broker; everything else runs on the reference broker (Apache Kafka) only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.cli import devstack

from .support import TEST_BROKER, Api, Node, Secure, create_topic, start_node, start_secure, unique


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("REDIS_URL")
    if external:
        yield external
        return
    svc = devstack.start_redis()
    try:
        yield svc.extra["url"]
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def rocketmq() -> Iterator[Any]:
    """The RocketMQ name server and broker of a ``MQGW_TEST_BROKER=rocketmq`` session
    (gateway/cli/rocketmq_dist.py): tests that kill and restart the broker use it. Timers up to
    5 s (``timerMaxDelaySec``), so that longer delays go through the gateway's own wheel and a
    session proves both paths."""
    if TEST_BROKER != "rocketmq" or os.environ.get("ROCKETMQ_NAMESRV"):
        pytest.skip("the test's own RocketMQ broker (MQGW_TEST_BROKER=rocketmq)")
    from gateway.cli.rocketmq_dist import start_rocketmq

    mq = start_rocketmq(timerMaxDelaySec=5)
    try:
        yield mq
    finally:
        mq.stop()


@pytest.fixture(scope="session")
def bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test broker's address: Kafka's bootstrap servers, or RocketMQ's name server."""
    external = os.environ.get("KAFKA_BOOTSTRAP") or os.environ.get("ROCKETMQ_NAMESRV")
    if external:
        yield external
        return
    if TEST_BROKER not in ("tansu", "kafka", "rocketmq"):
        raise pytest.UsageError(f"MQGW_TEST_BROKER={TEST_BROKER!r}: use tansu, kafka or rocketmq")
    if TEST_BROKER == "rocketmq":
        yield request.getfixturevalue("rocketmq").extra["namesrv"]
        return
    if TEST_BROKER == "kafka":
        from gateway.cli.kafka_dist import start_kafka

        svc = start_kafka()
    else:
        svc = devstack.start_broker()
    try:
        yield svc.extra["bootstrap"]
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[devstack.RedisCluster]:
    """A 3-master Redis Cluster on loopback, shared by the tests that run against one."""
    if os.environ.get("REDIS_URL"):
        pytest.skip("external Redis configured; the cluster tests start their own servers")
    c = devstack.start_redis_cluster(3)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def rds(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def make_topic(bootstrap: str) -> Callable[..., str]:
    def make(partitions: int = 6, prefix: str = "t") -> str:
        name = unique(prefix)
        create_topic(bootstrap, name, partitions)
        return name
    return make


@pytest.fixture
def node_factory(redis_url: str, bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    started: list[Node] = []

    def make(**settings: Any) -> Node:
        n = start_node(redis_url, bootstrap, tmp_path, **settings)
        started.append(n)
        return n
    yield make
    for n in started:
        n.stop()


@pytest.fixture(scope="session")
def cluster(redis_url: str, bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    """Three gateway nodes sharing Redis and the broker, for tests that do not kill nodes."""
    tmp = tmp_path_factory.mktemp("cluster")
    nodes = [start_node(redis_url, bootstrap, tmp) for _ in range(3)]
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(scope="session")
def node(cluster: list[Node]) -> Node:
    return cluster[0]


@pytest.fixture
def api(cluster: list[Node]) -> Iterator[Api]:
    a = Api([n.url for n in cluster])
    yield a
    a.http.close()


@pytest.fixture(scope="module")
def sec(redis_url: str, bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    """Two secure nodes (API keys required, registry closed) for one test module."""
    s = start_secure(redis_url, bootstrap, tmp_path_factory.mktemp("secure"), n=2)
    try:
        yield s
    finally:
        s.http.close()
        for n in s.nodes:
            n.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.broker)


# -- where the time goes: seconds per test file, printed at the end of every run ----------------
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FILE_SECONDS:
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
    terminalreporter.write_sep("-", "seconds per test file (setup + call + teardown), slowest 15")
    for path, secs in slowest:
        terminalreporter.write_line(f"{secs:8.1f}  {path}")
