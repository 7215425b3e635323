"""Failing records: ``/nack`` and the ``failed`` offsets of ``/ack``.

The gateway keeps no copy of what it handed out, so a failed batch is read again from the broker
at the offsets its requestId names (Kafka offsets never change meaning). Each failed record is
written, through the delay wheel, to the consumer's retry topic for the topic it came from (or
after its last attempt to the dead-letter topic), and only once every write was acknowledged is
the batch committed as an ack would commit it. A nack whose batch an ack could not commit (lock
lost, already committed, reset) writes nothing. A crash or a lock lost between the writes and
the commit leaves the batch uncommitted: it is delivered again and its failed records are
retried twice, never lost.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..broker import Broker, BrokerUnavailable, OutgoingMessage, ProduceResult, Record
from ..config import Settings
from ..store import AckOutcome, AckResult, Credential, OffsetStore, now_ms
from .consume import ConsumeService
from .delay import DelayService
from .errors import invalid
from .fetch import parse_tag_filter
from .produce import produce
from .requestid import BatchRef
from .retry import (
    H_ATTEMPT,
    H_CLIENT,
    H_CONSUMER,
    H_FAILED,
    H_FIRST,
    H_ORIGIN_OFFSET,
    H_ORIGIN_QUEUE,
    H_ORIGIN_TOPIC,
    H_ORIGIN_TS,
    OWN_HEADERS,
    RetryPolicy,
    attempt_of,
    header,
    retry_topic,
)

#: A retry or dead-letter topic found or made is looked up again after this long (an operator
#: may have deleted it); one that could not be made is tried again on the next failure.
KNOWN_S = 3600.0
#: A batch's records read back empty (a busy broker) are asked for again this often, after
#: pauses of 0.1 s, 0.2 s, ... (3.6 s in all) before the nack answers 503.
REREADS = 8
REREAD_PAUSE_S = 0.1


@dataclass(frozen=True, slots=True)
class Retried:
    offset: int
    attempt: int  # the attempt it will be delivered as
    deliver_at: int  # unix ms


@dataclass(frozen=True, slots=True)
class Failed:
    """What a nack (or an ack naming failed offsets) did."""

    ack: AckResult  # the commit of the batch, as /ack answers it
    retried: list[Retried]
    dead: list[int]  # offsets sent to the dead-letter topic
    retry_topic: str
    dead_letter_topic: str


class NackService:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 consume: ConsumeService, delay: DelayService) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.consume = consume
        self.delay = delay
        self._made: dict[str, float] = {}  # topics this process made or found, and when

    async def fail(self, request_id: str, failed: dict[int, int | None] | None,
                   credential: Credential | None = None, delay_ms: int | None = None) -> Failed:
        """Fail the batch's records at ``failed`` (offset -> its own delay in ms, or None for
        the policy's; None: every record, with ``delay_ms`` or the policy's), commit the batch."""
        ref = self.consume.decode(request_id)
        check = await self.consume.commit(ref, credential, check_only=True)
        if check.result is not AckOutcome.COMMITTED:  # the batch is not ours to fail (any more):
            return Failed(check, [], [], "", "")     # nothing is written anywhere
        if failed is not None:
            outside = sorted(o for o in failed if not ref.offset <= o < ref.next_offset)
            if outside:
                raise invalid("invalid_failed", f"offsets {outside[:5]} are not in this "
                              f"batch ([{ref.offset}, {ref.next_offset}))", offsets=outside[:100])
        policy = RetryPolicy.of(ref.consumer, await self.store.get_config(ref.consumer), self.settings,
                                self.broker.max_topic_length)
        records = await self._read(ref) if failed is None or failed else []
        origin = next((t for r in records if (t := header(r, H_ORIGIN_TOPIC))), ref.topic)
        retry = retry_topic(self.settings.retry_topic_prefix, ref.consumer, origin, ref.client_id,
                            self.broker.max_topic_length)
        mine = [r for r in records if failed is None or r.offset in failed]
        last = [r for r in mine if attempt_of(r) >= policy.max_attempts]
        await self._ensure({**({retry: 0} if len(last) < len(mine) else {}),
                            **({policy.dead_letter_topic: 0} if last else {})})
        # The failure time, and what the delays count from: after any topic was made (a new
        # topic on Apache Kafka took up to a second, which the first retry's delay would lose).
        now = now_ms()
        again: list[OutgoingMessage] = []
        dues: list[int | None] = []
        retried: list[Retried] = []
        dead: list[OutgoingMessage] = []
        dead_offsets: list[int] = []
        for r in mine:
            attempt = attempt_of(r)
            if attempt >= policy.max_attempts:
                dead.append(self._carry(r, ref, attempt, now))
                dead_offsets.append(r.offset)
                continue
            own = failed.get(r.offset) if failed is not None else None
            wait = own if own is not None else delay_ms
            wait = policy.delay_before(attempt + 1) if wait is None else wait
            again.append(self._carry(r, ref, attempt + 1, now))
            dues.append(now + wait if wait > 0 else None)
            retried.append(Retried(r.offset, attempt + 1, now + max(0, wait)))
        writes = []
        if again:
            writes.append(self._retry(retry, again, dues))
        if dead:
            writes.append(self._dead(policy.dead_letter_topic, dead))
        await asyncio.gather(*writes)
        if again:
            self.consume.retry_topic_made(retry)
        ack = await self.consume.commit(ref, credential)
        return Failed(ack, retried, dead_offsets, retry, policy.dead_letter_topic)

    async def _read(self, ref: BatchRef) -> list[Record]:
        """The batch's records, read again at the offsets the requestId names.

        A read answers what is readable now, and under load one can come back empty where the
        batch's records certainly are (they were delivered): that is asked again, never taken
        for the end. Taking it so committed the batch without its failed records, which were
        then never retried (the soak lost 2-13 that way in minutes under heavy load). Only
        offsets the broker no longer holds (below its low watermark: retention) are passed
        over; records still unreadable after :data:`REREADS` tries raise BrokerUnavailable,
        and nothing is written or committed (the client may nack again; the lock expires)."""
        out: list[Record] = []
        at = ref.offset
        empty = 0
        while at < ref.next_offset:
            res = await self.broker.fetch(ref.topic, ref.queue, at, ref.next_offset - at,
                                          parse_tag_filter(ref.tags))
            out += [r for r in res.records if r.offset < ref.next_offset]
            if res.next_offset > at:
                at, empty = res.next_offset, 0
                continue
            low = (await self.broker.watermarks(ref.topic)).get(ref.queue, (0, 0))[0]
            if low > at:  # deleted by retention since it was delivered
                at, empty = low, 0
                continue
            empty += 1
            if empty > REREADS:
                raise BrokerUnavailable(f"records {at}-{ref.next_offset - 1} of {ref.topic} "
                                        f"queue {ref.queue} could not be read again")
            await asyncio.sleep(REREAD_PAUSE_S * empty)
        return out

    def _carry(self, r: Record, ref: BatchRef, attempt: int, now: int) -> OutgoingMessage:
        """The record as the retry (or dead-letter) topic holds it: its own key, value and
        headers, and in ``mqgw-*`` headers where and when it came from and how it fared."""
        first = header(r, H_FIRST) or str(ref.fetched_ms or now)
        headers = [(n, v) for n, v in r.headers if n not in OWN_HEADERS]
        headers += [(H_ATTEMPT, str(attempt).encode()), (H_FIRST, first.encode()),
                    (H_FAILED, str(now).encode()),
                    (H_ORIGIN_TOPIC, (header(r, H_ORIGIN_TOPIC) or ref.topic).encode()),
                    (H_ORIGIN_QUEUE, (header(r, H_ORIGIN_QUEUE) or ref.queue).encode()),
                    (H_ORIGIN_OFFSET, (header(r, H_ORIGIN_OFFSET) or str(r.offset)).encode()),
                    (H_ORIGIN_TS, (header(r, H_ORIGIN_TS) or str(r.timestamp)).encode()),
                    (H_CONSUMER, ref.consumer.encode())]
        if ref.client_id:
            headers.append((H_CLIENT, ref.client_id.encode()))
        return OutgoingMessage(r.value, r.key, headers, tag=r.tag)  # the broker's time: see H_ORIGIN_TS

    async def _retry(self, topic: str, messages: list[OutgoingMessage],
                     dues: list[int | None]) -> None:
        produced, _ = await self.delay.produce(topic, messages, dues)
        _raise_failed(produced.results, topic)

    async def _dead(self, topic: str, messages: list[OutgoingMessage]) -> None:
        _raise_failed((await produce(self.broker, topic, messages)).results, topic)

    async def _ensure(self, topics: dict[str, int]) -> None:
        """Make the retry and dead-letter topics that do not exist (looked up once per process
        and topic for :data:`KNOWN_S`)."""
        now = time.monotonic()
        todo = {t: self.settings.retry_partitions for t in topics
                if now - self._made.get(t, -KNOWN_S) >= KNOWN_S}
        if todo:
            await self.broker.ensure_topics(todo)
            self._made.update(dict.fromkeys(todo, now))


def _raise_failed(results: list[ProduceResult], topic: str) -> None:
    bad = next((r for r in results if r.error_code), None)
    if bad is not None:  # nothing is committed: the batch comes back, and is failed again
        raise BrokerUnavailable(f"writing failed records to {topic}: {bad.error}")

