"""The broker port: any adapter behind it serves the whole API, and a requestId acks only on the
broker it was issued for. The in-memory broker stands in for a second broker here: a gateway
node runs on it (``MQGW_BROKER=memory``) with nothing Kafka-specific in its path."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.broker import QUEUE_ID, Capability, OutgoingMessage, SkipReason, check_queue_id
from gateway.broker.kafka import KafkaBroker
from gateway.broker.memory import MemoryBroker
from gateway.core.errors import Invalid
from gateway.core.fetch import FetchParams
from gateway.core.requestid import BatchRef, RequestIdCodec

from ..support import Wire, run_service, start_node, unique

#: the broker adapter itself: run on every broker (tests/conftest.py)
pytestmark = pytest.mark.every_broker

T = "orders"


@pytest.mark.timeout(90)
def test_a_node_on_the_memory_broker_serves_produce_fetch_ack(redis_url: str, tmp_path: Path) -> None:
    # The memory broker lives in the worker's memory: one worker, and any bootstrap (never used).
    topic = unique("t")
    node = start_node(redis_url, "127.0.0.1:1", tmp_path, broker="memory", memory_topics=f"{topic}:4")
    try:
        with httpx.Client(base_url=node.url, timeout=30) as h:
            g = unique()
            r = h.post("/produce", json={"topic": topic, "messages": [
                {"key": "k", "value": "a"}, {"key": "k", "value": "b"}, {"value": "c", "partition": 3}]})
            assert r.status_code == 200 and r.json()["failed"] == 0, r.text
            results = r.json()["results"]
            assert results[0]["partition"] == results[1]["partition"]  # same key, same queue
            assert results[2] == {"partition": 3, "offset": 0}
            assert h.patch(f"/admin/consumers/{g}", json={"start": "earliest"}).status_code == 200
            seen: list[str] = []
            for _ in range(10):
                m = h.get("/message", params={"consumer": g, "topic": topic, "wait_ms": 1000}).json()
                if m["status"] == "empty":
                    break
                assert m["broker"] == "memory"
                seen += [x["value"] for x in m["messages"]]
                assert h.post("/ack", json={"requestId": m["requestId"]}).json()["result"] == "committed"
            assert sorted(seen) == ["a", "b", "c"]
            # a topic the broker does not have: refused on both paths, never created by a read
            assert h.post("/produce", json={"topic": "nope", "value": "x"}).status_code == 404
            r = h.get("/message", params={"consumer": g, "topic": "nope"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_topic"
    finally:
        node.stop()


def test_an_ack_names_the_broker_its_batch_came_from(redis_url: str) -> None:
    """A requestId signed with the same key but issued for another broker (a gateway of another
    deployment sharing the key) must not commit offsets here."""
    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", "x")
    g = unique()

    async def body(svc: Wire) -> None:
        first = await svc.fetch(FetchParams(g, "", T, 10, 0, "test"))
        ref = RequestIdCodec("k").decode(first["requestId"])
        assert ref.broker == "memory"
        other = RequestIdCodec("k").encode(BatchRef("rocketmq", *_fields(ref)))
        with pytest.raises(Invalid) as e:
            await svc.ack(other)
        assert e.value.code == "invalid_request_id" and "rocketmq" in e.value.message
        assert (await svc.ack(first["requestId"])).result == "committed"
    run_service(redis_url, b, body)


def _fields(ref: BatchRef) -> list[Any]:
    return [ref.consumer, ref.client_id, ref.topic, ref.queue, ref.offset, ref.next_offset, ref.token,
            ref.high_watermark]


def test_the_memory_broker_reports_what_it_skipped_and_where_to_go_on() -> None:
    async def body() -> None:
        b = MemoryBroker()
        b.create(T, 1)
        b.append(T, "0", *"abcdef")  # offsets 0..5
        b.remove(T, "0", 1, 2)  # compacted away
        r = await b.fetch(T, "0", 1, 10)
        assert [x.offset for x in r.records] == [3, 4, 5] and r.next_offset == 6
        assert r.skipped is not None and (r.skipped.start, r.skipped.end) == (1, 3)
        assert r.skipped.reason is SkipReason.GAP
        b.delete_before(T, "0", 4)  # retention
        r = await b.fetch(T, "0", 0, 1)
        assert [x.offset for x in r.records] == [4] and r.next_offset == 5
        assert r.skipped is not None and r.skipped.reason is SkipReason.OUT_OF_RETENTION
        b.append(T, "0", "g")  # offset 6
        b.remove(T, "0", 6)  # the tail compacted: nothing readable, yet the log ends at 7
        r = await b.fetch(T, "0", 6, 10)
        assert r.records == [] and r.next_offset == 7 and r.skipped is not None
        assert r.skipped.reason is SkipReason.NO_RECORDS
        r = await b.fetch(T, "0", 7, 10)  # at the end: nothing, nowhere to move
        assert r.records == [] and r.next_offset == 7 and r.skipped is None
        sent = await b.produce(T, [OutgoingMessage(b"v", queue="9")])
        assert sent[0].error_code == "unknown_partition"
    asyncio.run(body())


def test_queue_ids_and_capabilities_are_part_of_the_port() -> None:
    for good in ("0", "15", "broker-a.3", "q_1"):
        assert check_queue_id(good) == good
    for bad in ("", "a:b", "a,b", "x" * 65, "é"):
        assert not QUEUE_ID.fullmatch(bad)
        with pytest.raises(ValueError):
            check_queue_id(bad)
    assert Capability.DELAYED_DELIVERY not in KafkaBroker.capabilities
    assert Capability.DELAYED_DELIVERY not in MemoryBroker.capabilities
