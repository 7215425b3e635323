"""Per-queue views of a consumer's stored state: the figures ``GET /consumers/{c}/queues`` and
the backlog view (``/admin/backlog``, alerts) both show, computed here once. The API renders
them as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..store import OffsetStore, QueueState, now_ms


@dataclass(frozen=True, slots=True)
class QueueRow:
    topic: str
    queue: str
    #: The larger of the consumer's stored max and the topic's shared high watermark: the
    #: consumer's own max only moves when it polls, the shared watermarks keep moving.
    max_offset: int
    committed: int
    backlog: int  # records not yet committed (never negative)
    lock_age_ms: int | None  # None: never locked, or released
    token: int
    last_access_ms: int | None  # last lock or commit; None if never
    last_access_age_ms: int | None
    address: str | None  # the last fetching client's address

    def locked(self, timeout_ms: int) -> bool:
        """Held now: locked less than the consumer's consume timeout ago."""
        return self.lock_age_ms is not None and self.lock_age_ms < timeout_ms


def queue_row(q: QueueState, high_watermark: int, now: int) -> QueueRow:
    """One queue's row; ``high_watermark`` is the topic's shared one for the queue (0 if unknown)."""
    max_offset = max(q.max_offset, high_watermark)
    return QueueRow(
        topic=q.topic, queue=q.queue, max_offset=max_offset, committed=q.committed,
        backlog=max(0, max_offset - q.committed),
        # max(0, …): the relay parks a queue by setting its lock ahead (due - relay_lock_ms)
        lock_age_ms=max(0, now - q.lock_ms) if q.lock_ms else None, token=q.token,
        last_access_ms=q.access_ms or None,
        last_access_age_ms=(now - q.access_ms) if q.access_ms else None,
        address=q.address or None)


async def queue_rows(store: OffsetStore, consumer: str, client_id: str = "",
                     now: int | None = None) -> list[QueueRow]:
    """The rows of one consumer (or one of its broadcast clientIds), with the shared watermarks
    as they are stored (views do not refresh them)."""
    now = now_ms() if now is None else now
    states = await store.queue_states(consumer, client_id)
    shared = {t: await store.shared_watermarks(t) for t in {q.topic for q in states}}
    return [queue_row(q, shared[q.topic].get(q.queue, (0, 0))[1], now) for q in states]
