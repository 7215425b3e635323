"""Apache RocketMQ itself, on loopback, from its Maven Central jars: the test broker of the RocketMQ
adapter (issue 22) and of ``mqgw dev --broker rocketmq``, as ``kafka_dist`` is Apache Kafka's.

The machines reach package registries only (no release archives), so a name server and one broker
run from ``rocketmq-namesrv`` and ``rocketmq-broker`` (with ``rocketmq-tools`` for mqadmin and
``rocketmq-client`` for interoperability tests) and their runtime dependencies, resolved once by
Maven into a cache directory. 5.5.0 is the one release of which all of these are on Maven Central.
Measured here (2 cores): the first resolution took 27 s (137 jars, 94 MB), 6-7 s with a warm local
Maven repository (javac included); both JVMs started and ready in 5-6 s on an otherwise idle
machine, 8-10 s beside other work (allow a minute under load); a killed broker restarts on its
store in ~4 s; RSS 145-225 MB (name server, 256 MB heap) + 375-430 MB (broker, 512 MB heap).

Everything listens on 127.0.0.1 only. The broker's HA listener would bind every interface
(``DefaultHAService`` opens ``new InetSocketAddress(haListenPort)``, no setting changes it), so
``resolve()`` also compiles ``java/LoopbackHAService.java``, an HA service that never opens it (a
single master has no slave), into ``<dist>/mqgw-ha/`` with the resource file through which the
store loads it; ``listening_sockets()`` lets the tests check every listener of both JVMs.
Readiness is asked over the remoting protocol (the name server lists the broker, the broker
answers), never read from a log line. SIGTERM takes the broker ~15 s, so it is killed: the store
is a temporary one (and survives a SIGKILL anyway, ASYNC_FLUSH: the page cache outlives it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..broker.rocketmq.codes import Req
from ..broker.rocketmq.remoting import RemotingError, call_sync, loads_lenient
from . import maven
from .devstack import Service, free_port, spawn

#: The Apache RocketMQ release (5.5.1: only the broker is on Maven Central).
VERSION = "5.5.0"
#: Bumped whenever the jar list or java/LoopbackHAService.java changes, so that a cache of the old
#: one is not taken for it.
DIST_REVISION = 1
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
#: ``mqadmin``'s class, for tests that want the operator's view (``-n <namesrv> <command>``).
ADMIN_TOOL = "org.apache.rocketmq.tools.command.MQAdminStartup"
#: The single-master HA service without an accept socket, and the class-path resource through which
#: ``DefaultMessageStore`` loads it (``ServiceProvider.PREFIX`` is "META-INF/service/", singular).
HA_SERVICE_CLASS = "mqgw.LoopbackHAService"
HA_SERVICE_RESOURCE = "META-INF/service/org.apache.rocketmq.store.ha.HAService"
HA_DIR = "mqgw-ha"
CLUSTER = "mqgw"
BROKER_NAME = "broker-a"
#: The name server keeps a route table and little else.
NAMESRV_HEAP = "256m"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mqgw</groupId><artifactId>rocketmq-dist</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""
_ARTIFACTS = ("rocketmq-namesrv", "rocketmq-broker", "rocketmq-tools", "rocketmq-client")

#: The broker's settings (``broker_settings`` of ``start_rocketmq`` override and extend them); the
#: ports, addresses and paths are added by ``start_rocketmq``.
BROKER_DEFAULTS: dict[str, str] = {
    "brokerClusterName": CLUSTER,
    "brokerName": BROKER_NAME,
    "brokerId": "0",
    "brokerRole": "ASYNC_MASTER",
    "flushDiskType": "ASYNC_FLUSH",
    # small files: a test store, not a 1 GB commit log per broker
    "mappedFileSizeCommitLog": "33554432",
    "mappedFileSizeConsumeQueue": "200000",
    # unknown topics answer TOPIC_NOT_EXIST (17) as on production clusters
    "autoCreateTopicEnable": "false",
    "autoCreateSubscriptionGroup": "true",
    "timerWheelEnable": "true",
    "timerPrecisionMs": "100",  # timers late by 12-388 ms instead of up to ~1 s
    "recallMessageEnable": "true",
    "enablePropertyFilter": "true",  # SQL92 filters
    "diskMaxUsedSpaceRatio": "95",
}

# Request codes of the remoting protocol used here (RequestCode.java).


def dist_dir() -> Path:
    """Where the jars are kept: ``MQGW_ROCKETMQ_DIST``, else ``~/.cache/mqgw/rocketmq-<version>``."""
    return maven.cache_dir("MQGW_ROCKETMQ_DIST", f"rocketmq-{VERSION}-{DIST_REVISION}")


def is_resolved() -> bool:
    return maven.is_resolved(dist_dir())


def resolve(timeout: float = 900.0) -> Path:
    """The directory of the jars (and of ``mqgw-ha/``), resolving and compiling the first time."""
    if is_resolved():
        return dist_dir()
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("Apache RocketMQ's loopback HA service is compiled at first start: "
                           "install a Java 17 JDK (Debian: apt-get install openjdk-17-jdk-headless)")
    deps = "\n".join(f"    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>{a}"
                     f"</artifactId><version>{VERSION}</version></dependency>" for a in _ARTIFACTS)
    return maven.resolve(dist_dir(), _POM.format(deps=deps), f"Apache RocketMQ {VERSION}",
                         "a Java 17 JDK (Debian: apt-get install maven openjdk-17-jdk-headless)",
                         timeout, then=lambda libs, work: _build_ha_service(javac, libs, work))


def _build_ha_service(javac: str, libs: Path, work: Path) -> None:
    """``mqgw.LoopbackHAService`` and its resource file into ``libs/mqgw-ha``."""
    src = work / "LoopbackHAService.java"
    src.write_text(resources.files("gateway.cli").joinpath("java/LoopbackHAService.java")
                   .read_text(encoding="utf-8"))
    out_dir = libs / HA_DIR
    out = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", f"{libs}/*", "-d", str(out_dir),
                          str(src)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"javac could not compile the loopback HA service:\n{out.stderr[-3000:]}")
    service_file = out_dir / HA_SERVICE_RESOURCE
    service_file.parent.mkdir(parents=True)
    service_file.write_text(HA_SERVICE_CLASS + "\n")


def class_path() -> str:
    """The jars and the loopback HA service (resolved first if need be)."""
    dist = resolve()
    return f"{dist}/*{os.pathsep}{dist / HA_DIR}"


def java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("Apache RocketMQ needs Java 17 (Debian: apt-get install openjdk-17-jre-headless)")
    return java


def free_broker_port() -> int:
    """A free ``listenPort`` whose neighbours are free too: the broker also listens on
    ``listenPort - 2`` (its "fast" port) and would on ``listenPort + 1`` (HA)."""
    for _ in range(200):
        port = free_port()
        if port < 1026 or port > 65534:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port - 2))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port for a RocketMQ broker (listenPort - 2 and + 1 must be free too)")


def _write_conf(path: Path, settings: Mapping[str, object]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))


def _jvm(name: str, main: str, conf: Path, heap: str, work: Path) -> subprocess.Popen[bytes]:
    # user.home: logback writes under ${user.home}/logs/rocketmqlogs, one directory per JVM (both
    # would append to the same broker_default.log); ROCKETMQ_HOME is required (NamesrvStartup,
    # BrokerStartup) though nothing is read from it. tls.server.mode: the default, "permissive",
    # makes a self-signed certificate per server at start; off, the name server's start took 3.5 s
    # of CPU instead of 7, and both JVMs were ready in ~5.5 s instead of ~8 (plain TCP only).
    env = {**os.environ, "ROCKETMQ_HOME": str(work)}
    cmd = [java(), f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:MaxDirectMemorySize=256m",
           "-Dtls.server.mode=disabled", f"-Duser.home={work / name}",
           "-cp", class_path(), main, "-c", str(conf)]
    return spawn(cmd, str(work / f"{name}.out"), env)


def _kill(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(30)


@dataclass
class RocketMQ(Service):
    """A name server (``proc``, ``port``) and one broker on loopback, both in ``workdir`` (removed by
    ``stop()``, which stops both). ``extra``: ``namesrv`` and ``broker_addr`` ("127.0.0.1:port"),
    ``broker_name``, ``cluster``. Tests kill and restart the broker on the same store and ports
    with ``kill_broker()`` and ``start_broker()``."""

    broker: subprocess.Popen[bytes] | None = None
    broker_port: int = 0
    heap: str = "512m"

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def pids(self) -> list[int]:
        """The running JVMs' process ids (name server first)."""
        return [p.pid for p in (self.proc, self.broker) if p is not None and p.poll() is None]

    def listeners(self) -> list[str]:
        """Every listening TCP socket of both JVMs, as "ip:port" (see ``listening_sockets``)."""
        return listening_sockets(self.pids())

    def kill_broker(self, sig: int = signal.SIGKILL) -> None:
        _kill(self.broker, sig)

    def start_broker(self, timeout: float = 120.0) -> None:
        """(Re)start the broker on its store and ports; returns once it serves (see ``wait_ready``)."""
        if self.broker is not None and self.broker.poll() is None:
            raise RuntimeError("the broker is running")
        self.broker = _jvm("broker", BROKER_MAIN, Path(self.workdir) / "broker.conf", self.heap,
                           Path(self.workdir))
        try:
            self.wait_ready(timeout)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"the broker did not restart: {e}\n{self.log_tail()}") from e

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the name server lists the broker at its address and the broker answers there with
        its configuration: the configured ``listenPort`` (a 5.x develop build once forced 10911)."""
        deadline = time.monotonic() + timeout
        last: object = "no answer"
        while time.monotonic() < deadline:
            for what, p in (("name server", self.proc), ("broker", self.broker)):
                if p is None or p.poll() is not None:
                    code = None if p is None else p.returncode
                    raise RuntimeError(f"the {what} exited ({code})")
            try:
                listed = broker_addrs(self.namesrv).get(BROKER_NAME, {}).get(0)
                if listed != self.broker_addr:
                    last = f"the name server lists {BROKER_NAME} at {listed}"
                else:
                    reply = call_sync(self.broker_addr, Req.GET_BROKER_CONFIG, timeout=2.0)
                    port = re.search(rb"^listenPort=(\d+)$", reply.body, re.M)
                    if reply.code == 0 and port and int(port[1]) == self.broker_port:
                        return
                    last = f"GET_BROKER_CONFIG: code {reply.code}, listenPort {port and port[1]!r}"
            except (OSError, ValueError, RemotingError) as e:  # not up yet
                last = e
            time.sleep(0.1)
        raise TimeoutError(f"Apache RocketMQ not ready after {timeout:.0f} s ({last})")

    def log_tail(self, chars: int = 1500) -> str:
        """The end of each JVM's output and main log file (the name server logs to a broker.log too:
        it finds the broker jar's logback configuration first)."""
        work = Path(self.workdir)
        logs = [f for name in ("namesrv", "broker")
                for f in (work / f"{name}.out", work / name / "logs" / "rocketmqlogs" / "broker.log")]
        return "\n".join(f"--- {f.relative_to(work)}\n{f.read_text(errors='replace')[-chars:]}"
                         for f in logs if f.exists() and f.stat().st_size)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Both JVMs killed whatever ``sig`` (the store is discarded), the directory removed."""
        _kill(self.broker)
        super().stop(signal.SIGKILL, timeout)


def start_rocketmq(heap: str = "512m", timeout: float = 120.0,
                   namesrv_settings: Mapping[str, object] | None = None,
                   **broker_settings: object) -> RocketMQ:
    """A name server (``namesrv_settings`` added to its configuration) and one broker
    (``broker-a`` of cluster ``mqgw``, settings ``BROKER_DEFAULTS`` updated with
    ``broker_settings``) on free loopback ports, the store in a temporary directory.
    Returns once the name server lists the broker and the broker answers."""
    resolve()  # outside the timeout: the first resolution downloads ~100 MB
    work = Path(tempfile.mkdtemp(prefix="mqgw-rocketmq-"))
    ns_port = free_port()
    port = free_broker_port()
    while ns_port in (port - 2, port, port + 1):
        port = free_broker_port()
    _write_conf(work / "namesrv.conf", {"listenPort": ns_port, "bindAddress": "127.0.0.1",
                                        **(namesrv_settings or {})})
    _write_conf(work / "broker.conf", {
        **BROKER_DEFAULTS, "namesrvAddr": f"127.0.0.1:{ns_port}", "brokerIP1": "127.0.0.1",
        # brokerIP2: the HA address the broker registers (it would name the host's address)
        "brokerIP2": "127.0.0.1", "bindAddress": "127.0.0.1", "listenPort": port,
        "storePathRootDir": work / "store",
        **broker_settings})
    namesrv = _jvm("namesrv", NAMESRV_MAIN, work / "namesrv.conf", NAMESRV_HEAP, work)
    extra = {"namesrv": f"127.0.0.1:{ns_port}", "broker_addr": f"127.0.0.1:{port}",
             "broker_name": BROKER_NAME, "cluster": CLUSTER}
    mq = RocketMQ("rocketmq", ns_port, namesrv, str(work), extra, broker_port=port, heap=heap)
    try:
        mq.broker = _jvm("broker", BROKER_MAIN, work / "broker.conf", heap, work)
        mq.wait_ready(timeout)
    except BaseException as e:
        tail = mq.log_tail()
        mq.stop()
        raise RuntimeError(f"Apache RocketMQ did not start: {e}\n{tail}") from e
    return mq


def broker_addrs(namesrv: str, timeout: float = 2.0) -> dict[str, dict[int, str]]:
    """brokerName -> {brokerId: "ip:port"} as the name server lists them (GET_BROKER_CLUSTER_INFO)."""
    reply = call_sync(namesrv, Req.GET_BROKER_CLUSTER_INFO, timeout=timeout)
    if reply.code != 0:
        raise ValueError(f"GET_BROKER_CLUSTER_INFO answered {reply.code}: {reply.remark}")
    info = loads_lenient(reply.body)  # fastjson writes the brokerAddrs keys bare: {0:"ip:port"}
    return {name: {int(i): a for i, a in b.get("brokerAddrs", {}).items()}
            for name, b in info.get("brokerAddrTable", {}).items()}


def listening_sockets(pids: Iterable[int]) -> list[str]:
    """Every listening TCP socket (IPv4 and IPv6) of these processes, as "ip:port" ("[::1]:port" for
    IPv6; Java's dual-stack sockets bound to 127.0.0.1 show as "[::ffff:127.0.0.1]", listed as
    "127.0.0.1"): the sockets in ``/proc/<pid>/fd`` matched by inode with ``/proc/<pid>/net/tcp{,6}``."""
    found: set[str] = set()
    for pid in pids:
        inodes = set()
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                link = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        for table, v6 in (("tcp", False), ("tcp6", True)):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                    found.add(_proc_addr(cols[1], v6))
    return sorted(found)


def _proc_addr(hex_addr: str, v6: bool) -> str:
    ip, port = hex_addr.split(":")
    # the kernel prints the address as host-order 32-bit words
    raw = b"".join(struct.pack("<I", int(ip[i:i + 8], 16)) for i in range(0, len(ip), 8))
    if not v6:
        return f"{socket.inet_ntop(socket.AF_INET, raw)}:{int(port, 16)}"
    if raw[:12] == b"\0" * 10 + b"\xff\xff":  # IPv4-mapped
        return f"{socket.inet_ntop(socket.AF_INET, raw[12:])}:{int(port, 16)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{int(port, 16)}"


def create_topic(namesrv: str, topic: str, queues: int, timeout: float = 30.0) -> None:
    """Create a topic (if missing) through the gateway's own adapter, which no other Python
    client can do on RocketMQ, and return once its queues serve (``make run``, the tests)."""
    import asyncio

    from ..broker.rocketmq import RocketMQBroker

    async def make() -> None:
        b = RocketMQBroker(namesrv)
        try:
            await b.ensure_topics({topic: queues}, timeout_s=timeout)
        finally:
            await b.close()
    asyncio.run(make())
