"""What trace context and OpenTelemetry spans cost a produce and a fetch (issue 36).

Three numbers, alternated in one run (the machine's speed drifts): the off path's own work per
request (reading the trace headers, ``trace.stamp`` and the shared no-op span: timeit), and
``POST /produce`` + ``GET /message`` + ``POST /ack`` through the whole app in one process
(memory broker, fakeredis: no network, so the gateway's own CPU is all there is) with
``otel_tracing`` off and on (the SDK recording every span, exported nowhere).

    .venv/bin/python bench/spans_cost.py [--rounds 5 --requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit

import fakeredis
import httpx
from opentelemetry.sdk.trace import TracerProvider

from gateway.api.app import create_app
from gateway.broker import OutgoingMessage
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core import trace
from gateway.core.spans import Spans

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def off_path_us(parent: str | None) -> float:
    """The added work per request with tracing off (``parent``: the traceparent sent)."""
    spans = Spans(False)
    msgs = [OutgoingMessage(b"v")]

    def once() -> None:
        ctx = trace.context_headers(parent, None)
        with spans.span("t publish", "producer", ctx) as span:
            trace.stamp(msgs, span.headers() or ctx)
    n = 200_000
    return min(timeit.repeat(once, number=n, repeat=5)) / n * 1e6


async def requests_us(on: bool, n: int) -> float:
    """µs per produce + fetch + ack through the app."""
    broker = MemoryBroker()
    broker.create("t", 1)
    settings = Settings(broker="memory", open_mode=True, auth=False, relay=False,
                        alert_interval_ms=0, checkpoint_interval_ms=0, access_log=False,
                        start_position="earliest", metadata_refresh_ms=1,
                        hmac_key="bench-spans-key-0123456789abcdef")
    app = create_app(settings, broker=broker, redis=fakeredis.FakeAsyncRedis())
    async with app.router.lifespan_context(app):
        if on:
            app.state.services.spans = Spans(True, "memory", TracerProvider())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as http:
            start = time.perf_counter()
            for _ in range(n):
                await http.post("/produce", json={"topic": "t", "value": "v"},
                                headers={"traceparent": PARENT})
                got = (await http.get("/message", params={"consumer": "c", "topic": "t",
                                                          "wait_ms": 1000})).json()
                await http.post("/ack", json={"requestId": got["requestId"]})
            return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=300)
    a = ap.parse_args()
    print(f"off path: {off_path_us(None):.2f} us per request without a traceparent, "
          f"{off_path_us(PARENT):.2f} us with one")
    off, on = [], []
    for _ in range(a.rounds):  # alternated
        off.append(asyncio.run(requests_us(False, a.requests)))
        on.append(asyncio.run(requests_us(True, a.requests)))
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"produce+fetch+ack: off {mo:.0f} us, on {mn:.0f} us (on/off {mn / mo:.2f}x; "
          f"rounds off {[round(x) for x in off]}, on {[round(x) for x in on]})")


if __name__ == "__main__":
    main()
