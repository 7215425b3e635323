"""Pulls at an offset (PULL_MESSAGE), and RocketMQ's offset rules in the port's terms.

Consume-queue offsets are given one by one per queue at write time, so they are contiguous: a
pull skips offsets only for a tag filter (the broker's answer 20, or records starting past the
offset asked), retention (20 for a removed commit log, 21 below the low watermark) or an empty
queue. Unlike Kafka's tail (Tansu's race, reads.py there), a hole is never a record that turns
up later, so nothing is looked at twice. The broker answers at most 32 records a pull
(``maxTransferCountOnMessageInMemory``): a larger read takes several.
"""

from __future__ import annotations

import asyncio

from ..base import FetchResult, Record, Skipped, SkipReason, fitting
from .client import Client, check
from .codes import PULL_SUBSCRIPTION, Req, Resp
from .groups import Groups
from .message import (
    TAGS,
    TIMER_DELIVER_MS,
    TIMER_DEQUEUE_MS,
    StoredMessage,
    decode_messages,
    to_broker_name,
)
from .remoting import Command

#: Records the broker gives per pull (its default ``maxTransferCountOnMessageInMemory``).
PULL_MAX = 32
#: Pulls per fetch at most (a tag filter can refuse long stretches).
MAX_PULLS = 64
#: Pulls in flight at once for one large read.
PIPELINE = 8
#: Header on a record whose body could not be decompressed (the value is then empty).
H_UNDECODABLE = "mqgw-undecodable"


def subscription(tags: frozenset[str] | None) -> str:
    return "*" if not tags else " || ".join(sorted(tags))


async def pull(client: Client, groups: Groups, group: str, topic: str, queue: str, offset: int,
               max_records: int, tags: frozenset[str] | None = None,
               max_bytes: int = 0) -> FetchResult:
    """Up to ``max_records`` from ``offset``: the records that are there now, in order.

    The broker answers 32 records a pull, so a large read takes several. Once a first answer
    said how far the queue goes, the rest are asked for at once (:data:`PIPELINE` at a time:
    offsets are contiguous, so the n-th pull starts 32 n further on); an answer that ends short
    (a byte limit, retention) makes the ones after it start elsewhere, so they are dropped and
    asked again. Measured (bench f1000): ~32 pulls one after another made a max=1000 read take
    a median 236 ms. With a tag filter, where answers skip, pulls go one at a time. At most
    :data:`MAX_PULLS` pulls: a filter that refuses a long stretch returns the offsets it
    stepped over (``skipped``) rather than holding the caller. ``max_bytes``: pulls stop once
    the records hold that many bytes, and the answer keeps what ``fitting`` keeps (pulls are
    stateless: records read past the limit cost the read, nothing after it)."""
    addr, qid = await client.master_of(topic, queue)
    records: list[Record] = []
    at = offset
    hw = -1
    made = False
    reason: SkipReason | None = None  # why offsets [offset, first record) hold no record

    async def call(start: int, want: int) -> Command:
        return await client.call(addr, Req.PULL_MESSAGE, {
            "consumerGroup": group, "topic": to_broker_name(topic), "queueId": str(qid),
            "queueOffset": str(start), "maxMsgNums": str(want), "sysFlag": str(PULL_SUBSCRIPTION),
            "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": subscription(tags),
            "subVersion": "0", "expressionType": "TAG"})

    async def take(resp: Command, want: int) -> bool:
        """Apply one answer at ``at``; False: the read is over."""
        nonlocal at, hw, made, reason
        nxt = int(resp.ext.get("nextBeginOffset", at))
        lo = int(resp.ext.get("minOffset", -1))
        hw = max(hw, int(resp.ext.get("maxOffset", -1)))
        if resp.code == Resp.SUCCESS:
            got = [m for m in decode_messages(resp.body) if m.queue_offset >= at]
            if got and got[0].queue_offset > at and not records:
                reason = reason or SkipReason.GAP
            kept = [_record(m) for m in got if _matches(m, tags)]
            if kept and not records and reason is None and kept[0].offset > at:
                reason = SkipReason.GAP  # the broker's hash filter let through another tag
            records.extend(kept)
            at = max(nxt, got[-1].queue_offset + 1 if got else at)
            return not (at >= hw >= 0 or (not got and nxt <= at))
        if resp.code in (Resp.PULL_RETRY_IMMEDIATELY, Resp.PULL_OFFSET_MOVED) and nxt > at:
            # Offsets the tag filter refused, or retention removed: stepped over.
            if not records and reason is None:
                reason = SkipReason.OUT_OF_RETENTION if 0 <= at < lo else \
                    SkipReason.GAP if tags else SkipReason.NO_RECORDS
            at = nxt
            return True
        if resp.code == Resp.SUBSCRIPTION_GROUP_NOT_EXIST and not made:
            # A cluster without autoCreateSubscriptionGroup: the reader group is made once.
            await groups.ensure(addr, group, fresh=True)
            made = True
            return True
        if resp.code in (Resp.PULL_NOT_FOUND, Resp.PULL_RETRY_IMMEDIATELY, Resp.PULL_OFFSET_MOVED):
            # Nothing at or past ``at`` now (21 with a next offset below it: the queue was emptied
            # or the store wiped; the offset is kept, never moved back, as Kafka's reads do).
            return False
        if resp.code == Resp.TOPIC_NOT_EXIST:
            client.forget(topic)
        check(resp, f"pull {topic} {queue}")
        return False

    pulls = 0
    while pulls < MAX_PULLS and len(records) < max_records and not (
            max_bytes and fitting(records, max_bytes) < len(records)):
        need = max_records - len(records)
        if tags is None and records and hw > at:
            end = at + min(need, hw - at)
            starts = [(s, min(PULL_MAX, end - s)) for s in range(at, end, PULL_MAX)][:PIPELINE]
        else:
            starts = [(at, min(PULL_MAX, need))]
        answers = await asyncio.gather(*(call(s, w) for s, w in starts))
        pulls += len(starts)
        more = True
        for (start, want), resp in zip(starts, answers, strict=True):
            if start != at:
                break  # an earlier answer ended short: this one started elsewhere
            more = await take(resp, want)
            if not more:
                break
        if not more:
            break
    if max_bytes and (n := fitting(records, max_bytes)) < len(records):
        del records[n:]
        at = records[-1].offset + 1
    at = max(at, offset)
    end = records[0].offset if records else at
    skipped = Skipped(offset, end, reason) if reason is not None and end > offset else None
    return FetchResult(records, at, hw, skipped)


def _matches(m: StoredMessage, tags: frozenset[str] | None) -> bool:
    """The broker filters tags by hash code: the string is checked here, as the Java client does
    (``PullAPIWrapper.processPullResult``)."""
    return not tags or m.properties.get(TAGS) in tags


def _record(m: StoredMessage) -> Record:
    headers = m.headers
    if m.error:
        headers.append((H_UNDECODABLE, m.error.encode()))
    # A record a timer held: its time is when the timer delivered it (as the gateway's wheel
    # writes a delayed record at its due time), not when it was sent. Its store time is no help:
    # the delivered copy keeps the first one's (measured: up to a delay before the due time).
    # One sent with a due time already past when the broker took it was stored at once, without
    # the timer: its store time is its delivery (bench/delay.py saw such records "early" by
    # their born time).
    dequeued = m.properties.get(TIMER_DEQUEUE_MS, "")
    ts = int(dequeued) if dequeued.isdigit() else \
        m.store_timestamp if TIMER_DELIVER_MS in m.properties else m.born_timestamp
    return Record(m.queue_offset, m.key, m.value, headers, ts, m.tag)
