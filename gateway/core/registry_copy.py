"""The registry's durable copy: a compacted topic on the broker, restored when Redis comes back empty.

Redis holds the registry (consumer settings and registrations, producers, API keys and their
grants) because every request reads it there in the same script that decides. But a Redis that
restarts empty or is flushed would forget all of it: with auth on every client would be refused,
and every consumer's `start`, retry policy, dead-letter topic, rate limit and pause would be gone
(an `earliest` consumer falling back to `latest` skips records). So, as Kafka-native registries
keep their state (Schema Registry's ``_schemas``):

- **Copy.** Every registry write is followed by the written entity, read whole from Redis, sent
  to the topic ``registry_topic`` (one partition, ``cleanup.policy=compact``, no time retention)
  under the entity's key (``consumer/<name>``, ``producer/<name>``, ``key/<id>``; a tombstone
  when it is gone). The admin call answers after the broker acknowledged it: an acknowledged
  registry write survives a Redis loss. If the broker fails, the call answers 503 (Redis has
  the change; repeating the call writes the copy).
- **Restore.** ``P:{reg}:copied`` marks a Redis that holds the registry. Each process looks for
  it before it serves (:meth:`start`), every second after (:meth:`run`), and before a fetch
  refuses a caller or seeds a queue's offsets (:meth:`ensure`): a Redis without it is given the
  copy's entities (only those Redis has nothing of: a write made since the loss wins), by one
  node at a time, and then the copy is given what Redis has that it lacks (the first start over
  an existing registry, ``mqgw keys bootstrap``, which writes Redis only and drops the marker).

Within the second after a loss a process may still refuse a key or miss a setting; nothing a
consumer was configured with is lost for longer, and offsets come back from the checkpoint
(core/checkpoint.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid

import orjson

from ..aio import stop_task
from ..broker import Broker, BrokerUnavailable, OutgoingMessage, UnknownTopic
from ..config import Settings, node_id
from ..store import UNAVAILABLE, Entity, OffsetStore, entity_key

log = logging.getLogger("mqgw.registry")

#: How often each process looks for the marker of a Redis that holds the registry.
WATCH_S = 1.0
#: Records read from the copy at once while restoring.
_READ_BATCH = 500
#: Other processes look for pending copies every this many watch ticks.
PENDING_EVERY = 10
#: How long a registry write waits for the broker to take its durable copy before it answers
#: with the copy pending (the write itself is in Redis already).
COPY_WAIT_S = 5.0
#: Set in a request whose registry write left its durable copy pending (the HTTP layer answers
#: with ``Mqgw-Durable-Copy: pending``).
COPY_PENDING: contextvars.ContextVar[bool] = contextvars.ContextVar("mqgw_copy_pending", default=False)


class RegistryCopy:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker) -> None:
        self.topic = settings.registry_copy_topic()
        self.store = store
        self.broker = broker
        self.enabled = bool(self.topic)
        self.node = f"{node_id()}:{uuid.uuid4().hex[:8]}"
        self._ensured = False
        self._task: asyncio.Task[None] | None = None
        self._restoring: asyncio.Future[None] | None = None
        #: This process left a copy pending (its watch sends pending copies every second).
        self._left_pending = False

    async def start(self) -> None:
        """Make the topic and restore the registry if Redis lacks it, before the process serves;
        then watch for a Redis that lost it. A broker that cannot be reached now is not fatal:
        the watch retries."""
        if not self.enabled:
            return
        try:
            await self.ensure()
        except (BrokerUnavailable, NotImplementedError, *UNAVAILABLE) as e:  # type: ignore[misc]
            # Redis or the broker away: the node starts anyway (answering 503 meanwhile)
            log.warning("registry copy on topic %s not checked at start (retried every %.0f s): "
                        "%r", self.topic, WATCH_S, e)
        self._task = asyncio.create_task(self.run(), name="mqgw-registry-copy")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    async def run(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(WATCH_S)
            ticks += 1
            try:
                await self.ensure()
                # Copies left pending: every second by the process that left them, every
                # PENDING_EVERY ticks by the others (one that died leaves them to the rest);
                # an idle node's Redis calls stay bounded by time (test_long_poll.py).
                if (self._left_pending or ticks % PENDING_EVERY == 0) \
                        and await self.send_pending() == 0:
                    self._left_pending = False  # none left
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - Redis or the broker away: look again
                log.warning("registry copy: %r", e)

    # -- copy ------------------------------------------------------------------------------------
    async def wrote(self, kind: str, name: str) -> None:
        """After a registry write of entity ``kind``/``name``: send its state now to the copy.

        The write is in Redis already, so it has happened, whatever the broker does: a copy the
        broker does not take within :data:`COPY_WAIT_S` is marked pending in Redis (sent again
        by :meth:`run` on every node until the broker takes it), and :data:`COPY_PENDING` tells
        the HTTP layer to say so. Before, such a write answered 503 and had been applied."""
        if not self.enabled:
            return
        entity = entity_key(kind, name)
        try:
            async with asyncio.timeout(COPY_WAIT_S):
                await self._topic()
                await self._send({entity: await self.store.registry_copy.read(kind, name)})
        except (BrokerUnavailable, TimeoutError, NotImplementedError) as e:
            await self.store.registry_copy.mark_pending(entity)
            self._left_pending = True
            COPY_PENDING.set(True)
            log.warning("registry copy of %s pending (the write is applied; sent again every "
                        "%.0f s until the broker takes it): %r", entity, WATCH_S, e)

    async def send_pending(self) -> int:
        """Send the copies the broker did not take before; how many went."""
        entities = await self.store.registry_copy.pending()
        if not entities:
            return 0
        await self._topic()
        states = {}
        for e in entities:
            kind, name = e.split("/", 1)
            states[e] = await self.store.registry_copy.read(kind, name)
        await self._send(states)
        await self.store.registry_copy.clear_pending(entities)
        log.info("registry copy: %d pending entit%s sent", len(entities),
                 "y" if len(entities) == 1 else "ies")
        return len(entities)

    async def _send(self, entities: dict[str, Entity | None]) -> None:
        msgs = [OutgoingMessage(None if e is None else orjson.dumps(e), k.encode())
                for k, e in entities.items()]
        for i in range(0, len(msgs), _READ_BATCH):
            results = await self.broker.produce(self.topic, msgs[i:i + _READ_BATCH], urgent=True)
            failed = [r for r in results if r.error_code]
            if failed:
                raise BrokerUnavailable(f"registry copy not written to {self.topic}: "
                                        f"{failed[0].error_code} {failed[0].error}")

    async def _topic(self) -> None:
        if not self._ensured:
            await self.broker.ensure_topics({self.topic: 1}, compacted=True)
            self._ensured = True

    # -- restore ---------------------------------------------------------------------------------
    async def ensure(self) -> bool:
        """Restore the registry if this Redis lacks it (one restore at a time per process);
        whether it lacked it."""
        if not self.enabled or await self.store.registry_copy.has_copy_marker():
            return False
        if self._restoring is None or self._restoring.done():
            self._restoring = asyncio.ensure_future(self._restore())
        await asyncio.shield(self._restoring)
        return True

    async def _restore(self) -> None:
        copies = self.store.registry_copy
        await self._topic()
        while not await copies.take_restore_lock(self.node):
            await asyncio.sleep(0.1)  # another node restores: done when the marker is there
            if await copies.has_copy_marker():
                return
        try:
            if await copies.has_copy_marker():
                return
            entities = await self.read_copy()
            written = await copies.load(entities)
            if written:
                log.warning("registry restored from topic %s: %d of %d entities written back "
                            "(Redis had lost them)", self.topic, written, len(entities))
            # and the other way: what Redis has that the copy lacks (the copy's first start, an
            # upgrade, `mqgw keys bootstrap`, a write whose copy failed)
            current = await copies.read_all()
            missing: dict[str, Entity | None] = {k: e for k, e in current.items()
                                                 if entities.get(k) != e}
            if missing:
                await self._send(missing)
                log.info("registry copy: %d entities copied to topic %s", len(missing), self.topic)
            await copies.set_copy_marker(self.node)
        finally:
            await copies.drop_restore_lock(self.node)

    async def read_copy(self) -> dict[str, Entity]:
        """The copy's entities (the last record of each key, tombstones dropped)."""
        out: dict[str, Entity] = {}
        try:
            wm = await self.broker.watermarks(self.topic)
        except UnknownTopic:
            return out
        if not wm:
            return out
        queue = min(wm)  # the copy's one queue ("0" on Kafka, "<broker>.0" on RocketMQ)
        lo, hi = wm[queue]
        at = lo
        while at < hi:
            res = await self.broker.fetch(self.topic, queue, at, _READ_BATCH)
            for r in res.records:
                if r.key is None:
                    continue
                k = r.key.decode()
                if r.value is None:
                    out.pop(k, None)
                else:
                    out[k] = orjson.loads(r.value)
            if res.next_offset <= at:
                raise BrokerUnavailable(f"registry copy: no progress reading {self.topic} at {at}")
            at = res.next_offset
        return out
