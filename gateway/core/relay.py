"""The relay: moves delayed records along the wheel's level topics and into their topics.

It is stateless like the rest of the gateway: it consumes the level topics through the same
lock/commit machinery in Redis as ``/message`` (its consumer is :data:`RELAY_CONSUMER`), so any
number of relays on any nodes share the queues, and a crashed relay's queue is taken over when
its lock expires (``relay_lock_ms``). For each queue it locks, it reads from the committed
offset, sends on every record whose time has come (core/wheel.py: the next level, or the
record's topic), waits for the broker's acknowledgements, and only then commits them; so a crash
in between duplicates and never loses. If the queue's head is not due yet it leaves it locked
until then ("parks" it, ``relay_settle.lua``) instead of holding records in memory: no relay
reads it before it is due, and every relay learns that time from ``choose`` as the queue's
wake-up. New records in a level topic wake the relays at once (a Redis channel); a lost wake-up
costs at most :data:`IDLE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter as CounterOf
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..aio import stop_task, stop_tasks
from ..broker import (
    AlreadyWritten,
    Broker,
    BrokerUnavailable,
    Capability,
    OutgoingMessage,
    ProduceResult,
    Record,
    UnknownTopic,
)
from ..config import Settings, node_id
from ..store import Lock, NeedsRestore, NoQueue, OffsetStore, Settled, now_ms
from .checkpoint import Checkpoints
from .delay import DelayService, note_written, sleep_until
from .names import INTERNAL_PREFIX
from .spans import Spans
from .watermarks import Watermarks
from .wheel import (
    H_DUE,
    H_HOP_DUE,
    H_ID,
    H_PARTITION,
    H_TIMESTAMP,
    H_TOPIC,
    INTERNAL_HEADERS,
    WHEEL_HEADERS,
    Wheel,
)

log = logging.getLogger("mqgw.relay")

#: The relay's consumer name in Redis. A leading '_' is not refused by the name rules, but no
#: registered consumer is expected to start with "_mqgw".
RELAY_CONSUMER = f"{INTERNAL_PREFIX}.relay"
#: With nothing due and no wake-up, look again this often anyway.
IDLE_S = 5.0
#: After a broker or Redis failure, pause this long before the next try.
RETRY_S = 1.0
#: A queue whose head is due within this long is waited for with the lock kept, not parked.
HOLD_MS = 100
#: How much later than its hop due a record bound for another level may be moved (see
#: :meth:`Wheel.act_by`). Measured on Tansu with 5,000 records over 20 levels and 2 nodes:
#: moving every hop at its hop due took a step per queue every ~20 ms, 2,000 steps a second,
#: and the event loops fell seconds behind (p99 lateness 1-9 s); with 1 s, hops cost a step
#: per queue per second.
HOP_SLACK_MS = 1000
#: Reads and forwards slower than this are logged (INFO): records wait for them.
SLOW_MS = 500
#: A record written to a level of L ms has a hop due of its produce request's start + L: at most
#: this much before it was written (so before a read that missed it).
ARRIVAL_MARGIN_MS = 50


@dataclass(slots=True)
class _Wheeled:
    """A record of a level topic, read back."""

    record: Record
    topic: str
    due: int
    hop_due: int
    delay_id: str
    partition: str | None
    timestamp: int | None


_Batch = list[tuple[_Wheeled, OutgoingMessage]]
#: A write of a batch to a topic: the broker's results, or the exception that failed it.
_Sent = tuple[str, _Batch, list[ProduceResult] | BaseException]


@dataclass(slots=True)
class _Outcome:
    """What a forward did, counted over its writes."""

    #: False when a failure that a retry may cure happened: the records are sent again.
    ok: bool = True
    #: ``delivered``, ``hopped`` and ``dropped`` records.
    counts: CounterOf[str] = field(default_factory=CounterOf)
    #: The level queues written to (``{topic: {queue: high watermark}}``), to wake the relays.
    levels_written: dict[str, dict[str, int]] = field(default_factory=dict)


def _parse(r: Record) -> _Wheeled | None:
    h = {k: v for k, v in r.headers if k in WHEEL_HEADERS}
    try:
        return _Wheeled(r, h[H_TOPIC].decode(), int(h[H_DUE]), int(h[H_HOP_DUE]), h[H_ID].decode(),
                        h[H_PARTITION].decode() if H_PARTITION in h else None,
                        int(h[H_TIMESTAMP]) if H_TIMESTAMP in h else None)
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


def _forget(draining: dict[str, asyncio.Task[None]], queue: str, _task: asyncio.Task[None]) -> None:
    draining.pop(queue, None)


class Relay:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker, wm: Watermarks,
                 delay: DelayService, counted: Callable[[str, int], None] | None = None,
                 checkpoints: Checkpoints | None = None, spans: Spans | None = None) -> None:
        self.settings = settings
        #: Spans of each delivery (optional OpenTelemetry; the no-op ones by default).
        self.spans = spans or Spans(False)
        #: The relay's level positions are checkpointed like a consumer's (RELAY_CONSUMER): after a
        #: Redis loss it resumes there. Without, it would start every level at its earliest
        #: retained record and deliver every delayed record of the retention period again.
        self.checkpoints = checkpoints if checkpoints is not None and checkpoints.enabled else None
        self.store = store
        self.broker = broker
        #: The app's watermarks: raised for the topics the relay delivers to (wakes long polls).
        self.wm = wm
        #: The level topics' own, refreshed from the broker only every IDLE_S: every write to a
        #: level is announced with its offset (pokes), and every read raises them, so they are
        #: current without ListOffsets. At the app's refresh interval (200 ms) the 45 levels would
        #: cost 225 metadata requests and as many ListOffsets a second, for nothing.
        self.levels_wm = Watermarks(store, broker, int(IDLE_S * 1000))
        self.delay = delay
        self.wheel: Wheel = delay.wheel
        self.address = f"relay@{node_id()}"
        self._events: dict[str, asyncio.Event] = {t: asyncio.Event() for t in self.wheel.topics()}
        self._level_of = {self.wheel.topic(level): level for level in self.wheel.levels}
        self._tasks: list[asyncio.Task[None]] = []
        #: Told how many records were ``delivered`` to their topic, ``hopped`` to the next level
        #: or ``dropped`` (the app counts them in mqgw_delay_records_total).
        self.counted = counted
        #: Each hop one transaction (Kafka): the group that holds the level queues' positions
        #: written with them (not the checkpoint group: its plain commits from Redis' positions
        #: would move it back).
        self.exactly_once = settings.relay_exactly_once \
            and Capability.EXACTLY_ONCE in broker.capabilities
        self.hops_group = f"{settings.checkpoint_group_prefix}{RELAY_CONSUMER}.hops"

    def _count(self, kind: str, n: int) -> None:
        if self.counted is not None and n:
            self.counted(kind, n)

    def poke(self, written: dict[str, dict[str, int]]) -> None:
        """Level queues were written to (``{topic: {queue: high watermark}}``, by any node):
        raise the cached watermarks, and the topics' relay tasks look at once."""
        for t, qs in written.items():
            e = self._events.get(t)
            if e is not None:
                for q, hi in qs.items():
                    self.levels_wm.observe(t, q, hi)
                e.set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(t), name=f"mqgw-relay-{t}")
                       for t in self.wheel.topics()]
        self._tasks.append(asyncio.create_task(self.store.delay.listen(self.poke),
                                               name="mqgw-relay-wakeups"))

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        self._tasks = []

    # -- one task per level topic -------------------------------------------------------------
    async def _run(self, topic: str) -> None:
        """Lock the topic's queues that have work, each drained by a task of its own (so a queue
        held for a steady stream does not keep the others waiting), and sleep until the earliest
        parked head is due, a wake-up, or a drain ending (it may have parked a queue)."""
        event = self._events[topic]
        draining: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                wait_s = IDLE_S
                try:
                    event.clear()
                    chosen = await self._choose(topic, set(draining))
                    if isinstance(chosen, Lock):
                        task = asyncio.create_task(
                            self._drain_logged(topic, chosen, event, draining),
                            name=f"mqgw-relay-{topic}-{chosen.queue}")
                        draining[chosen.queue] = task
                        task.add_done_callback(partial(_forget, draining, chosen.queue))
                        continue
                    if isinstance(chosen, NoQueue) and chosen.wake_ms >= 0:
                        wait_s = min(IDLE_S, max(0.0, (chosen.wake_ms - now_ms()) / 1000) + 0.001)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - the relay must outlive any failure
                    log.warning("relay of %s: %r; retrying", topic, e)
                    wait_s = RETRY_S
                try:
                    await asyncio.wait_for(event.wait(), wait_s)
                except TimeoutError:
                    pass
        finally:
            await stop_tasks(list(draining.values()))

    async def _drain_logged(self, topic: str, lock: Lock, done: asyncio.Event,
                            draining: dict[str, asyncio.Task[None]]) -> None:
        try:
            await self._drain(topic, lock)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the queue's lock expires; another try takes it
            log.warning("relay of %s/%s: %r; retrying", topic, lock.queue, e)
        finally:
            # The topic's loop chooses again: this queue may be parked or free now. It must no
            # longer be skipped then (the task's done callback runs later): a choose that
            # skipped it missed its park's wake-up, and a lone delayed record waited IDLE_S.
            draining.pop(lock.queue, None)
            done.set()

    async def _choose(self, topic: str, skip: set[str]) -> Lock | NoQueue | None:
        try:
            await self.delay.ensure_topics()  # logs its own failures, once per attempt
            wm = await self.levels_wm.get(topic)
        except (UnknownTopic, BrokerUnavailable):
            return None
        for _ in range(2):  # a restore, then choose again
            chosen = await self.store.choose(
                RELAY_CONSUMER, "", topic, self.levels_wm.marks(topic) or wm, address=self.address,
                default_timeout_ms=self.settings.relay_lock_ms, default_start="earliest",
                client_idle_ms=self.settings.client_idle_ms, max_messages=self.settings.relay_batch,
                open_mode=True, skip=skip, restore=self.checkpoints is not None)
            if not isinstance(chosen, NeedsRestore) or self.checkpoints is None:
                break
            try:
                await self.checkpoints.restore(RELAY_CONSUMER, topic, chosen.start, wm)
            except BrokerUnavailable as e:
                log.warning("relay: positions of %s not restored yet: %s", topic, e)
                return None
        return chosen if isinstance(chosen, (Lock, NoQueue)) else None

    async def _drain(self, topic: str, lock: Lock) -> None:
        """Send on what is due in the locked queue and commit it; then free the queue, or park
        it until its head is due. A head due within :data:`HOLD_MS` is waited for here, with the
        lock kept (each commit renews it) and the records already read: a steady stream is
        relayed without a choose and a read per record."""
        offset = lock.committed
        t0 = now_ms()
        try:
            async with self._held(topic, lock, offset):
                res = await self.broker.fetch(topic, lock.queue, offset, lock.allowance)
        except BaseException:
            await asyncio.shield(self._settle(topic, lock, offset, offset, 0))
            raise
        self.levels_wm.observe(topic, lock.queue, res.high_watermark)
        items = [(r, _parse(r)) for r in res.records]
        i = 0
        if now_ms() - t0 > SLOW_MS:
            log.info("relay read of %s/%s took %d ms (%d records from %d)", topic, lock.queue,
                     now_ms() - t0, len(items), offset)
        while True:
            now = now_ms()
            horizon = now + self.settings.relay_coalesce_ms
            j, last_at = i, now
            while j < len(items):
                w = items[j][1]
                at = self.wheel.ready_at(w.hop_due, w.due) if w is not None else now
                if at > horizon:
                    break
                last_at = max(last_at, at)
                j += 1
            # Records written after the read wait at least the level: act by then on them too.
            head_at = self._wake_at(items[j:], len(items) >= lock.allowance,
                                    t0 + self._level_of[topic] - ARRIVAL_MARGIN_MS)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("relay step", extra={"topic": topic, "queue": lock.queue, "offset": offset,
                                               "read": len(items), "from": i, "to": j,
                                               "head_in_ms": head_at - now if head_at else None})
            if j > i:
                await sleep_until(last_at)  # within the coalescing window
                take = [w for _, w in items[i:j]]
                # Fenced: only the holder of the queue's lock sends, and it holds it for the
                # whole forward (a relay whose lock ran out while it read or waited, and whose
                # queue another relay took, sends nothing: before, it sent the records again).
                if not await self._renew(topic, lock, offset):
                    return
                t1 = now_ms()
                valid = [w for w in take if w is not None]
                try:
                    async with self._held(topic, lock, offset):
                        if self.exactly_once:
                            end = items[j][0].offset if j < len(items) else res.next_offset
                            forwarded = await self._forward_once(topic, lock.queue, offset, end, valid)
                        else:
                            forwarded = await self._forward(valid)
                except AlreadyWritten as e:  # a relay wrote this hop and died before Redis heard
                    log.info("relay of %s/%s: records up to %d were written already; going on "
                             "from there", topic, lock.queue, e.position)
                    await self._settle(topic, lock, offset, max(offset, e.position), 0)
                    return
                if now_ms() - t1 > SLOW_MS:
                    log.info("relay forward of %d records from %s/%s took %d ms", len(take),
                             topic, lock.queue, now_ms() - t1)
                if not forwarded:
                    await self._settle(topic, lock, offset, offset, now_ms() + int(RETRY_S * 1000))
                    return
                if any(w is None for w in take):
                    self._count("dropped", sum(w is None for w in take))
                    log.error("relay of %s/%s: dropped records without wheel headers", topic,
                              lock.queue)
            nxt = items[j][0].offset if j < len(items) else res.next_offset
            if head_at and head_at - now_ms() <= HOLD_MS:
                if not await self._settle(topic, lock, offset, nxt, now_ms() + self.settings.relay_lock_ms):
                    return
                offset, i = nxt, j
                await sleep_until(head_at)
                continue
            await self._settle(topic, lock, offset, nxt, head_at)
            return

    def _wake_at(self, rest: list[tuple[Record, _Wheeled | None]], truncated: bool,
                 unread_by: int) -> int:
        """When to act on a queue next, given the records read but not sent (0: none left):
        by the earliest time one of them must be acted on, but not before the first can be.
        Records not read yet may have to go from ``unread_by`` on, or at the last read one's hop
        due if the read was cut short."""
        if not rest:
            return 0
        first = rest[0][1]
        if first is None:
            return now_ms()
        by = min((self.wheel.act_by(w.hop_due, w.due, HOP_SLACK_MS) for _, w in rest if w is not None),
                 default=unread_by)
        by = min(by, unread_by)
        if truncated:
            last = rest[-1][1]
            by = min(by, last.hop_due if last is not None else by)
        return max(self.wheel.ready_at(first.hop_due, first.due), by)

    async def _renew(self, topic: str, lock: Lock, offset: int) -> bool:
        """Whether the queue is still this relay's, its lock renewed for ``relay_lock_ms``."""
        r = await self.store.delay.settle(self.store.queues_key(RELAY_CONSUMER), topic, lock.queue,
                                          offset, offset, lock.token,
                                          now_ms() + self.settings.relay_lock_ms,
                                          self.settings.relay_lock_ms)
        if r is not Settled.SETTLED:
            log.warning("relay of %s/%s lost its lock (%s) before sending: the relay that took "
                        "it sends the records", topic, lock.queue, r.value)
            return False
        return True

    @contextlib.asynccontextmanager
    async def _held(self, topic: str, lock: Lock, offset: int) -> AsyncIterator[None]:
        """Keep the queue's lock alive while a read or a forward is in flight (renewed every
        third of ``relay_lock_ms``): a slow broker call (72 s was seen under load) must not let
        the lock run out and another relay send the same records again. A process stalled as a
        whole (SIGSTOP, a GC pause) renews nothing: then the delay id each delivered record
        carries tells the copies apart."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.settings.relay_lock_ms / 3000)
                if not await self._renew(topic, lock, offset):
                    return

        task = asyncio.create_task(renew(), name=f"mqgw-relay-hold-{topic}-{lock.queue}")
        try:
            yield
        finally:
            await stop_task(task)

    async def _settle(self, topic: str, lock: Lock, offset: int, nxt: int, park_until: int) -> bool:
        """Commit ``[offset, nxt)``; keep the queue locked until ``park_until`` (0: free it)."""
        r = await self.store.delay.settle(self.store.queues_key(RELAY_CONSUMER), topic, lock.queue,
                                          offset, nxt, lock.token, park_until,
                                          self.settings.relay_lock_ms)
        if r is not Settled.SETTLED:
            log.warning("relay of %s/%s lost its lock (%s): the records it sent will be sent "
                        "again by the relay that took it", topic, lock.queue, r.value)
            return False
        return True

    async def _forward(self, items: list[_Wheeled]) -> bool:
        """Send each record on (next level or its topic); True when every send was acknowledged
        or failed for good (an unknown topic or partition, a record too large: logged and
        dropped, a retry would never succeed)."""
        hops, finals = self._route(items, now_ms())
        sent = await self._send(hops, finals)
        if sent is None:
            return False
        outcome = _Outcome()
        for topic, batch, res in sent:
            self._account(topic, batch, res, outcome)
        self._counted(outcome)
        if outcome.levels_written:
            await self.store.delay.poke(outcome.levels_written)
        return outcome.ok

    def _route(self, items: list[_Wheeled], now: int) -> tuple[dict[str, _Batch], list[_Wheeled]]:
        """Where each record goes, decided once, now: a record with less than the smallest level
        left is final (to its topic at its due time, a wait of at most that level); the others
        hop to their next level at once, with a new hop due. ``({level topic: batch}, finals)``."""
        hops: dict[str, _Batch] = {}
        finals: list[_Wheeled] = []
        for w in items:
            level = self.wheel.level_for(w.due - now)
            if level is None:
                finals.append(w)
                continue
            r = w.record
            headers = [(k, v) for k, v in r.headers if k != H_HOP_DUE]
            headers.append((H_HOP_DUE, str(now + level).encode()))
            hops.setdefault(self.wheel.topic(level), []).append(
                (w, OutgoingMessage(r.value, r.key, headers, tag=r.tag)))
        return hops, finals

    async def _send(self, hops: dict[str, _Batch], finals: list[_Wheeled]) -> list[_Sent] | None:
        """Write the hops now and the finals at their due time, side by side: per topic, its
        batch and the results (or the exception that failed the write). None when delivering
        the finals failed as a whole (the cancel look-up in Redis)."""
        sends = [self.broker.produce(t, [m for _, m in batch], urgent=False)
                 for t, batch in hops.items()]
        results: list[Any] = list(await asyncio.gather(*sends, self._deliver(finals),
                                                       return_exceptions=True))
        delivered = results.pop()
        if isinstance(delivered, BaseException):
            log.warning("relay: delivering %d records failed (%r); they are sent again in %.0f s",
                        len(finals), delivered, RETRY_S)
            return None
        finals_sent: list[_Sent] = delivered
        return [*((t, batch, res) for (t, batch), res in zip(hops.items(), results, strict=True)),
                *finals_sent]

    def _account(self, topic: str, batch: _Batch, res: list[ProduceResult] | BaseException,
                 outcome: _Outcome) -> None:
        """Count what a write to ``topic`` did with each record of ``batch``; a failure that a
        retry may cure makes ``outcome`` not ok (the read is sent again)."""
        if isinstance(res, UnknownTopic):
            log.error("relay: topic %s does not exist; %d delayed records for it dropped",
                      topic, len(batch))
            outcome.counts["dropped"] += len(batch)
            return
        if isinstance(res, BaseException):
            log.warning("relay: sending %d records to %s failed (%r); they are sent again in "
                        "%.0f s", len(batch), topic, res, RETRY_S)
            outcome.ok = False
            return
        for (w, _), pr in zip(batch, res, strict=True):
            if pr.error_code is None:
                if topic == w.topic:
                    outcome.counts["delivered"] += 1
                    self.wm.observe(topic, pr.queue, pr.offset + 1)  # wakes this node's polls
                else:
                    outcome.counts["hopped"] += 1
                    note_written(outcome.levels_written, topic, pr)
            elif pr.error_code.permanent:
                log.error("relay: delayed record %s for %s dropped: %s", w.delay_id, w.topic,
                          pr.error)
                outcome.counts["dropped"] += 1
            else:
                log.warning("relay: sending delayed record %s to %s failed (%s: %s); it is "
                            "sent again in %.0f s", w.delay_id, topic, pr.error_code, pr.error,
                            RETRY_S)
                outcome.ok = False

    async def _forward_once(self, topic: str, queue: str, start: int, end: int,
                            items: list[_Wheeled]) -> bool:
        """:meth:`_forward` as one transaction (Kafka): the hops, the finals at their due time,
        and the level queue's position ``end``, all or nothing. A relay that took the queue over
        fences this one, so a stalled relay's hop is never written twice (before: 412 of 2,930
        delayed records written 2-5 times under load). True when it committed (records that
        failed for good dropped, as :meth:`_forward` does); raises :class:`AlreadyWritten`."""
        hops, finals = self._route(items, now_ms())
        batches = {**hops, **await self._due_finals(finals)}
        for _ in range(3):
            try:
                results = await self.broker.write_once(
                    self.hops_group, topic, queue, start, end,
                    {t: [m for _, m in batch] for t, batch in batches.items()})
            except BrokerUnavailable as e:
                log.warning("relay: the hop of %d records from %s/%s failed (%s); it is sent "
                            "again in %.0f s", len(items), topic, queue, e, RETRY_S)
                return False
            failed = {t: [pr.error_code.permanent for pr in rs if pr.error_code is not None]
                      for t, rs in results.items()}
            if not any(failed.values()):
                outcome = _Outcome()
                for t, batch in batches.items():
                    self._account(t, batch, results[t], outcome)
                self._counted(outcome)
                if outcome.levels_written:
                    await self.store.delay.poke(outcome.levels_written)
                return True
            if not all(all(f) for f in failed.values()):  # a failure a retry may cure
                log.warning("relay: the hop from %s/%s was refused (%s); it is sent again in "
                            "%.0f s", topic, queue, next(pr.error for rs in results.values()
                                                         for pr in rs if pr.error_code), RETRY_S)
                return False
            for t, rs in results.items():  # nothing was written: again, without those
                keep = [(b, pr) for b, pr in zip(batches[t], rs, strict=True) if pr.error_code is None]
                for (w, _), pr in zip(batches[t], rs, strict=True):
                    if pr.error_code is not None:
                        log.error("relay: delayed record %s for %s dropped: %s", w.delay_id,
                                  w.topic, pr.error)
                        self._count("dropped", 1)
                batches[t] = [b for b, _ in keep]
            batches = {t: b for t, b in batches.items() if b}
        return False

    def _counted(self, outcome: _Outcome) -> None:
        for kind, n in outcome.counts.items():
            self._count(kind, n)
        if outcome.levels_written:
            self.poke(outcome.levels_written)

    async def _due_finals(self, finals: list[_Wheeled]) -> dict[str, _Batch]:
        """At the latest due time among ``finals`` (at most the smallest level from now), those
        not cancelled as their topics get them, by topic."""
        if not finals:
            return {}
        await sleep_until(max(w.due for w in finals))
        dropped = await self.store.delay.deliver([(w.delay_id, w.due) for w in finals],
                                                 self.settings.delay_cancel_cutoff_ms)
        out: dict[str, _Batch] = {}
        for i, w in enumerate(finals):
            if i in dropped:
                continue  # cancelled
            r = w.record
            out.setdefault(w.topic, []).append((w, OutgoingMessage(
                r.value, r.key, [(k, v) for k, v in r.headers if k not in INTERNAL_HEADERS],
                w.partition, w.timestamp, tag=r.tag)))
        return out

    async def _deliver(self, finals: list[_Wheeled]) -> list[_Sent]:
        """At the latest due time among ``finals`` (at most the smallest level from now), drop
        those cancelled and write the others to their topics; the results per topic, an
        exception in place of a failed write."""
        if not finals:
            return []
        out = await self._due_finals(finals)
        with self.spans.span("mqgw relay deliver", "internal", attributes={
                "messaging.batch.message_count": len(finals)}) as span:
            span.link([w.record for w in finals])
            results = await asyncio.gather(*(self.broker.produce(t, [m for _, m in batch])
                                             for t, batch in out.items()), return_exceptions=True)
        return [(t, batch, res) for (t, batch), res in zip(out.items(), results, strict=True)]
