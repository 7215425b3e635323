"""Fetch, ack and unlock: the consume path, independent of HTTP.

``/message`` = (optional piggy-backed ack) -> choose+lock one queue in Redis -> pull at
the committed offset -> hand out the records with a signed requestId. Long polls
sleep until something that could create work changes (a high watermark moves, a
held lock expires) or a slow periodic re-check, so an idle poll costs a handful of
Redis calls, never a busy loop.
"""

from __future__ import annotations

import asyncio
import base64

from dataclasses import dataclass
from typing import Any

from . import metrics
from .auth import Authorizer
from .broker import Broker, FetchResult, Record, UnknownTopic
from .config import Settings
from .errors import ApiError, bad_request
from .requestid import BatchRef, RequestIdCodec
from .store import (AckResult, Credential, Lock, NoQueue, OffsetStore, Paused, RateLimited,
                    Refused, now_ms)
from .watermarks import Watermarks

#: While long-polling with a backlog held under other consumers' locks, re-run choose this
#: often: an ack or early unlock on another node frees the queue without any other signal.
RECHECK_S = 1.0
#: With no backlog anywhere only new records (seen as a watermark change, no Redis call per
#: waiter) or an offset reset create work, so a slow re-check is enough.
IDLE_RECHECK_S = 5.0
#: Each process re-announces the consumers it serves (for the all-consumer views) this often.
SEEN_EVERY_MS = 60_000

_REFUSED = {
    "unregistered": (403, "unregistered_consumer", "consumer {g!r} is not registered "
                     "(PUT /admin/consumers/{g}, or run the gateway in open mode)"),
    "topic_not_allowed": (403, "topic_not_allowed", "consumer {g!r} is not registered for topic {t!r}"),
    "client_id_required": (400, "client_id_required", "consumer {g!r} is registered in broadcast "
                           "mode: every request needs a clientId"),
    "client_id_not_allowed": (400, "client_id_not_allowed", "consumer {g!r} is registered in "
                              "cluster mode: a clientId is not allowed"),
}


@dataclass(frozen=True, slots=True)
class FetchParams:
    group: str
    client_id: str
    topic: str
    max_messages: int
    wait_ms: int
    encoding: str  # utf8 (falls back to base64 per record when not UTF-8) | base64
    address: str
    ack_request_id: str = ""
    credential: Credential | None = None  # None: auth is off


class ConsumeService:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 watermarks: Watermarks, codec: RequestIdCodec, authorizer: Authorizer) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.wm = watermarks
        self.codec = codec
        self.auth = authorizer
        self._seen: dict[str, int] = {}

    # -- /message -------------------------------------------------------------------------
    async def fetch(self, p: FetchParams) -> dict[str, Any]:
        acked: dict[str, Any] | None = None
        if p.ack_request_id:
            ref = self.codec.decode(p.ack_request_id)
            if (ref.group, ref.client_id, ref.topic) != (p.group, p.client_id, p.topic):
                raise bad_request("request_id_mismatch",
                                  "requestId belongs to another consumer, clientId or topic")
            acked = ack_body(await self._ack(ref, p.credential))
        announced = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + p.wait_ms / 1000
        skip: set[str] = set()  # queues that had nothing readable during this request
        # queues this request took over from an expired lock: if the first read comes back empty
        # and the queue is taken again later in the request, its batch is still a redelivery
        taken_over: set[str] = set()
        while True:
            try:
                wm = await self.wm.get(p.topic)
            except (UnknownTopic, ApiError) as e:
                if isinstance(e, UnknownTopic) or e.code == "unknown_topic":
                    await self.auth.require_consume(p.credential, p.group)  # 401/403 before 404
                raise
            version = self.wm.version(p.topic)
            chosen = await self.store.choose(
                p.group, p.client_id, p.topic, wm, address=p.address,
                default_timeout_ms=self.settings.consume_timeout_ms,
                default_start=self.settings.start_position,
                client_idle_ms=self.settings.client_idle_ms, max_messages=p.max_messages,
                open_mode=self.settings.open_mode, credential=p.credential, skip=skip)
            if isinstance(chosen, Refused):
                raise await self._refused(chosen.reason, p)
            if not announced:  # only names choose.lua accepted (key, registration) are listed
                announced = True
                try:
                    await self._announce(p.group)
                except BaseException:
                    if isinstance(chosen, Lock):
                        await asyncio.shield(self._give_back(p, chosen))
                    raise
            if isinstance(chosen, (Paused, RateLimited)):  # answered at once, never long-polled
                body = {"status": "paused", "topic": p.topic, "messages": []}
                if isinstance(chosen, RateLimited):
                    body.update(status="rate_limited", retryAfterMs=chosen.retry_after_ms)
                if acked is not None:
                    body["ack"] = acked
                return body
            if isinstance(chosen, Lock):
                if chosen.previous_lock_ms > 0:
                    taken_over.add(chosen.queue)
                body = await self._pull(p, chosen, redelivered=chosen.queue in taken_over)
                if body is not None:
                    if acked is not None:
                        body["ack"] = acked
                    return body
                skip.add(chosen.queue)  # nothing readable there right now: try the others first
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                body = {"status": "empty", "topic": p.topic, "messages": []}
                if acked is not None:
                    body["ack"] = acked
                return body
            await self._wait_for_work(p.topic, version, chosen, remaining)
            skip.clear()

    async def _refused(self, reason: str, p: FetchParams) -> ApiError:
        if reason == "unauthorized":
            return await self.auth.consume_refused(p.credential, p.group)
        status, code, text = _REFUSED[reason]
        return ApiError(status, code, text.format(g=p.group, t=p.topic))

    async def _announce(self, group: str) -> None:
        """List the consumer in ``P:{reg}:seen`` (once a minute per process) for the views."""
        now = now_ms()
        if now - self._seen.get(group, 0) >= SEEN_EVERY_MS:
            if len(self._seen) >= 100_000:  # a memo, not a registry: start over rather than grow
                self._seen.clear()
            self._seen[group] = now
            await self.store.redis.sadd(self.store.registry_key("seen"), group)

    async def _wait_for_work(self, topic: str, version: int, none: NoQueue, remaining: float) -> None:
        if none.wake_ms >= 0:
            wake = min(remaining, RECHECK_S, max(0.0, (none.wake_ms - now_ms()) / 1000) + 0.002)
        else:
            wake = min(remaining, IDLE_RECHECK_S)
        loop = asyncio.get_running_loop()
        until = loop.time() + wake
        step = self.wm.refresh_s
        while True:
            left = until - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(step, left))
            await self.wm.get(topic)  # served from the process cache within refresh_ms
            if self.wm.version(topic) != version:
                return

    async def _read(self, p: FetchParams, queue: str, start: int,
                    limit: int) -> tuple[FetchResult, dict | None]:
        """Fetch at ``start``; return the result and what was skipped over, if anything.

        Offsets missing at the start of a read (records begin above ``start``, or there are no
        records but the log ends above it) are legitimate on Apache Kafka for compaction and
        transaction markers, but a fetch racing a producer at the tail can also skip records
        that become readable a moment later. So such a hole is accepted only after one more
        look; a committed offset never jumps over records that were never returned otherwise.
        """
        res = await self.broker.fetch(p.topic, queue, start, limit)
        if res.out_of_range and res.low_watermark > start:
            res2 = await self.broker.fetch(p.topic, queue, res.low_watermark, limit)
            return res2, {"from": start, "to": res.low_watermark, "reason": "out_of_retention"}
        if _first_offset(res) > start:
            await asyncio.sleep(self.settings.gap_recheck_ms / 1000)
            res = await self.broker.fetch(p.topic, queue, start, limit)
            first = _first_offset(res)
            if first > start:
                return res, {"from": start, "to": first, "reason": "gap" if res.records else "no_records"}
        return res, None

    async def _give_back(self, p: FetchParams, lock: Lock) -> None:
        await self.store.unlock(p.group, p.client_id, p.topic, lock.queue, lock.token)
        if lock.charged:
            await self.store.refund(p.group, lock.allowance)

    async def _pull(self, p: FetchParams, lock: Lock, redelivered: bool) -> dict[str, Any] | None:
        """Read the locked queue; None (with the lock released or the gap committed) if empty."""
        start = lock.committed
        try:
            res, skipped = await self._read(p, lock.queue, start, lock.allowance)
        except BaseException:
            # The broker failed (or the client went away): free the queue for the next fetch now
            # rather than after the consume timeout, and give back the rate-limit tokens charged
            # for records nobody received (a broker blip must not turn into 429s afterwards).
            await asyncio.shield(self._give_back(p, lock))
            raise
        self.wm.observe(p.topic, lock.queue, res.high_watermark)
        if lock.charged and len(res.records) < lock.allowance:  # rare: a read came back short
            await self.store.refund(p.group, lock.allowance - len(res.records))
        if not res.records:
            if skipped is not None:  # nothing readable past the gap: move past it ourselves
                await self.store.ack(p.group, p.client_id, p.topic, lock.queue, start, skipped["to"],
                                     lock.token, default_timeout_ms=self.settings.consume_timeout_ms,
                                     high_watermark=res.high_watermark)
            else:
                await self.store.unlock(p.group, p.client_id, p.topic, lock.queue, lock.token,
                                        res.high_watermark)
            return None
        next_offset = res.records[-1].offset + 1
        ref = BatchRef(self.broker.name, p.group, p.client_id, p.topic, lock.queue, start,
                       next_offset, lock.token, res.high_watermark)
        body: dict[str, Any] = {
            "status": "ok",
            "requestId": self.codec.encode(ref),
            "broker": self.broker.name,
            "topic": p.topic,
            "queue": lock.queue,
            "offset": start,
            "nextOffset": next_offset,
            "backlog": max(lock.max_offset, res.high_watermark) - start,
            "redelivered": redelivered,
            "lockTimeoutMs": lock.timeout_ms,
            "messages": encode_records(res.records, p.encoding),
        }
        if skipped is not None:
            body["skipped"] = skipped
        return body

    # -- /ack and /unlock -----------------------------------------------------------------
    async def ack(self, request_id: str, credential: Credential | None = None) -> AckResult:
        return await self._ack(self.codec.decode(request_id), credential)

    async def _ack(self, ref: BatchRef, credential: Credential | None) -> AckResult:
        r = await self.store.ack(ref.group, ref.client_id, ref.topic, ref.queue, ref.offset,
                                 ref.next_offset, ref.token,
                                 default_timeout_ms=self.settings.consume_timeout_ms,
                                 high_watermark=ref.high_watermark, credential=credential)
        if r.result == "unauthorized":
            raise await self.auth.consume_refused(credential, ref.group)
        metrics.acked(r.result)
        return r

    async def unlock(self, request_id: str, credential: Credential | None = None) -> tuple[str, int]:
        ref = self.codec.decode(request_id)
        result, committed = await self.store.unlock(ref.group, ref.client_id, ref.topic, ref.queue,
                                                    ref.token, ref.high_watermark, credential)
        if result == "unauthorized":
            raise await self.auth.consume_refused(credential, ref.group)
        return result, committed


_ACK_STATUS = {"committed": 200, "already_committed": 200, "lock_lost": 409,
               "offset_reset": 409, "offset_mismatch": 409, "unknown": 404}
_ACK_MESSAGE = {
    "committed": "offsets committed",
    "already_committed": "this batch was already committed; nothing changed",
    "lock_lost": "another fetch took the queue (this batch's lock expired or was unlocked); the "
                 "batch will be (or was) redelivered there",
    "offset_reset": "an operator reset this queue's offsets after the batch was fetched; "
                    "nothing changed",
    "offset_mismatch": "the committed offset no longer matches this batch; nothing changed",
    "unknown": "no such queue for this consumer (expired clientId or deleted consumer)",
}


def ack_body(r: AckResult) -> dict[str, Any]:
    body: dict[str, Any] = {"result": r.result, "committedOffset": r.committed,
                            "message": _ACK_MESSAGE[r.result]}
    if r.result == "committed":
        body["lock"] = r.lock_state
    return body


def ack_status(r: AckResult) -> int:
    return _ACK_STATUS[r.result]


def _first_offset(res: FetchResult) -> int:
    """Where readable data starts in a fetch result, -1 if it says nothing."""
    return res.records[0].offset if res.records else res.end_offset


def encode_records(records: list[Record], encoding: str) -> list[dict[str, Any]]:
    out = []
    b64 = encoding == "base64"
    for r in records:
        key, value, headers = r.key, r.value, r.headers
        enc = "base64" if b64 else "utf8"
        if not b64:
            try:
                k = key.decode() if key is not None else None
                v = value.decode() if value is not None else None
                h = [[n, hv.decode() if hv is not None else None] for n, hv in headers]
            except UnicodeDecodeError:
                enc = "base64"
        if enc == "base64":
            k = _b64(key)
            v = _b64(value)
            h = [[n, _b64(hv)] for n, hv in headers]
        out.append({"offset": r.offset, "timestamp": r.timestamp, "key": k, "value": v,
                    "headers": h, "encoding": enc})
    return out


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


