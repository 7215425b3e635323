"""Optional OpenTelemetry spans (gateway/core/spans.py), through the whole app in one process
(fakeredis, the memory broker) with the SDK's in-memory exporter: a produce's span is the
child of the request's context and is what its records carry; a fetch's span links to them; an
ack has its own span; off, the shared no-op context manager and nothing imported."""

from __future__ import annotations

import time
from typing import Any

import fakeredis
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.api.app import create_app
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core.spans import Spans

from .conftest import BASE_SETTINGS

pytestmark = pytest.mark.anyio
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_off_is_one_shared_no_op() -> None:
    spans = Spans(False)
    a, b = spans.span("x", "producer"), spans.span("y", "consumer")
    assert a is b
    with a as span:
        assert span.headers() == []
        span.link([])
        span.set("k", 1)


async def test_produce_fetch_and_ack_spans(redis: fakeredis.FakeAsyncRedis,
                                           broker: MemoryBroker) -> None:
    broker.create("orders", 1)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(Settings(**{**BASE_SETTINGS, "alert_interval_ms": 0, "relay": False}),
                     broker=broker, redis=redis)
    async with app.router.lifespan_context(app):
        app.state.services.spans = Spans(True, "memory", provider)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as http:
            r = await http.post("/produce", headers={"traceparent": PARENT},
                                json={"topic": "orders", "messages": [{"value": "a"},
                                                                      {"value": "b"}]})
            assert r.status_code == 200, r.text
            got: dict[str, Any] = (await http.get("/message", params={
                "consumer": "c", "topic": "orders", "max": 10})).json()
            r = await http.post("/ack", json={"requestId": got["requestId"]})
            assert r.status_code == 200
    spans = {s.name: s for s in exporter.get_finished_spans()}
    produce, fetch, ack = spans["orders publish"], spans["orders receive"], spans["mqgw ack"]
    assert produce.kind is SpanKind.PRODUCER and fetch.kind is SpanKind.CONSUMER
    assert ack.kind is SpanKind.CLIENT and ack.attributes["mqgw.ack.result"] == "committed"
    # the produce span is the request's child, and the records carry the produce span
    assert f"{produce.context.trace_id:032x}" == PARENT.split("-")[1]
    assert f"{produce.parent.span_id:016x}" == PARENT.split("-")[2]
    carried = {dict(m["headers"])["traceparent"] for m in got["messages"]}
    assert carried == {f"00-{produce.context.trace_id:032x}-{produce.context.span_id:016x}-01"}
    assert produce.attributes["messaging.batch.message_count"] == 2
    # the fetch links to the records' context (one per record)
    assert [link.context.span_id for link in fetch.links] == [produce.context.span_id] * 2
    assert fetch.attributes["messaging.consumer.group.name"] == "c"


async def test_a_relay_delivery_has_a_span_linked_to_its_records(
        redis: fakeredis.FakeAsyncRedis, broker: MemoryBroker) -> None:
    """The relay's delivery of delayed records is an INTERNAL span of its own (it runs long
    after the produce request ended), linked to the context each record carries."""
    import asyncio

    from gateway.broker import OutgoingMessage
    from gateway.services import close_services, open_services

    broker.create("orders", 1)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    s = await open_services(Settings(**{**BASE_SETTINGS, "delay_levels": "100ms,1s",
                                        "delay_topic_prefix": "d.", "relay": True}),
                            broker=broker, redis=redis, serve=False)
    try:
        assert s.relay is not None
        s.relay.spans = Spans(True, "memory", provider)
        carried = [("traceparent", PARENT.encode())]
        await s.delay.produce("orders", [OutgoingMessage(b"a", None, carried),
                                         OutgoingMessage(b"b", None, carried)],
                              [int(time.time() * 1000) + 250] * 2)
        for _ in range(1000):  # delivered in ~0.3 s
            if sum(len(q) for q in broker.logs["orders"].values()) == 2:
                break
            await asyncio.sleep(0.01)
    finally:
        await close_services(s)
    relayed = [x for x in exporter.get_finished_spans() if x.name == "mqgw relay deliver"]
    assert relayed, [x.name for x in exporter.get_finished_spans()]
    assert all(x.kind is SpanKind.INTERNAL for x in relayed)
    assert sum(x.attributes["messaging.batch.message_count"] for x in relayed) == 2
    links = [link.context for x in relayed for link in x.links]
    assert [f"{c.trace_id:032x}-{c.span_id:016x}" for c in links] == \
        ["-".join(PARENT.split("-")[1:3])] * 2
