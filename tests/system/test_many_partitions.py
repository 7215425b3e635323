"""A topic of thousands of partitions on a real redis-server: Lua's unpack stops at 8,000
values (LUAI_MAXCSTACK), and choose.lua (4 fields a queue) and the watermark refresh (4 values
a queue) unpacked one list per call, so at 2,000 partitions and more every ``/message`` failed
("too many results to unpack", found by bench/choose_cost.py at 4,096). The prelude's
``hmget_list`` and ``hset_pairs`` send such commands in slices."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import Lock, OffsetStore

from ..support import unique

QUEUES = 4096


@pytest.mark.timeout(60)
def test_choose_and_the_watermark_refresh_over_4096_partitions(redis_url: str) -> None:
    async def main() -> None:
        store = OffsetStore.connect(redis_url, unique("many"))
        try:
            topic, consumer = unique("t"), unique("g")
            wm = {str(q): (0, 10 + q) for q in range(QUEUES)}
            await store.write_watermarks(topic, wm)
            assert await store.shared_watermarks(topic) == wm
            kw = dict(address="test", default_timeout_ms=60_000, default_start="earliest",
                      client_idle_ms=60_000, max_messages=10)
            lock = await store.choose(consumer, "", topic, wm, **kw)  # type: ignore[arg-type]
            assert isinstance(lock, Lock) and lock.queue == str(QUEUES - 1)  # the most backlog
            assert lock.committed == 0 and not lock.redeliver_below
            # every queue was given its committed offset and max in one call
            states = await store.queue_states(consumer)
            assert len(states) == QUEUES and {s.max_offset - s.committed for s in states} == \
                {10 + q for q in range(QUEUES)}
            again = await store.choose(consumer, "", topic, wm, **kw)  # type: ignore[arg-type]
            assert isinstance(again, Lock) and again.queue == str(QUEUES - 2)
        finally:
            await store.aclose()
    asyncio.run(main())
