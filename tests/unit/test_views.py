"""Per-queue views (core/views.py): what an operator sees of a consumer, including one that
stopped polling while others keep the shared watermarks moving."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.consume_wire import queues_body
from gateway.broker.memory import MemoryBroker
from gateway.core.views import queue_rows

from .conftest import Clock, Gateway

pytestmark = pytest.mark.anyio

T = "orders"


async def test_an_idle_consumers_backlog_keeps_growing(make_gateway: Any, broker: MemoryBroker) -> None:
    broker.create(T, 2)
    gw: Gateway = make_gateway(start_position="latest")
    for consumer in ("idle", "busy"):
        assert (await gw.fetch(consumer)).status == "empty"  # both at latest (0)
    broker.append(T, "1", *[f"v{i}" for i in range(10)])
    assert (await gw.fetch("busy", wait_ms=2_000)).batch is not None  # lists the new watermarks
    rows = {r.queue: r for r in await queue_rows(gw.store, "idle")}
    assert (rows["1"].backlog, rows["1"].committed, rows["1"].max_offset) == (10, 0, 10)
    assert rows["0"].backlog == 0
    assert rows["1"].lock_age_ms is None and not rows["1"].locked(60_000)


async def test_a_held_lock_shows_its_age_client_and_first_token(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    broker.create(T, 1)
    broker.append(T, "0", "a", "b")
    await gw.store.set_config("c1", {"consume_timeout_ms": 60_000})
    got = await gw.fetch("c1", max_messages=1, address="10.1.2.3")
    assert got.batch is not None
    lock_ms = (await gw.store.queue_states("c1"))[0].lock_ms
    assert abs(lock_ms - clock.now_ms()) < 60_000  # the lock time is the clock's
    row, = await queue_rows(gw.store, "c1", now=lock_ms + 250)
    assert row.lock_age_ms == 250 and row.last_access_age_ms == 250
    assert row.locked(60_000) and not row.locked(200)
    assert row.address == "10.1.2.3" and row.backlog == 2
    # a queue's tokens start at (ms of its first lock) x 1000: this first lock ends in 001
    assert row.token % 1000 == 1 and abs(row.token // 1000 - lock_ms) < 60_000
    assert queues_body("c1", "", 60_000, [row])["queues"] == [{
        "topic": T, "queue": "0", "maxOffset": 2, "committedOffset": 0, "backlog": 2,
        "locked": True, "lockAgeMs": 250, "lockToken": row.token, "lastAccessMs": lock_ms,
        "lastAccessAgeMs": 250, "lastClientAddress": "10.1.2.3"}]
    await gw.consume.ack(got.batch.request_id)
    row, = await queue_rows(gw.store, "c1")
    assert row.lock_age_ms is None and row.committed == 1 and row.backlog == 1
