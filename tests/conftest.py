"""Test harness: a real redis-server, the real broker, and gateway nodes as uvicorn processes.

``REDIS_URL`` / ``KAFKA_BOOTSTRAP`` point the suite at external services instead.
Every process started here is stopped here, and all traffic stays on loopback.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import redis

from gateway.cli import devstack

ROOT = Path(__file__).resolve().parent.parent
HMAC_KEY = "test-hmac-key"


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
def bootstrap() -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
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
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        devstack.create_topic(bootstrap, name, partitions)
        return name
    return make


def unique(prefix: str = "g") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Node:
    url: str
    proc: subprocess.Popen
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_node(redis_url: str, bootstrap: str, tmp: Path, workers: int = 1,
               **settings: Any) -> Node:
    port = devstack.free_port()
    env = {**os.environ, "MQGW_REDIS_URL": redis_url, "MQGW_KAFKA_BOOTSTRAP": bootstrap,
           "MQGW_HMAC_KEY": HMAC_KEY, "MQGW_METADATA_REFRESH_MS": "100",
           # Most tests are about delivery, not access control: they run open and without keys.
           # test_auth.py and test_registry.py start nodes with auth on and open mode off.
           "MQGW_OPEN_MODE": "true", "MQGW_AUTH": "false"}
    env.update({f"MQGW_{k.upper()}": str(v) for k, v in settings.items()})
    log = tmp / f"node-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "gateway.api.app:factory", "--factory", "--host", "127.0.0.1",
         "--port", str(port), "--workers", str(workers), "--loop", "uvloop", "--http", "httptools",
         "--no-access-log"],
        cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    node = Node(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{node.url}/healthz", timeout=0.5).status_code == 200:
                return node
        except httpx.HTTPError:
            time.sleep(0.1)
    node.stop()
    raise TimeoutError(f"gateway did not start: {log.read_text()[-3000:]}")


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


class Api:
    """A thin synchronous client that sends each call to a random node (or a given one)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.http = httpx.Client(timeout=60)

    def url(self, path: str, node: int | None = None) -> str:
        base = self.urls[node] if node is not None else random.choice(self.urls)
        return base + path

    def produce(self, topic: str, values: list[str], **kw: Any) -> dict[str, Any]:
        msgs = [{"value": v, **kw} for v in values]
        r = self.http.post(self.url("/produce"), json={"topic": topic, "messages": msgs})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["failed"] == 0, body
        return body

    def message(self, node: int | None = None, **params: Any) -> httpx.Response:
        return self.http.get(self.url("/message", node), params=params)

    def ack(self, request_id: str, node: int | None = None) -> httpx.Response:
        return self.http.post(self.url("/ack", node), json={"requestId": request_id})

    def unlock(self, request_id: str, node: int | None = None) -> httpx.Response:
        return self.http.post(self.url("/unlock", node), json={"requestId": request_id})

    def config(self, group: str, **values: Any) -> dict[str, Any]:
        r = self.http.patch(self.url(f"/admin/consumers/{group}"), json=values)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def api(cluster: list[Node]) -> Iterator[Api]:
    a = Api([n.url for n in cluster])
    yield a
    a.http.close()
