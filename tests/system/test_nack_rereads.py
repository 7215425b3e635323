"""The nack rules that need no processes, over the broker double; Redis is the real redis-server.
End to end, on both real brokers: test_retry.py."""

from __future__ import annotations

from gateway.broker import FetchResult
from gateway.broker.memory import MemoryBroker

from ..support import Wire, fetch_params, run_service, unique

T = "orders"


class SlowReads(MemoryBroker):
    """A broker whose next ``empty`` reads come back with nothing, as a busy broker's fetch at
    an explicit offset can (it answers what is readable now)."""

    def __init__(self) -> None:
        super().__init__()
        self.empty = 0

    async def fetch(self, topic: str, queue: str, offset: int, max_records: int,
                    tags: frozenset[str] | None = None, max_bytes: int = 0) -> FetchResult:
        if self.empty > 0:
            self.empty -= 1
            return FetchResult([], offset, -1)
        return await super().fetch(topic, queue, offset, max_records, tags, max_bytes)


def test_a_read_back_that_comes_back_empty_is_asked_again_not_committed_unretried(
        redis_url: str) -> None:
    """Before: the nack took an empty read back for the end of the batch, retried nothing and
    committed it: the failed record was lost (the soak lost 2-13 records so under load)."""
    from gateway.config import Settings
    from gateway.core.delay import DelayService
    from gateway.core.nack import NackService

    b = SlowReads()
    b.create(T, 1)
    b.append(T, "0", "a", "b", "c")
    g = unique()

    async def body(w: Wire) -> None:
        batch = await w.fetch(fetch_params(g, topic=T, max_messages=10))
        assert [m["value"] for m in batch["messages"]] == ["a", "b", "c"]
        settings = Settings(open_mode=True, auth=False, relay=False)
        nack = NackService(settings, w.store, b, w.svc, DelayService(settings, w.store, b))
        b.empty = 2
        out = await nack.fail(batch["requestId"], {1: 0})
        assert [r.offset for r in out.retried] == [1], out
        assert out.ack.result.value == "committed"
        held = [r.value for r in (await b.fetch(out.retry_topic, "0", 0, 10)).records]
        assert held == [b"b"]

    run_service(redis_url, b, body)
