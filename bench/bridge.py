"""The Strimzi HTTP bridge 1.1.0 as a peer in ``make bench`` (issue 23): started beside the
gateway on the same Apache Kafka, driven by the same load generator through its own API.

Its jar is not served by Maven Central: ``../shared/peers/strimzi-kafka-bridge-1.1.0/`` (or
``$MQGW_BENCH_PEERS/strimzi-kafka-bridge-1.1.0``) holds the jar built from the 1.1.0 release and
a pom whose runtime dependencies Maven resolves once into ``~/.cache/mqgw/strimzi-bridge-1.1.0``
(as the brokers' jars are, gateway/cli/maven.py). It needs Java 21 or newer: ``$JAVA_HOME``,
then every JDK under ``/usr/lib/jvm`` is tried. Where the folder or such a JDK is missing,
:func:`available` says why and the run measures the gateway alone.

The bridge runs with the gateway's producer settings (acks=all, idempotence, the same linger),
and one bridge per ``max.poll.records`` (its records endpoint has no record limit; the
property is per bridge), so the consume phases restart it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from gateway.cli import devstack, maven

VERSION = "1.1.0"
NAME = f"Strimzi HTTP bridge {VERSION}"
HERE = Path(__file__).resolve().parent
MAIN = "io.strimzi.kafka.bridge.Application"
#: The gateway's Kafka producer settings (gateway/broker/kafka/clients.py producer_conf, the
#: default ``produce_linger_ms``), so that both sides ask the same of the broker.
PRODUCER = {"acks": "all", "enable.idempotence": "true", "linger.ms": "2"}


def peer_dir() -> Path:
    base = os.environ.get("MQGW_BENCH_PEERS") or str(HERE.parent.parent / "shared" / "peers")
    return Path(base) / f"strimzi-kafka-bridge-{VERSION}"


def _java_major(java: str) -> int:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return 0
    m = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return int(m.group(1)) if m else 0


def find_java(minimum: int = 21) -> str | None:
    """A ``java`` of at least ``minimum``: ``$JAVA_HOME``'s, then the JDKs under /usr/lib/jvm
    (the machine image's Temurin 25 sits there beside the default OpenJDK 17)."""
    homes = [os.environ.get("JAVA_HOME", "")]
    if os.path.isdir("/usr/lib/jvm"):
        homes += sorted((str(p) for p in Path("/usr/lib/jvm").iterdir()), reverse=True)
    for home in homes:
        java = os.path.join(home, "bin", "java")
        if home and os.access(java, os.X_OK) and _java_major(java) >= minimum:
            return java
    return None


def available() -> str | None:
    """None if the bridge can run here, else why not (printed, and the peer skipped)."""
    d = peer_dir()
    if not (d / f"kafka-bridge-{VERSION}.jar").exists() or not (d / "pom.xml").exists():
        return f"{NAME} skipped: no {d} (its jar and pom; set MQGW_BENCH_PEERS to their parent)"
    if find_java() is None:
        return f"{NAME} skipped: it needs Java 21+, and neither $JAVA_HOME nor /usr/lib/jvm has one"
    return None


def libs() -> Path:
    """The bridge's runtime dependencies, resolved once with Maven from the peer's pom."""
    target = maven.cache_dir("MQGW_BRIDGE_HOME", f"strimzi-bridge-{VERSION}")
    return maven.resolve(target, (peer_dir() / "pom.xml").read_text(), NAME,
                         "the peer's pom must resolve (Maven Central)")


def start(bootstrap: str, max_poll_records: int, log: Path) -> devstack.Service:
    """A bridge on a free loopback port; returns once ``GET /`` answers."""
    java = find_java()
    assert java is not None, available()
    work = Path(tempfile.mkdtemp(prefix="mqgw-bridge-"))
    port, mgmt = devstack.free_port(), devstack.free_port()
    props = {"bridge.id": "bench", "kafka.bootstrap.servers": bootstrap, "http.host": "127.0.0.1",
             "http.port": port, "http.management.port": mgmt,
             "kafka.consumer.max.poll.records": max_poll_records,
             **{f"kafka.producer.{k}": v for k, v in PRODUCER.items()}}
    (work / "application.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    shutil.copy(peer_dir() / "config" / "log4j2.properties", work / "log4j2.properties")
    cp = f"{peer_dir() / f'kafka-bridge-{VERSION}.jar'}{os.pathsep}{libs()}/*"
    cmd = [java, "-Xms256m", "-Xmx1g", f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
           "-cp", cp, MAIN, "--config-file", str(work / "application.properties")]
    proc = devstack.spawn(cmd, str(log))
    svc = devstack.Service("bridge", port, proc, workdir=str(work),
                           extra={"management_port": mgmt, "max_poll_records": max_poll_records})
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{NAME} exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                if r.status == 200:
                    return svc
        except OSError:
            pass
        if time.monotonic() > deadline:
            svc.stop()
            raise RuntimeError(f"{NAME} not answering after 120 s; see {log}")
        time.sleep(0.3)
