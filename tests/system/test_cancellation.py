"""A task cancelled inside store calls always ends (issue 32): the real redis-server, because the
lost cancel needs a socket answering in the same loop turn as the cancel (gateway/aio.py).

Before the fix (Python 3.11, redis-py 8's ``wait_for`` around every command's write) most
single cancels of such a task were swallowed: 212 of 300 here, and a node's stop hung on its
alerts task. A cancel lands at a random point of a loop of store calls: a script (the ack's
path), a hash read and a write, each on a connection that the previous cancel may have dropped
(so connects and their handshakes are cancelled too)."""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.store import OffsetStore

pytestmark = pytest.mark.timeout(300)

CANCELS = 2000
#: A cancelled task that has not ended after this long swallowed its cancel: a task that is
#: cancelled ends at its next step, milliseconds later, whatever the load.
ENDS_WITHIN_S = 10.0


async def _store_calls(store: OffsetStore, started: asyncio.Event) -> None:
    started.set()
    while True:
        await store.ping()
        await store.get_config("cancel-probe")
        await store.set_config("cancel-probe", {"x": 1})


async def _cancel_many(redis_url: str) -> list[int]:
    store = OffsetStore.connect(redis_url, prefix="mqgw-cancel", max_connections=8)
    rng = random.Random(32)
    lost: list[int] = []
    try:
        for i in range(CANCELS):
            started = asyncio.Event()
            task = asyncio.create_task(_store_calls(store, started))
            await started.wait()
            await asyncio.sleep(rng.random() * 0.002)
            task.cancel()  # once: the point is that one cancel is enough
            done, _ = await asyncio.wait([task], timeout=ENDS_WITHIN_S)
            if not done or not task.cancelled():
                lost.append(i)
                while not task.done():  # clean up for the next round
                    task.cancel()
                    await asyncio.wait([task], timeout=0.1)
    finally:
        await store.aclose()
    return lost


def test_a_task_cancelled_inside_store_calls_always_ends(redis_url: str) -> None:
    lost = asyncio.run(_cancel_many(redis_url))
    assert lost == [], f"{len(lost)} of {CANCELS} cancels were swallowed (first: {lost[:10]})"
