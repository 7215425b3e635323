"""The consume service: ``/message``, ``/ack``, ``/extend`` and ``/unlock`` as one object. It
returns typed results and raises domain errors; the HTTP layer turns those into bodies and
statuses, and the broker adapter owns its offsets.

``/message`` = (optional piggy-backed ack) -> the fetch path (core/fetch.py: choose+lock one
queue, read it, or wait). ``/ack``, ``/extend`` and ``/unlock`` act on the batch a signed
requestId names (core/requestid.py), on any node: each is one script call, and a freed queue
wakes one poll of this process waiting for it. Whether a consumer's retry topic is worth a look is
core/retry_topics.py's.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import replace

from ..broker import Broker
from ..config import Settings
from ..store import (
    AckOutcome,
    AckResult,
    Credential,
    ExtendOutcome,
    ExtendResult,
    OffsetStore,
    UnlockOutcome,
    UnlockResult,
)
from .auth import Authorizer
from .checkpoint import Checkpoints
from .errors import invalid
from .fetch import IDLE_RECHECK_S, Batch, Fetched, Fetcher, FetchParams, FetchStatus, PollControl
from .registry_copy import RegistryCopy
from .requestid import BatchRef, RequestIdCodec
from .retry import retry_topic
from .retry_topics import RetryTopics
from .waiting import WaitRoom
from .watermarks import Watermarks


class ConsumeService:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 watermarks: Watermarks, codec: RequestIdCodec, authorizer: Authorizer,
                 on_ack: Callable[[AckResult], None] | None = None,
                 checkpoints: Checkpoints | None = None,
                 registry_copy: RegistryCopy | None = None) -> None:
        self.settings = settings
        #: Told of every ack the store decided, as soon as it is decided: a piggy-backed ack is
        #: committed even when the fetch after it fails (the HTTP layer counts them in metrics).
        self.on_ack = on_ack
        self.store = store
        self.broker = broker
        self.wm = watermarks
        self.codec = codec
        self.auth = authorizer
        self.checkpoints = checkpoints
        self.room = WaitRoom(self._highs, watermarks.refresh_s, IDLE_RECHECK_S, self._seen_highs)
        self.retries = RetryTopics(watermarks, settings.retry_topic_prefix, self.room.wake)
        self.fetcher = Fetcher(settings, store, broker, watermarks, codec, authorizer, self.room,
                               self.retries, checkpoints, registry_copy)

    def drain(self) -> None:
        """The node is stopping: waiting polls answer now, with what they have (nothing)."""
        self.room.drain()

    async def _highs(self, topic: str) -> dict[str, int]:
        return {q: hi for q, (_lo, hi) in (await self.wm.get(topic)).items()}

    def _seen_highs(self, topic: str) -> dict[str, int]:
        return {q: hi for q, (_lo, hi) in self.wm.cached(topic).items()}

    # -- /message -------------------------------------------------------------------------
    async def fetch(self, p: FetchParams) -> Fetched:
        """Ack the piggy-backed batch, if any (its sender chooses next), then fetch."""
        acked: AckResult | None = None
        retries = {t: retry_topic(self.settings.retry_topic_prefix, p.consumer, t, p.client_id,
                                  self.broker.max_topic_length) for t in p.topics}
        if p.ack_request_id:
            ref = self.decode(p.ack_request_id)
            if (ref.consumer, ref.client_id) != (p.consumer, p.client_id) or \
                    (ref.topic not in retries and ref.topic not in retries.values()):
                raise invalid("request_id_mismatch",
                              "requestId belongs to another consumer, clientId or topic")
            acked = await self.commit(ref, p.credential, wake=False)
        if p.also_topics:
            got = await self._fetch_any(p, retries)
        else:
            got = await self.fetcher.fetch(p, retries[p.topic])
        return replace(got, ack=acked)

    async def _fetch_any(self, p: FetchParams, retries: dict[str, str]) -> Fetched:
        """One batch from whichever of several topics has records first.

        First a look at each without waiting, from a topic picked at random (a busy first topic
        must not starve the others), so that when several have records only one is locked.
        Then, if all were empty, one long poll per topic at once, each woken as a single-topic
        poll is (waiting.py); the first batch is the answer, and a batch another topic's poll
        locked at the same moment is handed back at once (its queue is free for the next
        fetch, its rate-limit tokens refunded)."""
        topics = list(p.topics)
        first = random.randrange(len(topics))
        order = topics[first:] + topics[:first]
        for t in order:
            got = await self.fetcher.fetch(replace(p, topic=t, also_topics=(), wait_ms=0),
                                           retries[t])
            if got.status is not FetchStatus.EMPTY:
                return got
        if p.wait_ms <= 0:
            return Fetched(FetchStatus.EMPTY, p.topic)
        controls = [PollControl() for _ in order]
        polls = [asyncio.ensure_future(self.fetcher.fetch(replace(p, topic=t, also_topics=()),
                                                          retries[t], c))
                 for t, c in zip(order, controls, strict=True)]
        answer: Fetched | None = None
        try:
            pending: set[asyncio.Future[Fetched]] = set(polls)
            while pending and answer is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for d in polls:
                    if d in done and answer is None and d.result().status is not FetchStatus.EMPTY:
                        answer = d.result()  # (an error is raised here, and the rest stopped)
        finally:
            # Only waiting polls are cancelled (PollControl); the others end after their step,
            # and a batch one of them locked meanwhile is handed back below.
            for poll, c in zip(polls, controls, strict=True):
                c.stop = True
                if c.waiting:
                    poll.cancel()
            ended = await asyncio.gather(*polls, return_exceptions=True)
            extra = [e.batch for e in ended if isinstance(e, Fetched) and e is not answer
                     and e.batch is not None]
            if extra:
                await asyncio.shield(self._hand_back(p, extra))
        return answer or Fetched(FetchStatus.EMPTY, p.topic)

    async def _hand_back(self, p: FetchParams, batches: list[Batch]) -> None:
        """Give back batches read for this request but never answered (nothing handed out)."""
        for b in batches:
            await self.release(b.ref or self.decode(b.request_id), p.credential, handed_out=False)
            await self.store.refund(p.consumer, len(b.records), client_id=p.client_id,
                                    queue=b.queue)

    def retry_topic_made(self, retry: str) -> None:
        """This process just made (or wrote to) ``retry``: serve it from now on."""
        self.retries.made(retry)

    # -- /ack and /unlock -----------------------------------------------------------------
    def decode(self, request_id: str) -> BatchRef:
        """Verify a requestId, and that it was handed out for this gateway's broker."""
        ref = self.codec.decode(request_id)
        if ref.broker != self.broker.name:
            raise invalid("invalid_request_id", f"requestId was issued for broker "
                          f"{ref.broker!r}; this gateway serves {self.broker.name!r}")
        return ref

    async def ack(self, request_id: str, credential: Credential | None = None) -> AckResult:
        return await self.commit(self.decode(request_id), credential)

    async def commit(self, ref: BatchRef, credential: Credential | None, wake: bool = True,
                     check_only: bool = False) -> AckResult:
        """Ack the batch ``ref`` names (``check_only``: say what an ack would do, commit nothing)."""
        r = await self.store.ack(ref.consumer, ref.client_id, ref.topic, ref.queue, ref.offset,
                                 ref.next_offset, ref.token,
                                 default_timeout_ms=self.settings.consume_timeout_ms,
                                 high_watermark=ref.high_watermark, credential=credential,
                                 check_only=check_only)
        if r.result is AckOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.consumer)
        if check_only:
            return r
        self.acked(ref.consumer, ref.client_id, ref.topic, r, wake)
        return r

    def acked(self, consumer: str, client_id: str, topic: str, r: AckResult,
              wake: bool = True) -> None:
        """What follows an ack's script, whichever script acked: the ack hook (metrics), and
        the polls waiting for the queue woken if it was committed (it is free, and may hold
        more)."""
        if self.on_ack is not None:
            self.on_ack(r)
        if wake and r.result is AckOutcome.COMMITTED:
            self.room.wake((topic, consumer, client_id))

    async def extend(self, request_id: str, credential: Credential | None = None) -> ExtendResult:
        """Hold the batch's queue for another lock timeout, from now (a handler that needs
        longer than the timeout calls it before the lock runs out)."""
        ref = self.decode(request_id)
        r = await self.store.extend(ref.consumer, ref.client_id, ref.topic, ref.queue, ref.offset,
                                    ref.next_offset, ref.token,
                                    default_timeout_ms=self.settings.consume_timeout_ms,
                                    credential=credential)
        if r.result is ExtendOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.consumer)
        return r

    async def unlock(self, request_id: str, credential: Credential | None = None) -> UnlockResult:
        return await self.release(self.decode(request_id), credential)

    async def release(self, ref: BatchRef, credential: Credential | None = None,
                      handed_out: bool = True) -> UnlockResult:
        """Unlock the batch ``ref`` names (a verified requestId). ``handed_out``: the batch
        reached a client, so it comes back flagged ``redelivered``."""
        r = await self.store.unlock(ref.consumer, ref.client_id, ref.topic, ref.queue, ref.token,
                                    ref.high_watermark, credential,
                                    handed_out_to=ref.next_offset if handed_out else -1)
        if r.result is UnlockOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.consumer)
        if r.result is UnlockOutcome.UNLOCKED:  # the batch is up for grabs again
            self.room.wake((ref.topic, ref.consumer, ref.client_id))
        return r
