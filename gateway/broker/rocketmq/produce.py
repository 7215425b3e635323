"""Writes: SEND_MESSAGE_V2 for one record, SEND_BATCH_MESSAGE for several of one queue.

The broker runs sends on up to 4 threads (``sendMessageThreadPoolNums``), so two sends to one
queue in flight at once may be stored in either order: the records of a request that go to one
queue travel as one batch (stored in order, at consecutive offsets from the answer's
``queueOffset``), and queues are written concurrently. A record with a due time (a timer
message) travels alone: the broker takes no delay in a batch.

A record's key is the ``KEYS`` property (UTF-8; RocketMQ indexes it), its tag ``TAGS``, its
headers user properties. Properties are a string map, so a record whose headers repeat a name,
use a RocketMQ system name or hold bytes that are not UTF-8 is refused (``invalid_record``).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Iterator

from ..base import BrokerUnavailable, OutgoingMessage, ProduceError, ProduceResult
from ..partitioner import partition_for_key
from .client import Client, Slot
from .codes import DEFAULT_TOPIC, Req, Resp
from .message import (
    KEYS,
    NAME_VALUE_SEP,
    PLACEHOLDER_BODY,
    PROPERTY_SEP,
    TAGS,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    VALUE_MARK,
    WAIT,
    format_properties,
    new_unique_key,
    property_problem,
    to_broker_name,
)
from .remoting import Command

#: A send the broker refused as busy (its send queue waited longer than
#: ``waitTimeMillsInSendQueue``, 200 ms by default: "[TIMEOUT_CLEAN_QUEUE]broker busy", seen
#: with ~130 timer sends at once on a loaded 2-core machine) was never stored, so it is sent
#: again after these pauses before the record is failed.
BUSY_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8)
#: Sends in flight per process at most: a burst of single sends (timer records travel alone)
#: beyond this waits here rather than in the broker's queue, where it would be refused.
IN_FLIGHT = 64
#: A batch request's body at most (the broker's ``maxMessageSize`` is 4 MiB by default).
BATCH_BYTES = 1 << 20
_BATCH_HEAD = struct.Struct(">iiiii")  # size, magic 0, crc 0, flag, body length


class InvalidRecord(Exception):
    pass


def properties(m: OutgoingMessage) -> dict[str, str]:
    """The record's properties; :class:`InvalidRecord` when RocketMQ cannot carry it."""
    props: dict[str, str] = {}
    for name, raw in m.headers:
        try:
            value = raw.decode()
        except UnicodeDecodeError:
            raise InvalidRecord(f"header {name!r}: RocketMQ properties are UTF-8 text") from None
        if name in props:
            raise InvalidRecord(f"header {name!r} is repeated: RocketMQ properties are a map")
        if (problem := property_problem(name, value)) is not None:
            raise InvalidRecord(problem)
        props[name] = value
    if m.key:
        try:
            key = m.key.decode()
        except UnicodeDecodeError:
            raise InvalidRecord("RocketMQ keys (the KEYS property) are UTF-8 text") from None
        if NAME_VALUE_SEP in key or PROPERTY_SEP in key:
            raise InvalidRecord("keys may not contain the characters \\x01 or \\x02")
        props[KEYS] = key
    if m.tag:
        if NAME_VALUE_SEP in m.tag or PROPERTY_SEP in m.tag or "|" in m.tag:
            raise InvalidRecord("tags may not contain '|', \\x01 or \\x02")
        props[TAGS] = m.tag
    if not m.value:
        props[VALUE_MARK] = "null" if m.value is None else "empty"
    props[UNIQ_KEY] = new_unique_key()
    props[WAIT] = "true"
    if m.deliver_at is not None:
        props[TIMER_DELIVER_MS] = str(m.deliver_at)
    return props


class Sender:
    def __init__(self, client: Client, producer_group: str) -> None:
        self._client = client
        self._group = producer_group
        self._spread = itertools.count()
        self._in_flight: asyncio.Semaphore | None = None

    async def _call(self, addr: str, code: int, ext: dict[str, str], body: bytes) -> Command:
        """One send, again while the broker says it is busy (nothing was stored then)."""
        if self._in_flight is None:
            self._in_flight = asyncio.Semaphore(IN_FLIGHT)
        for pause in (*BUSY_PAUSES_S, None):
            async with self._in_flight:
                resp = await self._client.call(addr, code, ext, body)
            if resp.code not in (Resp.SYSTEM_BUSY, Resp.FLOW_CONTROL) or pause is None:
                return resp
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def produce(self, topic: str, messages: list[OutgoingMessage]) -> list[ProduceResult]:
        route = await self._client.route(topic)
        slots = route.writable()
        if not slots:
            raise BrokerUnavailable(f"no writable queue of {topic} has a master now")
        by_qid = {s.qid: s for s in slots}
        results = [ProduceResult() for _ in messages]
        groups: dict[str, list[tuple[int, OutgoingMessage, dict[str, str]]]] = {}
        singles: list[tuple[int, Slot, OutgoingMessage, dict[str, str]]] = []
        start = next(self._spread)
        for i, m in enumerate(messages):
            if m.queue is not None:
                slot = by_qid.get(m.queue)
                if slot is None:
                    results[i] = ProduceResult(error_code=ProduceError.UNKNOWN_PARTITION,
                                               error=f"{topic} has no writable queue {m.queue}")
                    continue
            elif m.key:
                slot = slots[partition_for_key(m.key, len(slots))]
            else:
                slot = slots[(start + i) % len(slots)]
            try:
                props = properties(m)
            except InvalidRecord as e:
                results[i] = ProduceResult(error_code=ProduceError.INVALID_RECORD, error=str(e))
                continue
            if m.deliver_at is not None:
                singles.append((i, slot, m, props))
            else:
                groups.setdefault(slot.qid, []).append((i, m, props))
        sends = [self._send_one(topic, route.masters[slot.broker], slot, m, props, results, i)
                 for i, slot, m, props in singles]
        for qid, items in groups.items():
            slot = by_qid[qid]
            for chunk in _chunks(items):
                if len(chunk) == 1:
                    i, m, props = chunk[0]
                    sends.append(self._send_one(topic, route.masters[slot.broker], slot, m, props,
                                                results, i))
                else:
                    sends.append(self._send_batch(topic, route.masters[slot.broker], slot, chunk,
                                                  results))
        await asyncio.gather(*sends)
        return results

    def _header(self, topic: str, slot: Slot, props: str, born: int, batch: bool) -> dict[str, str]:
        return {"a": self._group, "b": to_broker_name(topic), "c": DEFAULT_TOPIC, "d": "4",
                "e": str(slot.queue_id), "f": "0", "g": str(born), "h": "0", "i": props,
                "j": "0", "k": "false", "m": "true" if batch else "false", "n": slot.broker}

    async def _send_one(self, topic: str, addr: str, slot: Slot, m: OutgoingMessage,
                        props: dict[str, str], results: list[ProduceResult], i: int) -> None:
        born = m.timestamp if m.timestamp is not None else int(time.time() * 1000)
        try:
            resp = await self._call(addr, Req.SEND_MESSAGE_V2, self._header(
                topic, slot, format_properties(props), born, False), m.value or PLACEHOLDER_BODY)
        except BrokerUnavailable as e:
            results[i] = ProduceResult(error_code=ProduceError.BROKER_TIMEOUT, error=str(e))
            return
        results[i] = self._result(topic, slot, resp.code, resp.remark, resp.ext, m.deliver_at is not None)

    async def _send_batch(self, topic: str, addr: str, slot: Slot,
                          items: list[tuple[int, OutgoingMessage, dict[str, str]]],
                          results: list[ProduceResult]) -> None:
        born = items[0][1].timestamp
        body = b"".join(_encode(m.value or PLACEHOLDER_BODY, props) for _, m, props in items)
        head = format_properties({UNIQ_KEY: new_unique_key(), WAIT: "true"})
        try:
            resp = await self._call(addr, Req.SEND_BATCH_MESSAGE, self._header(
                topic, slot, head, born if born is not None else int(time.time() * 1000), True), body)
        except BrokerUnavailable as e:
            for i, _, _ in items:
                results[i] = ProduceResult(error_code=ProduceError.BROKER_TIMEOUT, error=str(e))
            return
        first = self._result(topic, slot, resp.code, resp.remark, resp.ext, False)
        for n, (i, _, _) in enumerate(items):
            results[i] = first if first.error_code else ProduceResult(first.queue, first.offset + n)

    def _result(self, topic: str, slot: Slot, code: int, remark: str | None, ext: dict[str, str],
                timer: bool) -> ProduceResult:
        if code == Resp.SUCCESS:
            if timer:  # stored in the timer's own topic: its queue and offset are not the record's
                return ProduceResult(cancel_handle=ext.get("recallHandle", ""))
            return ProduceResult(slot.qid, int(ext["queueOffset"]))
        why = f"RocketMQ answered {code}: {remark or ''}".rstrip(": ")
        if code == Resp.TOPIC_NOT_EXIST:
            self._client.forget(topic)
            return ProduceResult(error_code=ProduceError.UNKNOWN_TOPIC, error=why)
        if code == Resp.MESSAGE_ILLEGAL:
            if timer and remark and "delay" in remark.lower():
                return ProduceResult(error_code=ProduceError.INVALID_DELAY, error=why)
            return ProduceResult(error_code=ProduceError.MESSAGE_TOO_LARGE, error=why)
        if code in (Resp.SYSTEM_BUSY, Resp.FLOW_CONTROL, Resp.SERVICE_NOT_AVAILABLE):
            return ProduceResult(error_code=ProduceError.BROKER_TIMEOUT, error=why)
        return ProduceResult(error_code=ProduceError.BROKER_ERROR, error=why)


def _encode(body: bytes, props: dict[str, str]) -> bytes:
    """One record of a batch body (``MessageDecoder.encodeMessage``): flag, body, properties."""
    p = format_properties(props).encode()
    size = _BATCH_HEAD.size + len(body) + 2 + len(p)
    return _BATCH_HEAD.pack(size, 0, 0, 0, len(body)) + body + struct.pack(">h", len(p)) + p


def _chunks(items: list[tuple[int, OutgoingMessage, dict[str, str]]]
            ) -> Iterator[list[tuple[int, OutgoingMessage, dict[str, str]]]]:
    """Consecutive records of one queue, cut at :data:`BATCH_BYTES` and where the record time
    changes (a batch has one born time, in its header)."""
    chunk: list[tuple[int, OutgoingMessage, dict[str, str]]] = []
    size = 0
    for item in items:
        n = len(item[1].value or b"") + 200
        if chunk and (size + n > BATCH_BYTES or item[1].timestamp != chunk[0][1].timestamp):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        yield chunk

