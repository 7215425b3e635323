"""Delayed produce and cancel: records written into the delay wheel (core/wheel.py).

A delayed record gets an id that names its topic and due time, signed with the gateway's HMAC
key so that a cancel needs no lookup and cannot be forged: ``DELETE /delayed/{id}`` sets a mark
in Redis that the relay checks before it writes the record to its topic. A delivered record
leaves nothing in Redis (Redis stays bounded by what is pending, not by what was delivered):
instead a cancel is refused from ``delay_cancel_cutoff_ms`` before the due time on, when the
record is delivered or on its way (one script decides, on Redis' clock, so a cancel and a
delivery never both win). Cancel marks expire ``delay_mark_retention_ms`` after the due time.

A broker that delays natively (:attr:`Capability.DELAYED_DELIVERY`: RocketMQ 5's timers) gets
the records due within its limit (``Broker.native_delay_max_ms``) directly, with
``OutgoingMessage.deliver_at``; the wheel holds the rest, and every delay on brokers without
(Kafka). The id of a record the broker holds carries the broker's cancel handle (RocketMQ's
recall handle), so its cancel goes to the broker, with the same cut-off before the due time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..aio import stop_task
from ..broker import (
    Broker,
    BrokerUnavailable,
    CancelRefused,
    Capability,
    OutgoingMessage,
    ProduceResult,
)
from ..config import Settings
from ..store import CancelOutcome, OffsetStore, now_ms
from . import b64url
from .errors import Conflict, invalid
from .produce import Produced, misplaced, produce
from .wheel import (
    H_DUE,
    H_HOP_DUE,
    H_ID,
    H_PARTITION,
    H_TIMESTAMP,
    H_TOPIC,
    WHEEL_HEADERS,
    Wheel,
    parse_levels,
)

log = logging.getLogger("mqgw.delay")

#: After the level topics could not be made, ask the broker again this much later.
ENSURE_RETRY_S = 10.0
_MAC_BYTES = 12
_HEAD = struct.Struct(">Q6s")  # due ms, random


@dataclass(frozen=True, slots=True)
class DelayRef:
    """What a delay id names."""

    due: int
    topic: str
    #: The broker's cancel handle of a record it holds itself ("" for the wheel's records).
    handle: str = ""


class DelayIds:
    """``<base64url(due, random, topic[, NUL, handle])>.<base64url(mac)>``."""

    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, b"delay:" + payload, hashlib.sha256).digest()[:_MAC_BYTES]

    def new(self, due: int, topic: str, handle: str = "") -> str:
        payload = _HEAD.pack(due, os.urandom(6)) + topic.encode()
        if handle:
            payload += b"\0" + handle.encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def parse(self, delay_id: str) -> DelayRef:
        body, _, mac = delay_id.partition(".")
        try:
            payload, sig = _unb64(body), _unb64(mac)
        except ValueError:
            raise invalid("invalid_delay_id", "malformed delay id") from None
        if len(payload) <= _HEAD.size or not hmac.compare_digest(sig, self._mac(payload)):
            raise invalid("invalid_delay_id", "not a delay id this gateway issued "
                          "(malformed, or signed with another key)")
        due, _ = _HEAD.unpack_from(payload)
        topic, _, handle = payload[_HEAD.size:].decode().partition("\0")
        return DelayRef(due, topic, handle)


_b64 = b64url.encode


def _unb64(s: str) -> bytes:
    """One spelling per delay id, as per requestId: no ``=`` padding, no stray bits."""
    return b64url.decode(s, 400)


@dataclass(frozen=True, slots=True)
class Delayed:
    """One record of a produce request, delayed: cancel it with ``delay_id``."""

    delay_id: str
    deliver_at: int


@dataclass(frozen=True, slots=True)
class Cancelled:
    delay_id: str
    deliver_at: int
    topic: str
    #: an earlier cancel had done it (nothing changed): the console says so rather than
    #: "Cancelled" again
    already: bool = False


class DelayService:
    """Writes delayed records into the wheel and cancels them."""

    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 poke: Callable[[dict[str, dict[str, int]]], None] | None = None) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.wheel = Wheel(parse_levels(settings.delay_levels), settings.delay_topic_prefix)
        self.ids = DelayIds(settings.hmac_key)
        #: Told which level queues this process just wrote (its own relay wakes at once).
        self.poke = poke
        self._ready: asyncio.Future[None] | None = None
        self._failed_at = 0.0

    def native(self, delay_ms: int) -> bool:
        """Whether the broker holds a record this long itself (its capabilities are known once
        it started, hence asked each time)."""
        return Capability.DELAYED_DELIVERY in self.broker.capabilities \
            and delay_ms <= self.broker.native_delay_max_ms

    async def ensure_topics(self) -> None:
        """Create the level topics that are missing (once per process; retried after a
        failure, e.g. while the broker is down)."""
        failed = self._ready is not None and self._ready.done() and not self._ready.cancelled() \
            and self._ready.exception() is not None
        if self._ready is None or (failed and time.monotonic() - self._failed_at >= ENSURE_RETRY_S) \
                or (self._ready.done() and self._ready.cancelled()):
            self._ready = asyncio.ensure_future(self.broker.ensure_topics(
                dict.fromkeys(self.wheel.topics(), self.settings.delay_partitions)))
            self._ready.add_done_callback(self._ensured)
        await asyncio.shield(self._ready)  # a recent failure is raised again, not retried

    async def start(self) -> None:
        """Make (or check) the level topics before the process serves; a relaying node makes
        them at start anyway. Else its first delayed produce waited for their creation: on Apache
        Kafka under load 1.3-3.8 s for 11 topics, so a record due within that time was written
        straight to its topic during the request, before the client had its answer, and a
        consumer that started after the answer (at ``latest``) never saw it. An unreachable
        broker is not fatal: the node starts anyway, once the check has failed (a 5 s metadata
        timeout on Kafka); delayed records answer 503 until a retry, :data:`ENSURE_RETRY_S`,
        succeeds, and the failure is logged once."""
        try:
            await self.ensure_topics()
        except (BrokerUnavailable, NotImplementedError):
            pass

    def _ensured(self, f: asyncio.Future[None]) -> None:
        """Log a failure once per attempt (relays and produce requests all wait on one)."""
        if f.cancelled() or f.exception() is None:
            return
        self._failed_at = time.monotonic()
        log.error("delay level topics (%s*) could not be checked or created: %s; delayed "
                  "records are refused (503) and retried in %.0f s. The gateway's Kafka user "
                  "needs Describe and Create on them.", self.settings.delay_topic_prefix,
                  f.exception(), ENSURE_RETRY_S)

    async def close(self) -> None:
        if self._ready is not None and not self._ready.done():
            await stop_task(self._ready)

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      dues: list[int | None]) -> tuple[Produced, dict[int, Delayed]]:
        """Write each message due later (``dues[i]``, unix ms) into the wheel, and the others
        (None) to ``topic`` at once. A message due sooner than the smallest level is waited out
        here and then written to its topic. Returns the produce results (a delayed record's is
        empty unless it failed) and the delayed records by index."""
        await self.ensure_topics()
        queues = set(await self.broker.queues(topic))  # unknown topic: 404 before anything
        messages = list(messages)
        now = now_ms()
        results = [ProduceResult() for _ in messages]
        delayed: dict[int, Delayed] = {}
        by_level: dict[str, list[int]] = {}
        soon: list[int] = []
        at_once: list[int] = []
        wheeled: dict[int, OutgoingMessage] = {}
        native: list[int] = []
        for i, (m, due) in enumerate(zip(messages, dues, strict=True)):
            if due is None:
                at_once.append(i)
                continue
            if (bad := misplaced(topic, queues, m)) is not None:
                results[i] = bad
                continue
            if self.native(due - now):  # the broker holds it until its due time (RocketMQ 5 timers)
                native.append(i)  # with its due time in a header, as the wheel delivers them
                messages[i] = replace(m, deliver_at=due, headers=[*m.headers, (H_DUE, str(due).encode())])
                continue
            delayed[i] = Delayed(self.ids.new(due, topic), due)
            level = self.wheel.level_for(due - now)
            if level is None:
                soon.append(i)
                continue
            wheeled[i] = into_wheel(m, topic, due, now + level, delayed[i].delay_id)
            by_level.setdefault(self.wheel.topic(level), []).append(i)
        written: dict[str, dict[str, int]] = {}
        sends = [self._send(level_topic, [wheeled[i] for i in idx], idx, results, written)
                 for level_topic, idx in by_level.items()]
        if at_once:
            sends.append(self._now(topic, [(i, messages[i]) for i in at_once], results))
        if native:
            sends.append(self._native(topic, [(i, messages[i]) for i in native], results, delayed))
        if soon:
            sends.append(self._soon(topic, [(i, messages[i], delayed[i]) for i in soon], results))
        await asyncio.gather(*sends)
        if written:
            if self.poke is not None:
                self.poke(written)
            await self.store.delay.poke(written)
        for i, r in enumerate(results):
            if r.error_code:
                delayed.pop(i, None)
        return Produced(topic, results), delayed

    async def _now(self, topic: str, items: list[tuple[int, OutgoingMessage]],
                   results: list[ProduceResult]) -> None:
        res = await produce(self.broker, topic, [m for _, m in items])
        for (i, _), r in zip(items, res.results, strict=True):
            results[i] = r

    async def _native(self, topic: str, items: list[tuple[int, OutgoingMessage]],
                      results: list[ProduceResult], delayed: dict[int, Delayed]) -> None:
        """Records the broker holds: their ids carry the broker's cancel handle."""
        res = await produce(self.broker, topic, [m for _, m in items])
        for (i, m), r in zip(items, res.results, strict=True):
            results[i] = r
            if not r.error_code and m.deliver_at is not None:
                delayed[i] = Delayed(self.ids.new(m.deliver_at, topic, r.cancel_handle),
                                     m.deliver_at)

    async def _send(self, level_topic: str, messages: list[OutgoingMessage], idx: list[int],
                    results: list[ProduceResult], written: dict[str, dict[str, int]]) -> None:
        sent = await self.broker.produce(level_topic, messages, urgent=False)
        for i, r in zip(idx, sent, strict=True):
            if r.error_code:  # the record is not in the wheel: say why, as for any produce
                results[i] = r
            else:
                note_written(written, level_topic, r)

    async def _soon(self, topic: str, items: list[tuple[int, OutgoingMessage, Delayed]],
                    results: list[ProduceResult]) -> None:
        """Records due within the smallest level: written to their topic at their due time
        (cancels were looked at first, as the relay does; a cancel after this is too late)."""
        await sleep_until(max(d.deliver_at for _, _, d in items))
        dropped = await self.store.delay.deliver([(d.delay_id, d.deliver_at) for _, _, d in items],
                                                 self.settings.delay_cancel_cutoff_ms)
        send = [(i, m, d) for n, (i, m, d) in enumerate(items) if n not in dropped]
        res = await produce(self.broker, topic, [
            OutgoingMessage(m.value, m.key, [*m.headers, (H_DUE, str(d.deliver_at).encode()),
                                             (H_ID, d.delay_id.encode())],
                            m.queue, m.timestamp, tag=m.tag) for _, m, d in send])
        for (i, _, _), r in zip(send, res.results, strict=True):
            if r.error_code:
                results[i] = r

    async def cancel(self, delay_id: str) -> Cancelled:
        """Cancel a delayed record; :class:`Conflict` ``already_delivered`` if it was delivered
        or is due within ``delay_cancel_cutoff_ms``."""
        ref = self.ids.parse(delay_id)
        cutoff = self.settings.delay_cancel_cutoff_ms
        if ref.handle:
            return await self._cancel_native(delay_id, ref, cutoff)
        outcome = CancelOutcome.TOO_LATE
        if ref.due + self.settings.delay_mark_retention_ms > now_ms():  # else its mark is gone
            outcome = await self.store.delay.cancel(delay_id, ref.due, cutoff,
                                                    ref.due + self.settings.delay_mark_retention_ms)
        if outcome is CancelOutcome.DELIVERED:
            raise Conflict("already_delivered", "this delayed record was already delivered "
                           "to its topic", deliverAt=ref.due)
        if outcome is CancelOutcome.TOO_LATE:
            raise Conflict("already_delivered", f"this delayed record is delivered or on its "
                           f"way: a cancel must come at least {cutoff} ms before the due time",
                           deliverAt=ref.due)
        return Cancelled(delay_id, ref.due, ref.topic, outcome is CancelOutcome.ALREADY_CANCELLED)


    async def _cancel_native(self, delay_id: str, ref: DelayRef, cutoff: int) -> Cancelled:
        """A record the broker holds: refused from the cut-off on, as the wheel's are (a recall
        racing the broker's delivery may be acknowledged and lose), else the broker's recall."""
        if now_ms() >= ref.due - cutoff:
            raise Conflict("already_delivered", f"this delayed record is delivered or on its "
                           f"way: a cancel must come at least {cutoff} ms before the due time",
                           deliverAt=ref.due)
        try:
            await self.broker.cancel_delayed(ref.topic, ref.handle)
        except CancelRefused as e:
            if e.too_late:
                raise Conflict("already_delivered", str(e), deliverAt=ref.due) from None
            raise Conflict("cancel_unsupported", f"the broker cannot cancel this record: {e}",
                           deliverAt=ref.due) from None
        return Cancelled(delay_id, ref.due, ref.topic)


def into_wheel(m: OutgoingMessage, topic: str, due: int, hop_due: int, delay_id: str) -> OutgoingMessage:
    """The message as a level topic holds it: its own key and headers, and where it goes and
    when in ``mqgw-delay-*`` headers (removed again on the way out)."""
    headers = [*((k, v) for k, v in m.headers if k not in WHEEL_HEADERS),  # a retried record's
               (H_TOPIC, topic.encode()), (H_DUE, str(due).encode()),  # from its last delay
               (H_HOP_DUE, str(hop_due).encode()), (H_ID, delay_id.encode())]
    if m.queue is not None:
        headers.append((H_PARTITION, m.queue.encode()))
    if m.timestamp is not None:
        headers.append((H_TIMESTAMP, str(m.timestamp).encode()))
    return OutgoingMessage(m.value, m.key, headers, tag=m.tag)



def note_written(written: dict[str, dict[str, int]], topic: str, r: ProduceResult) -> None:
    """Record that ``topic``'s queue now holds at least up to ``r``'s offset (for pokes)."""
    qs = written.setdefault(topic, {})
    qs[r.queue] = max(qs.get(r.queue, 0), r.offset + 1)


async def sleep_until(at_ms: int) -> None:
    """Sleep until the wall clock reads ``at_ms`` or later (the event loop's timers may fire a
    little early, and "never before the due time" is measured on the wall clock)."""
    while (left := at_ms - now_ms()) > 0:  # noqa: ASYNC110 - a clock, not an event, is awaited
        await asyncio.sleep(left / 1000 + 0.0005)
