"""Keys land on the partition Kafka's Java client puts them on (issue 20), on every path.

Mixed fleets (Java producers, the Confluent REST Proxy, this gateway) keep per-key order only if
all of them send a key to the same partition: ``toPositive(murmur2(key)) % partitions``.

- :data:`JAVA_TABLE` was printed by the Java client itself (``tests/support/java/KeyPartitions.java``
  ``hash``, kafka-clients 4.1.1: ``Utils.murmur2`` and ``BuiltInPartitioner.partitionForKey``);
  the fast tests check the gateway's :func:`partition_for_key` and the in-memory broker
  against it, and ``/produce`` (a batch, UTF-8 and base64 keys) and delayed produce (through the
  delay wheel, and below its smallest level) on the real broker.
- The slow tests run the Java client when its jars are there (``MQGW_TEST_BROKER=kafka`` runs
  resolve them, gateway/cli/kafka_dist.py) and a JDK is installed: the table and a few hundred
  random keys are recomputed by Java, and a Java ``KafkaProducer`` writes the same keys to the
  same topic as the gateway.
"""

from __future__ import annotations

import asyncio
import base64
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.broker import OutgoingMessage
from gateway.broker.memory import MemoryBroker
from gateway.broker.partitioner import murmur2, partition_for_key
from gateway.cli import kafka_dist

from ..support import ON_ROCKETMQ, ROOT, Node, unique

#: the broker adapter itself: run on every broker (tests/conftest.py)
pytestmark = [pytest.mark.every_broker, pytest.mark.skipif(
    ON_ROCKETMQ, reason="Kafka's partitioner and Java client; RocketMQ's key rule (UTF-8 keys, the "
    "same murmur2 over its queues) is tested in test_rocketmq.py")]

#: Partition counts of the table's columns.
COUNTS = (1, 3, 6, 7, 12, 100)
#: (key as hex, '-' for the empty key; Utils.murmur2; partition for each of COUNTS), as printed
#: by `java -cp "$(dist)/*" tests/support/java/KeyPartitions.java hash 1,3,6,7,12,100 <keys>`. Keys:
#: '', a .. abcde (every length mod 4), order-43, order-44, customer-1, k1, user:42, ключ, 日本語,
#: é, 🔑, 'x' * 100, then bytes that are negative as Java bytes.
JAVA_TABLE: list[tuple[str, int, tuple[int, ...]]] = [
    ("-", 275646681, (0, 0, 3, 2, 9, 81)),
    ("61", -1563381124, (0, 1, 4, 5, 4, 24)),
    ("6162", 316155434, (0, 2, 2, 0, 2, 34)),
    ("616263", 479470107, (0, 0, 3, 4, 3, 7)),
    ("61626364", -1323649548, (0, 2, 2, 5, 8, 0)),
    ("6162636465", 461995741, (0, 1, 1, 4, 1, 41)),
    ("6f726465722d3433", -94367734, (0, 1, 4, 3, 10, 14)),
    ("6f726465722d3434", 1433489828, (0, 2, 2, 1, 8, 28)),
    ("637573746f6d65722d31", 1939597761, (0, 0, 3, 3, 9, 61)),
    ("6b31", 1684045097, (0, 2, 5, 0, 5, 97)),
    ("757365723a3432", -1493546323, (0, 1, 1, 6, 1, 25)),
    ("d0bad0bbd18ed187", 2122343024, (0, 2, 2, 4, 8, 24)),
    ("e697a5e69cace8aa9e", 1431860170, (0, 1, 4, 6, 10, 70)),
    ("c3a9", 186971271, (0, 0, 3, 4, 3, 71)),
    ("f09f9491", 2080712807, (0, 2, 5, 5, 11, 7)),
    ("78" * 100, 1249054468, (0, 1, 4, 4, 4, 68)),
    ("ff80", -442788720, (0, 2, 2, 6, 8, 28)),
    ("00", 375494588, (0, 2, 2, 0, 8, 88)),
    ("ffffffff", 644171429, (0, 2, 5, 6, 5, 29)),
    ("0001020304050607", 970650281, (0, 2, 5, 6, 5, 81)),
    ("80", 857690492, (0, 2, 2, 1, 8, 92)),
    ("fafbfcfdfeff7f", 1346132018, (0, 2, 2, 0, 2, 18)),
]
JAVA_SOURCE = ROOT / "tests" / "support" / "java" / "KeyPartitions.java"
#: Text keys for the gateway tests: ASCII, multi-byte UTF-8, every length mod 4.
TEXT_KEYS = ["order-43", "order-44", "customer-1", "k1", "user:42", "ключ", "日本語", "é", "🔑", "a",
             "ab", "abc", "abcd", "", *(f"key-{i}" for i in range(24))]


def _bytes(hexkey: str) -> bytes:
    return b"" if hexkey == "-" else bytes.fromhex(hexkey)


# -- the rule, against what Java printed --------------------------------------------------------

def test_murmur2_and_partition_match_the_java_client_table() -> None:
    for hexkey, java_hash, partitions in JAVA_TABLE:
        key = _bytes(hexkey)
        assert murmur2(key) == java_hash, hexkey
        assert tuple(partition_for_key(key, n) for n in COUNTS) == partitions, hexkey


def test_the_memory_broker_puts_keys_where_java_does() -> None:
    b = MemoryBroker(topics={"t": 7})
    msgs = [OutgoingMessage(b"v", _bytes(h)) for h, _, _ in JAVA_TABLE]
    results = asyncio.run(b.produce("t", msgs))
    assert [int(r.queue) for r in results] == [p[COUNTS.index(7)] for _, _, p in JAVA_TABLE]


# -- through the gateway, on the real broker -------------------------------------------------------

def _expected(key: bytes, n: int) -> int:
    return partition_for_key(key, n)


def test_produce_puts_keys_where_java_does(node_factory: Callable[..., Node],
                                           make_topic: Callable[..., str]) -> None:
    node = node_factory()
    for n in (6, 7):
        topic = make_topic(n)
        with httpx.Client(base_url=node.url, timeout=30) as http:
            r = http.post("/produce", json={"topic": topic, "messages": [
                *({"key": k, "value": f"v{i}"} for i, k in enumerate(TEXT_KEYS)),
                *({"key": base64.b64encode(_bytes(h)).decode(), "value": "AA==", "encoding": "base64"}
                  for h, _, _ in JAVA_TABLE)]})
            assert r.status_code == 200 and r.json()["failed"] == 0, r.text
            got = [x["partition"] for x in r.json()["results"]]
            want = [_expected(k.encode(), n) for k in TEXT_KEYS] + \
                [_expected(_bytes(h), n) for h, _, _ in JAVA_TABLE]
            assert got == want
            if n == 7:  # the checked-in Java column, not only the Python rule
                assert got[len(TEXT_KEYS):] == [p[COUNTS.index(7)] for _, _, p in JAVA_TABLE]
            # the single-record form too
            r = http.post("/produce", json={"topic": topic, "key": "order-43", "value": "x"})
            assert r.json()["results"][0]["partition"] == _expected(b"order-43", n)


def _consume_all(http: httpx.Client, topic: str, count: int, timeout_s: float = 60) -> list[dict[str, Any]]:
    """Every record of ``topic`` from the start, each with its partition (``queue``)."""
    group = unique("pt")
    assert http.patch(f"/admin/consumers/{group}", json={"start": "earliest"}).status_code == 200
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        m = http.get("/message", params={"consumer": group, "topic": topic, "max": 500,
                                         "wait_ms": 1000}).json()
        if m["status"] != "ok":
            continue
        out += [{**x, "queue": int(m["queue"])} for x in m["messages"]]
        assert http.post("/ack", json={"requestId": m["requestId"]}).json()["result"] == "committed"
    return out


def test_delayed_produce_puts_keys_where_java_does(node_factory: Callable[..., Node],
                                                   make_topic: Callable[..., str]) -> None:
    """A delayed record is written to its topic by the relay (through the wheel's level topics,
    whose partitions have nothing to do with the record's), or, when due within the smallest
    level, by the node that took it: either way to the partition its key gives."""
    node = node_factory(relay="true", delay_levels="100ms,200ms", delay_partitions=1,
                        delay_topic_prefix=f"mqgw.delay.{unique('p')}.")
    topic = make_topic(6)
    keys = TEXT_KEYS[:16]
    with httpx.Client(base_url=node.url, timeout=30) as http:
        r = http.post("/produce", json={"topic": topic, "messages": [
            *({"key": k, "value": f"wheel-{i}", "delayMs": 350} for i, k in enumerate(keys)),
            *({"key": k, "value": f"soon-{i}", "delayMs": 40} for i, k in enumerate(keys))]})
        assert r.status_code == 200 and r.json()["failed"] == 0, r.text
        assert all("delayId" in x for x in r.json()["results"])
        records = _consume_all(http, topic, 2 * len(keys))
    assert sorted(x["value"] for x in records) == sorted(
        [f"wheel-{i}" for i in range(len(keys))] + [f"soon-{i}" for i in range(len(keys))])
    for x in records:
        assert x["queue"] == _expected((x["key"] or "").encode(), 6), x


# -- the Java client itself (slow: a JVM start, ~2-7 s) -------------------------------------------

def _java_classpath() -> str | None:
    """kafka-clients and its dependencies, from the Apache Kafka jars the kafka test runs resolve;
    None when they or a JDK are missing (the table above then stands in)."""
    if not kafka_dist.is_resolved() or shutil.which("java") is None:
        return None
    return str(kafka_dist.dist_dir() / "*")


def _java(*args: str, timeout: float = 120) -> list[list[str]]:
    cp = _java_classpath()
    if cp is None:
        pytest.skip("no Kafka jars (run the MQGW_TEST_BROKER=kafka tests once) or no java: "
                    "JAVA_TABLE is checked instead")
    out = subprocess.run(["java", "-Xmx128m", "-cp", cp, str(JAVA_SOURCE), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=Path(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    return [line.split() for line in out.stdout.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_java_client_computes_the_table_and_random_keys_alike() -> None:
    rng = random.Random(20)
    keys = [h for h, _, _ in JAVA_TABLE] + \
        [rng.randbytes(rng.randrange(1, 64)).hex() for _ in range(300)]
    rows = _java("hash", ",".join(map(str, COUNTS)), *keys)
    assert [r[0] for r in rows] == keys
    for hexkey, java_hash, *parts in rows:
        key = _bytes(hexkey)
        assert murmur2(key) == int(java_hash), hexkey
        assert [partition_for_key(key, n) for n in COUNTS] == [int(p) for p in parts], hexkey
    table = {h: (m, p) for h, m, p in JAVA_TABLE}
    for hexkey, java_hash, *parts in rows[:len(JAVA_TABLE)]:  # the checked-in table is Java's
        assert table[hexkey] == (int(java_hash), tuple(int(p) for p in parts))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_java_producer_and_the_gateway_put_each_key_on_the_same_partition(
        bootstrap: str, node_factory: Callable[..., Node], make_topic: Callable[..., str]) -> None:
    if _java_classpath() is None:
        pytest.skip("no Kafka jars or no java")
    topic = make_topic(6)
    keys = TEXT_KEYS[:20]
    java = {r[0]: int(r[1]) for r in _java("produce", bootstrap, topic,
                                           *((k.encode().hex() or "-") for k in keys))}
    node = node_factory()
    with httpx.Client(base_url=node.url, timeout=30) as http:
        r = http.post("/produce", json={"topic": topic, "messages": [
            {"key": k, "value": "gateway"} for k in keys]})
        assert r.status_code == 200 and r.json()["failed"] == 0, r.text
        gateway = [x["partition"] for x in r.json()["results"]]
    assert gateway == [java[k.encode().hex() or "-"] for k in keys]
    assert len(set(gateway)) > 1  # the keys are spread, so the comparison says something
