"""Piggy-backed fetches through the core alone: ConsumeService + the offset store + its Lua
scripts + the JSON body, over real Redis and a stub broker (no HTTP, no Kafka), N in a row.
It tells a slower consume path from a slower HTTP layer or broker in a before/after run:

    redis-server --port 6399 --save '' --daemonize yes
    .venv/bin/python bench/core_piggyback.py after  redis://127.0.0.1:6399/0
    .venv/bin/python bench/core_piggyback.py before redis://127.0.0.1:6399/0 /tmp/before

``before`` imports the flat layout of eae74be (gateway/consume.py ...) from the given tree,
``after`` this checkout's layers.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

N = 3000
QUEUES = ["0", "1", "2", "3"]


async def main(which: str, url: str) -> None:
    import redis.asyncio as aioredis

    from gateway.broker import Broker, FetchResult, Record
    from gateway.config import Settings

    if which == "before":
        from gateway.auth import Authorizer, KeyStore  # type: ignore[import-not-found]
        from gateway.consume import ConsumeService, FetchParams  # type: ignore[import-not-found]
        from gateway.requestid import RequestIdCodec  # type: ignore[import-not-found]
        from gateway.watermarks import Watermarks  # type: ignore[import-not-found]
    else:
        from gateway.api.consume_wire import fetched_body
        from gateway.core.auth import Authorizer, KeyStore
        from gateway.core.consume import ConsumeService
        from gateway.core.fetch import FetchParams
        from gateway.core.requestid import RequestIdCodec
        from gateway.core.watermarks import Watermarks
    from gateway.store import OffsetStore

    class Stub(Broker):
        name = "kafka"

        async def queues(self, topic: str) -> list[str]:
            return QUEUES

        async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
            return {q: (0, 10**9) for q in QUEUES}

        async def offset_for_time(self, *a: Any) -> int:
            return 0

        async def fetch(self, topic: str, queue: str, offset: int, n: int) -> Any:
            recs = [Record(offset + i, None, b"x" * 100, [], 0) for i in range(n)]
            if which == "before":
                return FetchResult(recs, 10**9)  # type: ignore[arg-type]
            return FetchResult(recs, offset + n, 10**9)

        async def produce(self, *a: Any) -> list[Any]:
            return []

    def params(rid: str) -> Any:
        if which == "before":
            return FetchParams("g", "", "t", 32, 0, "utf8", "x", rid)  # type: ignore[call-arg]
        return FetchParams("g", "", "t", 32, 0, "x", rid)

    r = aioredis.Redis.from_url(url)
    b = Stub()
    store = OffsetStore(r, f"micro-{which}-{os.getpid()}")
    s = Settings(open_mode=True, auth=False, start_position="earliest")
    svc = ConsumeService(s, store, b, Watermarks(store, b, 10_000), RequestIdCodec("k"),
                         Authorizer(False, KeyStore(store)))
    rid = ""
    t0 = time.perf_counter()
    for _ in range(N):
        res = await svc.fetch(params(rid))
        if which == "before":
            rid = res["requestId"]
        else:
            fetched_body(res, "kafka", "utf8")
            rid = res.batch.request_id
    dt = time.perf_counter() - t0
    print(f"{which}: {N / dt:.0f} piggy-backed fetches/s, {1e6 * dt / N:.0f} us each")
    await r.aclose()


if __name__ == "__main__":
    which, url = sys.argv[1], sys.argv[2]
    sys.path.insert(0, sys.argv[3] if len(sys.argv) > 3 else str(Path(__file__).resolve().parent.parent))
    asyncio.run(main(which, url))
