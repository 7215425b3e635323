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
from .fetch import IDLE_RECHECK_S, Fetched, Fetcher, FetchParams
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

    async def _highs(self, topic: str) -> dict[str, int]:
        return {q: hi for q, (_lo, hi) in (await self.wm.get(topic)).items()}

    def _seen_highs(self, topic: str) -> dict[str, int]:
        return {q: hi for q, (_lo, hi) in self.wm.cached(topic).items()}

    # -- /message -------------------------------------------------------------------------
    async def fetch(self, p: FetchParams) -> Fetched:
        """Ack the piggy-backed batch, if any (its sender chooses next), then fetch."""
        acked: AckResult | None = None
        retry = retry_topic(self.settings.retry_topic_prefix, p.consumer, p.topic, p.client_id,
                            self.broker.max_topic_length)
        if p.ack_request_id:
            ref = self.decode(p.ack_request_id)
            if (ref.consumer, ref.client_id) != (p.consumer, p.client_id) or \
                    ref.topic not in (p.topic, retry):
                raise invalid("request_id_mismatch",
                              "requestId belongs to another consumer, clientId or topic")
            acked = await self.commit(ref, p.credential, wake=False)
        return replace(await self.fetcher.fetch(p, retry), ack=acked)

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
        if self.on_ack is not None:
            self.on_ack(r)
        if wake and r.result is AckOutcome.COMMITTED:  # the queue is free, and may hold more
            self.room.wake((ref.topic, ref.consumer, ref.client_id))
        return r

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
        ref = self.decode(request_id)
        r = await self.store.unlock(ref.consumer, ref.client_id, ref.topic, ref.queue, ref.token,
                                    ref.high_watermark, credential)
        if r.result is UnlockOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.consumer)
        if r.result is UnlockOutcome.UNLOCKED:  # the batch is up for grabs again
            self.room.wake((ref.topic, ref.consumer, ref.client_id))
        return r
