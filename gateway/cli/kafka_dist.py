"""Apache Kafka itself, on loopback, from its Maven Central jars: the reference broker for the
tests and ``make run`` (issue 11), beside Tansu, the stand-in that starts in milliseconds.

The machines reach package registries only (no release tarballs), so the broker is what an
embedded-Kafka test harness runs: ``org.apache.kafka:kafka_2.13`` and its runtime dependencies,
resolved once by Maven into a cache directory, then ``java -cp '<dir>/*' kafka.Kafka`` on a
generated ``server.properties`` in KRaft combined mode (one process is broker and controller),
after formatting its storage. Measured here: the first resolution took 22 s (93 jars, 54 MB with kafka-tools);
a cached start takes a few seconds; the broker's RSS is about 330 MB with ``-Xmx512m``.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from . import maven
from .devstack import Service, free_port, spawn, wait_port

#: The Apache Kafka release (Kafka 4 brokers need Java 17, which the machines have).
VERSION = "4.1.1"
#: Bumped whenever the jar list changes, so that a cache of the old list is not taken for it
#: (2: kafka-tools, for ``kafka-consumer-groups``'s class).
DIST_REVISION = 2
#: The class behind ``kafka-consumer-groups.sh`` in Kafka 4 (it moved from ``kafka.admin``).
CONSUMER_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
#: slf4j-api 1.7 is what kafka_2.13 4.1 brings; this binding sends its log to the broker's log file.
SLF4J_BINDING = "org.slf4j:slf4j-simple:1.7.36"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mqgw</groupId><artifactId>kafka-dist</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{version}</version>
    </dependency>
    <dependency>
      <groupId>{bg}</groupId><artifactId>{ba}</artifactId><version>{bv}</version>
    </dependency>
  </dependencies>
</project>
"""

_PROPERTIES = """process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
num.partitions=1
default.replication.factor={replication}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replication}
transaction.state.log.replication.factor={replication}
transaction.state.log.min.isr={min_isr}
share.coordinator.state.topic.replication.factor={replication}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.segment.bytes=16777216
log.cleaner.backoff.ms=1000
"""


def dist_dir() -> Path:
    """Where the jars are kept: ``MQGW_KAFKA_DIST``, else ``~/.cache/mqgw/kafka-<version>``."""
    return maven.cache_dir("MQGW_KAFKA_DIST", f"kafka-{VERSION}-{DIST_REVISION}")


def is_resolved() -> bool:
    return maven.is_resolved(dist_dir())


def resolve(timeout: float = 900.0) -> Path:
    """The directory of the broker's jars, resolving them with Maven the first time."""
    bg, ba, bv = SLF4J_BINDING.split(":")
    return maven.resolve(dist_dir(), _POM.format(version=VERSION, bg=bg, ba=ba, bv=bv),
                         f"Apache Kafka {VERSION}", "Java 17", timeout)


def java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("Apache Kafka needs Java 17 (Debian: apt-get install openjdk-17-jre-headless)")
    return java


def start_kafka(port: int | None = None, heap: str = "512m", timeout: float = 90.0) -> Service:
    """One Apache Kafka node in KRaft combined mode on loopback, storage in a temporary directory
    (removed by ``stop()``). ``extra["bootstrap"]`` is its address, as with ``start_broker``."""
    port = port or free_port()
    controller_port = free_port()
    work = tempfile.mkdtemp(prefix="mqgw-kafka-")
    props = Path(work) / "server.properties"
    props.write_text(_PROPERTIES.format(
        node_id=1, voters=f"1@127.0.0.1:{controller_port}", port=port,
        controller_port=controller_port, data=Path(work) / "data", replication=1, min_isr=1))
    try:
        _format(props, _cluster_id())
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log = os.path.join(work, "kafka.log")
    svc = Service("kafka", port, _launch(props, heap, log), work, {"bootstrap": f"127.0.0.1:{port}"})
    try:
        wait_port(port, timeout=timeout, proc=svc.proc)
        _wait_ready(svc.extra["bootstrap"], time.monotonic() + timeout, svc.proc)
    except BaseException as e:
        svc.stop()
        raise RuntimeError(f"Apache Kafka did not start: {e}\n{_tail(log)}") from e
    return svc


_CONTROLLER = """process.roles=controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=CONTROLLER://127.0.0.1:{controller_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT
log.dirs={data}
broker.session.timeout.ms={session_ms}
"""

_BROKER = """process.roles=broker
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
broker.heartbeat.interval.ms={heartbeat_ms}
""" + _PROPERTIES[_PROPERTIES.index("log.dirs="):]


@dataclass
class SplitKafka:
    """A KRaft controller and a broker in processes of their own, as production runs them: the
    controller fences the broker when its heartbeats stop for ``broker.session.timeout.ms``
    (a combined node cannot fence itself). ``stop()`` removes everything."""

    controller: Service
    broker: Service

    @property
    def bootstrap(self) -> str:
        return str(self.broker.extra["bootstrap"])

    def stop(self) -> None:
        for svc in (self.broker, self.controller):
            if svc.proc is not None and svc.proc.poll() is None:
                os.killpg(svc.proc.pid, signal.SIGCONT)  # a stopped JVM cannot act on SIGTERM
            svc.stop()


def start_split(session_ms: int = 2000, heartbeat_ms: int = 250, heap: str = "384m",
                timeout: float = 90.0, relayed_port: int | None = None) -> SplitKafka:
    """A controller-only and a broker-only Apache Kafka process on loopback (issue 32's fenced
    broker). ``session_ms``: how long the controller waits for the broker's heartbeats before it
    fences it (Kafka's default 9 s; short here so that a test's SIGSTOP fences it soon).
    ``relayed_port``: a second listener (``extra["relayed"]``: its own port) that advertises
    this port instead, where a proxy in front of it listens: clients that bootstrap there talk
    to the broker only through the proxy."""
    port, controller_port = free_port(), free_port()
    relayed = free_port() if relayed_port else 0
    voters = f"1@127.0.0.1:{controller_port}"
    cluster_id = _cluster_id()
    broker = _BROKER.format(node_id=2, voters=voters, port=port, data="{data}",
                            heartbeat_ms=heartbeat_ms, replication=1, min_isr=1)
    if relayed_port:
        broker = _relayed(broker, port, relayed, relayed_port)
    started: list[Service] = []
    try:
        for name, text in (
                ("controller", _CONTROLLER.format(node_id=1, voters=voters, session_ms=session_ms,
                                                  controller_port=controller_port, data="{data}")),
                ("broker", broker)):
            work = tempfile.mkdtemp(prefix=f"mqgw-kafka-{name}-")
            props = Path(work) / "server.properties"
            props.write_text(text.replace("{data}", str(Path(work) / "data")))
            try:
                _format(props, cluster_id)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
            log = os.path.join(work, "kafka.log")
            listen = controller_port if name == "controller" else port
            # the controller's fencing decisions are logged (INFO): tests wait for them
            jvm = ("-Dorg.slf4j.simpleLogger.log.org.apache.kafka.controller=info",) \
                if name == "controller" else ()
            svc = Service(f"kafka-{name}", listen, _launch(props, heap, log, *jvm), work,
                          {"bootstrap": f"127.0.0.1:{port}", "log": log, "relayed": relayed})
            started.append(svc)
            wait_port(listen, timeout=timeout, proc=svc.proc)
        _wait_ready(f"127.0.0.1:{port}", time.monotonic() + timeout, started[1].proc)
    except BaseException as e:
        tails = "\n".join(f"{s.name}: {_tail(s.extra['log'])[-1500:]}" for s in started)
        for s in reversed(started):
            s.stop()
        raise RuntimeError(f"the split Kafka did not start: {e}\n{tails}") from e
    return SplitKafka(started[0], started[1])


def _relayed(props: str, port: int, relayed: int, advertised: int) -> str:
    """``props`` with a RELAYED listener on ``relayed`` that advertises ``advertised``."""
    return props.replace(
        f"\nlisteners=PLAINTEXT://127.0.0.1:{port}\n",
        f"\nlisteners=PLAINTEXT://127.0.0.1:{port},RELAYED://127.0.0.1:{relayed}\n").replace(
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},RELAYED://127.0.0.1:{advertised}\n").replace(
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,RELAYED:PLAINTEXT,")


def _cluster_id() -> str:
    """A random cluster id in Kafka's form. Like Kafka's own Uuid.randomUuid, never one that
    starts with '-': the storage tool took such an id for an option and refused to format (one
    CI run in 64)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _format(props: Path, cluster_id: str) -> None:
    fmt = subprocess.run([java(), "-Xmx256m", "-cp", f"{resolve()}/*", "kafka.tools.StorageTool",
                          "format", "-t", cluster_id, "-c", str(props)],
                         capture_output=True, text=True, timeout=120)
    if fmt.returncode != 0:
        raise RuntimeError(f"formatting Kafka's storage failed:\n{(fmt.stdout + fmt.stderr)[-3000:]}")


def _launch(props: Path, heap: str, log: str, *jvm: str) -> subprocess.Popen[bytes]:
    return spawn([java(), f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseSerialGC",
                  "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", *jvm, "-cp", f"{resolve()}/*",
                  "kafka.Kafka", str(props)], log)


def _tail(log: str) -> str:
    return Path(log).read_text(errors="replace")[-3000:] if Path(log).exists() else ""


@dataclass
class KafkaNode:
    node_id: int
    port: int
    props: Path
    log: str
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class KafkaCluster:
    """Several Apache Kafka nodes, each broker and controller (a KRaft quorum of all of them), on
    loopback, for tests that kill and restart brokers. ``stop()`` removes everything."""

    nodes: list[KafkaNode]
    work: str
    heap: str
    bootstrap: str = field(init=False)

    def __post_init__(self) -> None:
        self.bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        n = self.node(node_id)
        if n.proc is not None and n.proc.poll() is None:
            os.killpg(n.proc.pid, sig)
            n.proc.wait(30)

    def start(self, node_id: int) -> None:
        """(Re)start a node on its own storage and ports."""
        n = self.node(node_id)
        n.proc = _launch(n.props, self.heap, n.log)
        wait_port(n.port, timeout=90, proc=n.proc)

    def signal_all(self, sig: int) -> None:
        """SIGSTOP / SIGCONT every node: a cluster that stops answering and comes back."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                os.killpg(n.proc.pid, sig)

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                os.killpg(n.proc.pid, signal.SIGCONT)
                os.killpg(n.proc.pid, signal.SIGKILL)
                n.proc.wait(30)
        shutil.rmtree(self.work, ignore_errors=True)


def start_cluster(size: int = 3, heap: str = "384m", timeout: float = 120.0) -> KafkaCluster:
    """``size`` Apache Kafka nodes in KRaft combined mode; topics default to replication
    factor ``size`` and ``min.insync.replicas`` ``size - 1``. Ready when metadata lists all."""
    work = tempfile.mkdtemp(prefix="mqgw-kcluster-")
    ports = [(free_port(), free_port()) for _ in range(size)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
    nodes = []
    cluster_id = _cluster_id()
    for i, (port, controller_port) in enumerate(ports):
        d = Path(work) / f"node{i + 1}"
        d.mkdir()
        props = d / "server.properties"
        # A killed broker is fenced (its partitions get new leaders) once its session times
        # out: 9 s by default, 3 s here so that failover tests do not wait for it.
        props.write_text(_PROPERTIES.format(
            node_id=i + 1, voters=voters, port=port, controller_port=controller_port,
            data=d / "data", replication=size, min_isr=max(1, size - 1))
            + "broker.session.timeout.ms=3000\nbroker.heartbeat.interval.ms=500\n")
        nodes.append(KafkaNode(i + 1, port, props, str(d / "kafka.log")))
    cluster = KafkaCluster(nodes, work, heap)
    try:
        for n in nodes:
            _format(n.props, cluster_id)
        for n in nodes:
            n.proc = _launch(n.props, heap, n.log)
        deadline = time.monotonic() + timeout
        for n in nodes:
            assert n.proc is not None
            wait_port(n.port, timeout=timeout, proc=n.proc)
        _wait_ready(cluster.bootstrap, deadline, nodes[0].proc, brokers=size)  # type: ignore[arg-type]
    except BaseException as e:
        tails = "\n".join(f"node {n.node_id}: {_tail(n.log)[-800:]}" for n in nodes)
        cluster.stop()
        raise RuntimeError(f"the Kafka cluster did not start: {e}\n{tails}") from e
    return cluster


def _wait_ready(bootstrap: str, deadline: float, proc: subprocess.Popen[bytes], brokers: int = 1) -> None:
    """Until metadata lists ``brokers`` brokers (the controller elected, the brokers registered)."""
    from confluent_kafka.admin import AdminClient

    # log_level 0: the connects refused while the broker starts are expected, not worth a raw
    # librdkafka line on the terminal each (`make run` printed a screenful)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if len(admin.list_topics(timeout=2).brokers) >= brokers:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise TimeoutError("no metadata answer")
