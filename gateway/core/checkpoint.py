"""Offset checkpoints: cluster-mode committed offsets copied to the broker's consumer groups.

Redis holds the hot state. A Redis that restarts empty, a failover that loses the last writes
or an operator's FLUSHDB would otherwise send every consumer back to its ``start`` position,
which by default (``latest``) skips everything unread. Kafka keeps consumer offsets durably, so:

- **Save.** Every node runs :meth:`Checkpoints.run`; once per ``checkpoint_interval_ms`` one of
  them wins a lease (``SET NX PX``) and copies every cluster-mode queue whose committed offset
  moved since it was last copied (``com`` != ``ckp`` in the queue hash) to the consumer group
  ``<checkpoint_group_prefix><consumer>``, one offset commit (OffsetCommit) per consumer and
  topic, without joining the group. Kafka's tools then show the consumer and its lag.
- **Restore.** choose.lua never gives a cluster-mode queue its first committed offset: it
  answers "restore first", and :meth:`restore` reads the group's offsets, writes the start
  position of every queue the group lacks to the group *before* Redis gets it, and seeds the
  queues that still have none (restore.lua); then the fetch chooses again. So every position a
  consumer ever had in Redis is in the broker too, from a queue's first fetch on: a Redis lost
  before the first checkpoint round (a new consumer, a new partition) resumes where the
  consumer was, not at the end of the log (60 of 100 records were skipped that way). After a
  loss the consumer redelivers at most what was acknowledged within one interval (plus a batch
  in flight); it never skips. The locks that flag redeliveries went with Redis, so a restored
  queue flags every batch below the log's end at the restore (``rdl``) as ``redelivered``: a
  client that deduplicates on the flag stays correct (it may look up a few that were not).
  A start position another node's restore is writing at the same moment is not such a loss: it
  is noted in Redis (``sta``) before the broker gets it, and restore.lua does not flag it.
  Restores are single-flight per consumer and topic in a process: a herd of first polls (a
  fleet starting, every consumer after Redis was emptied) makes one pair of broker calls per
  consumer and topic, not one per poll.
- **Reset.** An operator's reset is written to the checkpoint at once (:meth:`save_now`), so a
  later restore does not undo it.

Broadcast clientIds are not checkpointed: each would need a Kafka group of its own, they come
and go (they expire when idle), and a broadcast reader that restarts at ``start`` is what a
new clientId gets anyway. docs/architecture.md says so.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable

from ..aio import stop_task
from ..broker import Broker, BrokerUnavailable, Capability
from ..config import Settings, node_id
from ..store import OffsetStore

log = logging.getLogger("mqgw.checkpoint")

#: Consumers and topics saved at once in a round (offset commits in flight).
_PARALLEL = 8
#: How often a round looks for busy consumers (``checkpoint_busy_records``).
BUSY_TICK_MS = 1000


class Checkpoints:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 on_restore: Callable[[int, int], None] | None = None) -> None:
        self.store = store
        #: Told of each restore: (queues resumed from the checkpoint, new queues) (metrics).
        self.on_restore = on_restore
        self.broker = broker
        self.interval_ms = settings.checkpoint_interval_ms
        self.busy_records = settings.checkpoint_busy_records
        self.prefix = settings.checkpoint_group_prefix
        self.enabled = self.interval_ms > 0 and Capability.OFFSET_CHECKPOINT in broker.capabilities
        self.node = f"{node_id()}:{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None
        self._names: Callable[[], Awaitable[Iterable[str]]] | None = None  # set by start()
        #: Restores running in this process, by (consumer, topic): shared by concurrent polls.
        self._restoring: dict[tuple[str, str], asyncio.Future[int]] = {}

    def group(self, consumer: str) -> str:
        """The broker's consumer group that holds ``consumer``'s checkpoint."""
        return self.prefix + consumer

    # -- restore and reset: on the request path ---------------------------------------------
    async def restore(self, consumer: str, topic: str, start: str,
                      watermarks: dict[str, tuple[int, int]]) -> int:
        """Seed ``consumer``'s queues of ``topic`` that have no committed offset from its group;
        queues the group lacks start at ``start`` (of ``watermarks``: ``{queue: (lo, hi)}``),
        written to the group first. Single-flight per consumer and topic: concurrent callers
        share one restore. Raises BrokerUnavailable (the fetch answers 503: better than
        skipping records)."""
        key = (consumer, topic)
        running = self._restoring.get(key)
        if running is None:
            running = asyncio.ensure_future(self._restore(consumer, topic, start, watermarks))
            self._restoring[key] = running
            running.add_done_callback(lambda _: self._restoring.pop(key, None))
        return await asyncio.shield(running)

    async def _restore(self, consumer: str, topic: str, start: str,
                       watermarks: dict[str, tuple[int, int]]) -> int:
        group = self.group(consumer)
        held = await self.broker.load_offsets(group, topic, list(watermarks))
        new = {q: lo if start == "earliest" else hi for q, (lo, hi) in watermarks.items()
               if q not in held}
        if new:  # noted in Redis first: another node's restore reading them back is told apart
            await self.store.note_starts(consumer, topic, new)
            await self.broker.save_offsets(group, topic, new)
        below: dict[str, int] = {}
        if held:  # Redis lost these queues: what was delivered from them is below the log's end
            fresh = await self.broker.watermarks(topic)
            below = {q: max(fresh.get(q, (0, 0))[1], watermarks.get(q, (0, 0))[1]) for q in held}
        seeded = await self.store.restore(consumer, topic, {**held, **new}, below)
        if self.on_restore is not None and seeded:
            self.on_restore(max(0, seeded - len(new)), len(new))
        if held and seeded:
            log.warning("consumer %s resumed queue(s) %s of %s from the checkpoint in consumer "
                        "group %s (Redis had no offsets for them); batches below the log's end "
                        "now are flagged redelivered", consumer, ",".join(sorted(held)), topic,
                        group)
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
        await stop_task(self._task)
        self._task = None

    async def _run(self) -> None:
        """A tick every second (or every interval, without busy rounds): one node per tick (the
        lease) copies the consumers that are ``busy_records`` ahead of their checkpoint, and
        once per interval (a second lease) every one that moved. Measured on Apache Kafka (BENCH-
        MARKS.md, bench/checkpoint_cost.py): an offset commit costs the broker ~3 ms of CPU and
        the gateway ~1 ms, so copying 64 consumers every second took ~28 % of a core; busy ones
        alone are a few, and they are the ones a Redis loss would redeliver most of."""
        tick_ms = min(BUSY_TICK_MS, self.interval_ms) if self.busy_records > 0 else self.interval_ms
        while True:
            await asyncio.sleep(tick_ms / 1000)
            try:
                if await self.store.take_checkpoint_lease(self.node, tick_ms):
                    full = tick_ms == self.interval_ms or await self.store.take_checkpoint_lease(
                        self.node, self.interval_ms, full=True)
                    await self.round(busy_only=not full)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - Redis or the broker away: the next round retries
                log.warning("offset checkpoint round failed: %r", e)

    async def round(self, consumers: Iterable[str] | None = None, busy_only: bool = False) -> int:
        """Copy every moved cluster-mode offset of ``consumers`` (default: the names given to
        :meth:`start`) to the broker (``busy_only``: of the consumers' topics at least
        ``busy_records`` ahead of their checkpoint); how many queues were copied."""
        if consumers is None:
            if self._names is None:
                return 0
            consumers = await self._names()
        names = sorted(consumers)
        moved: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
        ahead: dict[tuple[str, str], int] = defaultdict(int)
        for c in await self.store.read_consumers(names):
            for q in c.queues:
                # has_offset: a hash that only holds ckp (Redis emptied while a round ran) is no
                # reason to write 0 over the checkpoint
                if q.has_offset and q.committed != q.checkpointed:
                    moved[(c.consumer, q.topic)][q.queue] = q.committed
                    ahead[(c.consumer, q.topic)] += abs(q.committed - q.checkpointed) \
                        if q.checkpointed >= 0 else self.busy_records
        if busy_only:
            moved = defaultdict(dict, {k: o for k, o in moved.items() if ahead[k] >= self.busy_records})
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
