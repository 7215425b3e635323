"""Offset checkpoints: cluster-mode committed offsets copied to the broker's consumer groups.

Redis holds the hot state. A Redis that restarts empty, a failover that loses the last writes
or an operator's FLUSHDB would otherwise send every consumer back to its ``start`` position,
which by default (``latest``) skips everything unread. Kafka keeps consumer offsets durably, so:

- **Save.** Every node runs :meth:`Checkpoints.run`; once per ``checkpoint_interval_ms`` one of
  them wins a lease (``SET NX PX``) and copies every cluster-mode queue whose committed offset
  moved since it was last copied (``com`` != ``ckp`` in the queue hash) to the consumer group
  ``<checkpoint_group_prefix><consumer>``, one offset commit (OffsetCommit) per consumer and
  topic, without joining the group. Kafka's tools then show the consumer and its lag.
- **Restore.** choose.lua answers "restore first" when a queue has no committed offset and the
  topic's checkpoint was never consulted (the ``<topic>:ckpt`` marker); :meth:`restore` reads
  the group's offsets and seeds the queues that still have none (restore.lua), then the fetch
  chooses again. After a loss the consumer redelivers at most what was acknowledged within one
  interval (plus a batch in flight); it never skips.
- **Reset.** An operator's reset is written to the checkpoint at once (:meth:`save_now`), so a
  later restore does not undo it.

Broadcast clientIds are not checkpointed: each would need a Kafka group of its own, they come
and go (they expire when idle), and a broadcast reader that restarts at ``start`` is what a
new clientId gets anyway. The README says so.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable

from ..broker import Broker, BrokerUnavailable, Capability
from ..config import Settings, node_id
from ..store import OffsetStore

log = logging.getLogger("mqgw.checkpoint")

#: Consumers and topics saved at once in a round (offset commits in flight).
_PARALLEL = 8


class Checkpoints:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker) -> None:
        self.store = store
        self.broker = broker
        self.interval_ms = settings.checkpoint_interval_ms
        self.prefix = settings.checkpoint_group_prefix
        self.enabled = self.interval_ms > 0 and Capability.OFFSET_CHECKPOINT in broker.capabilities
        self.node = f"{node_id()}:{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None
        self._names: Callable[[], Awaitable[Iterable[str]]] | None = None  # set by start()

    def group(self, consumer: str) -> str:
        """The broker's consumer group that holds ``consumer``'s checkpoint."""
        return self.prefix + consumer

    # -- restore and reset: on the request path ---------------------------------------------
    async def restore(self, consumer: str, topic: str) -> int:
        """Seed ``consumer``'s queues of ``topic`` that have no committed offset from its group;
        raises BrokerUnavailable (the fetch answers 503: better than skipping records)."""
        offsets = await self.broker.load_offsets(self.group(consumer), topic)
        seeded = await self.store.restore(consumer, topic, offsets)
        if seeded:
            log.warning("consumer %s resumed %d queue(s) of %s from the checkpoint in consumer "
                        "group %s (Redis had no offsets for them)", consumer, seeded, topic,
                        self.group(consumer))
        return seeded

    async def save_now(self, consumer: str, topic: str, offsets: dict[str, int]) -> bool:
        """Write offsets (an operator's reset) to the checkpoint at once; False if the broker
        failed (the next round retries: the queue's ``ckp`` still differs)."""
        if not self.enabled or not offsets:
            return False
        try:
            await self.broker.save_offsets(self.group(consumer), topic, offsets)
        except BrokerUnavailable as e:
            log.warning("checkpoint of %s on %s not written now (next round retries): %s",
                        consumer, topic, e)
            return False
        await self.store.mark_checkpointed(consumer, topic, offsets)
        return True

    async def forget(self, consumer: str) -> None:
        """The consumer's offsets were deleted: delete its group too, or a consumer of the same
        name would later resume from it."""
        if self.enabled:
            await self.broker.forget_offsets(self.group(consumer))

    # -- the periodic copy ------------------------------------------------------------------------
    def start(self, names: Callable[[], Awaitable[Iterable[str]]]) -> None:
        """Run rounds in the background; ``names`` is an async callable listing the consumer
        names to look at (registered and recently seen ones)."""
        self._names = names
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqgw-checkpoint")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                if await self.store.take_checkpoint_lease(self.node, self.interval_ms):
                    await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - Redis or the broker away: the next round retries
                log.warning("offset checkpoint round failed: %r", e)

    async def round(self, consumers: Iterable[str] | None = None) -> int:
        """Copy every moved cluster-mode offset of ``consumers`` (default: the names given to
        :meth:`start`) to the broker; how many queues were copied."""
        if consumers is None:
            if self._names is None:
                return 0
            consumers = await self._names()
        names = sorted(consumers)
        moved: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
        for c in await self.store.read_consumers(names):
            for q in c.queues:
                # has_offset: a hash that only holds ckp (Redis emptied while a round ran) is no
                # reason to write 0 over the checkpoint
                if q.has_offset and q.committed != q.checkpointed:
                    moved[(c.group, q.topic)][q.queue] = q.committed
        sem = asyncio.Semaphore(_PARALLEL)

        async def one(consumer: str, topic: str, offsets: dict[str, int]) -> int:
            async with sem:
                try:
                    await self.broker.save_offsets(self.group(consumer), topic, offsets)
                except Exception as e:  # noqa: BLE001 - one group failing stops no other
                    log.warning("checkpoint of %s on %s failed: %r", consumer, topic, e)
                    return 0
                await self.store.mark_checkpointed(consumer, topic, offsets)
                return len(offsets)

        done = await asyncio.gather(*(one(g, t, o) for (g, t), o in moved.items()))
        return sum(done)
