"""What only Apache Kafka can show, asserted exactly through the gateway (issue 11).

Tansu has no DeleteRecords and no CreatePartitions, and its ListOffsets and timestamp look-ups
are batch-grained (README.md, Known limitations), so these run in the Apache Kafka pass of
``make test`` (``MQGW_TEST_BROKER=kafka``) and are skipped on Tansu; the test double covers the
same rules on every pass (tests/unit/test_consume.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from gateway.broker.kafka.fetch import PARK_AFTER_S

from ..support import ON_TANSU, Api, unique

pytestmark = pytest.mark.skipif(ON_TANSU,
                                reason="Apache Kafka only (DeleteRecords, CreatePartitions, exact "
                                       "ListOffsets): run with MQGW_TEST_BROKER=kafka")


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def _earliest(api: Api, group: str, topic: str) -> None:
    r = api.http.post(api.url(f"/admin/consumers/{group}/reset"), json={"topic": topic, "to": "earliest"})
    assert r.status_code == 200, r.text


def _fetch(api: Api, **params: Any) -> dict[str, Any]:
    params.setdefault("wait_ms", 5000)
    r = api.message(**params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_delete_records_is_an_out_of_retention_skip(api: Api, bootstrap: str,
                                                    make_topic: Callable[..., str]) -> None:
    from confluent_kafka import TopicPartition

    topic = make_topic(1)
    g = unique()
    api.produce(topic, [f"v{i}" for i in range(20)], partition=0)
    _earliest(api, g, topic)
    first = _fetch(api, consumer=g, topic=topic, max=5)
    assert [m["value"] for m in first["messages"]] == [f"v{i}" for i in range(5)]
    assert api.ack(first["requestId"]).json()["result"] == "committed"
    admin = _admin(bootstrap)  # kept: its futures complete only while the client lives
    for f in admin.delete_records([TopicPartition(topic, 0, 12)]).values():
        f.result(30)
    # A pooled fetch consumer may still hold v5.. prefetched from before the deletion and would
    # hand them out, as any Kafka consumer that already fetched them would. Once unused for
    # PARK_AFTER_S it lets go of the partition, and the next read asks the broker.
    time.sleep(PARK_AFTER_S * 2)
    after = _fetch(api, consumer=g, topic=topic, max=5)
    assert after["skipped"] == {"from": 5, "to": 12, "reason": "out_of_retention"}, after
    assert [m["value"] for m in after["messages"]] == [f"v{i}" for i in range(12, 17)]
    assert after["offset"] == 5 and after["nextOffset"] == 17  # offset: the committed one


def test_new_partitions_are_read_without_a_restart(api: Api, bootstrap: str,
                                                   make_topic: Callable[..., str]) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewPartitions

    topic = make_topic(2)
    g = unique()
    api.config(g, start="earliest")  # a queue it has not read yet starts at its beginning
    assert _fetch(api, consumer=g, topic=topic, wait_ms=0)["status"] == "empty"
    admin = _admin(bootstrap)  # kept: its futures complete only while the client lives
    for f in admin.create_partitions([NewPartitions(topic, 4)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "topic.metadata.refresh.interval.ms": 500})
    deadline = time.monotonic() + 30
    while True:  # the producer learns of the new partition from a metadata refresh
        try:
            p.produce(topic, b"in-new", partition=3)
            break
        except Exception:  # noqa: BLE001 - unknown partition until then
            assert time.monotonic() < deadline, "the producer never saw partition 3"
            p.poll(0.2)
    assert p.flush(30) == 0
    got: list[str] = []
    deadline = time.monotonic() + 30  # the gateway looks for new partitions every 5 s
    while not got and time.monotonic() < deadline:
        body = _fetch(api, consumer=g, topic=topic)
        if body["status"] == "ok":
            assert body["queue"] == "3", body
            got = [m["value"] for m in body["messages"]]
    assert got == ["in-new"]


def test_timestamp_reset_is_exact(api: Api, make_topic: Callable[..., str]) -> None:
    """Kafka answers a timestamp look-up with the first record at or after it, even inside a
    batch (Tansu: the batch's first offset), and -1 past the last record (Tansu: 0)."""
    topic = make_topic(1)
    g = unique()
    base = int(time.time() * 1000) - 60_000
    msgs = [{"value": f"t{i}", "partition": 0, "timestamp": base + 1000 * i} for i in range(10)]
    r = api.http.post(api.url("/produce"), json={"topic": topic, "messages": msgs})  # one batch
    assert r.status_code == 200 and r.json()["failed"] == 0, r.text
    reset = api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                          json={"topic": topic, "to": "timestamp", "timestamp": base + 6500})
    assert reset.status_code == 200, reset.text
    assert [q["to"] for q in reset.json()["queues"]] == [7]
    assert [m["value"] for m in _fetch(api, consumer=g, topic=topic, max=2)["messages"]] == ["t7", "t8"]
    late = api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                         json={"topic": topic, "to": "timestamp", "timestamp": base + 3_600_000})
    assert late.status_code == 200, late.text
    assert [q["to"] for q in late.json()["queues"]] == [10]  # the end: nothing at or after it


def test_aborted_transactions_are_read_past(api: Api, bootstrap: str,
                                            make_topic: Callable[..., str]) -> None:
    """Offsets taken by aborted records and transaction markers are holes the gateway reads
    past; only committed records are delivered (the fetch consumers read committed)."""
    from confluent_kafka import Producer

    topic = make_topic(1)
    g = unique()
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("tx")})
    p.init_transactions(30)
    for batch, commit in (("a", True), ("x", False), ("b", True), ("y", False)):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, f"{batch}{i}".encode(), partition=0)
        assert p.flush(30) == 0  # written to the log first: an abort would otherwise only
        (p.commit_transaction if commit else p.abort_transaction)(30)  # drop them locally
    _earliest(api, g, topic)
    got: list[str] = []
    batches = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body = _fetch(api, consumer=g, topic=topic, max=100, wait_ms=0)
        if body["status"] != "ok":
            break
        batches += 1
        got += [m["value"] for m in body["messages"]]
        assert api.ack(body["requestId"]).json()["result"] == "committed"
    assert got == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert batches == 1  # the holes are final on Kafka: no batch ends at one, nothing re-read
    # 12 records and 4 markers: every offset up to the end is committed, none re-read
    q = api.http.get(api.url(f"/consumers/{g}/queues")).json()
    assert [(row["committedOffset"], row["backlog"]) for row in q["queues"]
            if row["topic"] == topic] == [(16, 0)], q


def test_compacted_topic_is_read_across_its_holes(api: Api, bootstrap: str) -> None:
    """Offsets removed by compaction are holes inside the log: one fetch returns every record
    left, in one batch (no batch ends at a hole, no hole is looked at twice), and the ack
    commits past the end."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from gateway.cli.devstack import create_topic

    topic, g = unique("compact"), unique()
    # Segments roll 100 ms after their first record, and the cleaner (backoff 1 s on the test
    # broker, 15 s by default) cleans every segment but the active one.
    create_topic(bootstrap, topic, 1, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for k, v in (("k0", "a"), ("k1", "a"), ("k1", "b"), ("k2", "a"), ("k2", "b"), ("k3", "a")):
        p.produce(topic, v.encode(), k.encode(), partition=0)
    assert p.flush(30) == 0
    time.sleep(0.3)
    p.produce(topic, b"z", b"kz", partition=0)  # rolls the segment: the first one can be cleaned
    assert p.flush(30) == 0

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("raw"),
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        deadline = time.monotonic() + 90
        offsets: list[int] = []
        while offsets != [0, 2, 4, 5, 6]:  # offsets 1 and 3 held superseded values of k1, k2
            assert time.monotonic() < deadline, f"never compacted: {offsets}"
            time.sleep(0.5)
            c.assign([TopicPartition(topic, 0, 0)])
            offsets = []
            while True:
                m = c.poll(5)
                if m is None or m.error():
                    break
                offsets.append(m.offset())
    finally:
        c.close()

    _earliest(api, g, topic)
    body = _fetch(api, consumer=g, topic=topic, max=100)
    assert [(m["key"], m["value"]) for m in body["messages"]] == [
        ("k0", "a"), ("k1", "b"), ("k2", "b"), ("k3", "a"), ("kz", "z")], body
    assert "skipped" not in body and body["nextOffset"] == 7
    assert api.ack(body["requestId"]).json()["committedOffset"] == 7
    assert _fetch(api, consumer=g, topic=topic, wait_ms=0)["status"] == "empty"
