"""Delayed records in Redis: the relay's settle, cancel marks, and relay wake-ups.

The records themselves live in the broker (level topics, core/wheel.py); Redis holds only what
must be decided once across nodes: which relay holds a level queue (the consume path's lock,
``relay_settle.lua`` to commit and park it), whether a cancel came before the delivery
(``delay_marks.lua``: a mark per cancelled record, nothing per delivered one), and a channel
that tells every relay a level topic was just written to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum

from redis.asyncio import Redis

from . import scripts
from .connect import UNAVAILABLE, text
from .keys import KeyLayout

log = logging.getLogger("mqgw.delay")

#: After a lost subscription, subscribe again this soon (relays poll meanwhile).
_RESUBSCRIBE_S = 1.0


class Settled(str, Enum):
    """What relay_settle.lua decided, the first element of its reply."""

    SETTLED = "settled"  # committed, and the queue freed or parked
    LOCK_LOST = "lock_lost"  # the lock expired and another relay took the queue
    OFFSET_MISMATCH = "offset_mismatch"  # the committed offset moved (a reset) since the read
    UNKNOWN = "unknown"  # the relay's hash has no such queue (Redis lost it)


class CancelOutcome(str, Enum):
    """What delay_marks.lua decided about a cancel (its whole reply)."""

    CANCELLED = "cancelled"  # now
    ALREADY_CANCELLED = "already_cancelled"  # by an earlier cancel (nothing changed)
    DELIVERED = "delivered"  # the relay delivered it before its cancel window closed
    TOO_LATE = "too_late"  # the cancel window closed: delivered, or on its way


class DelayStore:
    def __init__(self, redis: Redis, layout: KeyLayout) -> None:
        self._redis = redis
        self._keys = layout
        self._settle = scripts.register(redis, "relay_settle")
        self._marks = scripts.register(redis, "delay_marks")

    async def settle(self, queues_key: str, topic: str, queue: str, offset: int, next_offset: int,
                     token: int, park_until_ms: int, lock_timeout_ms: int) -> Settled:
        """Commit ``[offset, next_offset)`` and free the queue, or keep it locked until
        ``park_until_ms`` (when its head is due)."""
        r = await self._settle(keys=[queues_key], args=[f"{topic}:{queue}:", offset, next_offset,
                                                         token, park_until_ms, lock_timeout_ms])
        return Settled(text(r[0]))

    async def cancel(self, delay_id: str, due_ms: int, cutoff_ms: int,
                     expire_at_ms: int) -> CancelOutcome:
        """Cancel a delayed record due at ``due_ms`` unless it was delivered or is due within
        ``cutoff_ms`` (Redis' clock); the mark lives until ``expire_at_ms``."""
        r = await self._marks(keys=[self._keys.delay_mark(delay_id)],
                              args=["cancel", due_ms, cutoff_ms, expire_at_ms])
        return CancelOutcome(text(r))

    async def deliver(self, records: list[tuple[str, int]], cutoff_ms: int) -> set[int]:
        """Before records (``(id, due ms)`` each) are written to their topics: the indexes of
        those cancelled, which must not be. Writes nothing for the others (unless the caller's
        clock runs ahead of Redis' by more than ``cutoff_ms``, see delay_marks.lua)."""
        if not records:
            return set()
        r = await self._marks(keys=[self._keys.delay_mark(i) for i, _ in records],
                              args=["deliver", cutoff_ms, *(due for _, due in records)])
        return {int(i) - 1 for i in r}

    async def poke(self, written: dict[str, dict[str, int]]) -> None:
        """Tell every relay which level queues were written to, up to which offset
        (``{topic: {queue: high watermark}}``): their cached watermarks may be older."""
        if written:
            await self._redis.publish(self._keys.delay_poke(), ",".join(
                f"{t}:{q}:{hi}" for t, qs in written.items() for q, hi in qs.items()))

    async def listen(self, on_poke: Callable[[dict[str, dict[str, int]]], None]) -> None:
        """Run until cancelled, calling ``on_poke`` with what each notice says was written."""
        channel = self._keys.delay_poke()
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(channel)
                async for msg in pubsub.listen():
                    if msg["type"] == "message":
                        written: dict[str, dict[str, int]] = {}
                        for item in text(msg["data"]).split(","):
                            t, q, hi = item.rsplit(":", 2)
                            written.setdefault(t, {})[q] = int(hi)
                        on_poke(written)
            except asyncio.CancelledError:
                raise
            except (*UNAVAILABLE, AttributeError, NotImplementedError) as e:  # type: ignore[misc]
                log.warning("relay wake-up channel lost (%r); subscribing again", e)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001 - the connection may already be gone
                    pass
            await asyncio.sleep(_RESUBSCRIBE_S)
