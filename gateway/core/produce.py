"""Produce: check the caller against the key and the producer registry, then send.

The wire format (JSON, UTF-8 or base64 payloads) is the HTTP layer's; this module takes
broker messages and returns each one's typed result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from ..broker import (
    Broker,
    BrokerUnavailable,
    Capability,
    OutgoingMessage,
    ProduceError,
    ProduceResult,
)
from ..store import Credential, OffsetStore, ProduceVerdict
from .errors import denied, invalid, unauthenticated
from .names import InternalTopics, check_public_topic


@dataclass(frozen=True, slots=True)
class Produced:
    topic: str
    results: list[ProduceResult]  # one per message, in order; a failed one has an error_code

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.error_code)


#: A cached "allowed" verdict is trusted this long at most, even with no change notice: the
#: safety net for a notice connection that died without anyone noticing (store/changes.py).
VERDICT_TTL_S = 5.0
#: Cached verdicts per process; the cache starts over when full.
VERDICT_MAX = 10_000


class ProduceGate:
    """May this caller produce to this topic? ``produce_check.lua`` decides (one Redis call);
    allowed verdicts are cached per process, keyed by the key's id *and digest*, the producer
    and the topic, and dropped whenever a key or producer write is announced
    (store/changes.py). The writer waits until every process has dropped them, so a revoked key
    or a changed registration still applies to the next request on every node. Measured
    (BENCHMARKS.md, issue 11): single-record produce with keys and the registry enforced went
    from about half of open mode's rate to within a few per cent of it.

    Refusals are not cached: they cost the call each time, as before (and a flood of bad keys
    cannot fill the cache)."""

    def __init__(self, store: OffsetStore, open_mode: bool,
                 internal: InternalTopics | None = None) -> None:
        self.store = store
        self.open_mode = open_mode
        #: The gateway's own topics (delay levels, retry topics), which only the gateway writes
        #: (a record produced there by hand would bypass the wheel's headers), and the broker's.
        self.internal = internal or InternalTopics()
        self.live = False  # change notices are arriving: the cache may be used
        self._generation = 0
        self._allowed: dict[tuple[str, str, str, str], float] = {}

    # -- fed by the change listener --------------------------------------------------------------
    def changed(self) -> None:
        self._generation += 1
        self._allowed.clear()

    def set_live(self, live: bool) -> None:
        self.live = live
        self.changed()  # what was cached before (or while deaf) is not trusted

    def listen(self, listener: str) -> Coroutine[Any, Any, None]:
        """The change listener to run for as long as the process serves (until cancelled)."""
        return self.store.registry.changes.listen(listener, self.changed, self.set_live)

    # -- the check ---------------------------------------------------------------------------------
    async def check(self, credential: Credential | None, producer: str, topic: str) -> None:
        """Refuse a produce the key or the producer registry does not allow (no Redis call when
        auth is off and the gateway is in open mode, or when an allowed verdict is cached)."""
        check_public_topic(topic, self.internal)
        if credential is None and self.open_mode and not producer:
            return
        key = (credential.key_id, credential.sha256, producer, topic) if credential else \
            ("", "", producer, topic)
        until = self._allowed.get(key)
        if until is not None and self.live and time.monotonic() < until:
            return
        generation = self._generation
        verdict, who = await self.store.produce_check(credential, self.open_mode, producer, topic)
        if verdict is ProduceVerdict.OK:
            # Only if no notice came while the script ran: its verdict may predate the change.
            if self.live and generation == self._generation:
                if len(self._allowed) >= VERDICT_MAX:
                    self._allowed.clear()
                self._allowed[key] = time.monotonic() + VERDICT_TTL_S
            return
        if verdict is ProduceVerdict.UNAUTHENTICATED:
            raise unauthenticated("invalid_api_key", "the API key is not valid")
        if verdict is ProduceVerdict.FORBIDDEN:
            raise denied("forbidden", f"this API key may not produce as {who!r}" if who
                         else "this API key is not bound to any producer")
        if verdict is ProduceVerdict.PRODUCER_REQUIRED:
            raise invalid("missing_producer", "name the producer: 'producer' in the body")
        if verdict is ProduceVerdict.UNREGISTERED_PRODUCER:
            raise denied("unregistered_producer", f"producer {who!r} is not registered "
                         f"(PUT /admin/producers/{who})")
        raise denied("topic_not_allowed", f"producer {who!r} is not registered for topic {topic!r}")


def misplaced(topic: str, queues: set[str], m: OutgoingMessage) -> ProduceResult | None:
    """The failure of a message that names a queue ``topic`` does not have (None: it fits)."""
    if m.queue is not None and m.queue not in queues:
        return ProduceResult(error_code=ProduceError.UNKNOWN_PARTITION,
                             error=f"topic {topic!r} has no partition {m.queue}")
    return None


def check_tags(broker: Broker, messages: list[OutgoingMessage]) -> None:
    """Tags are RocketMQ's: a broker without them refuses the request rather than drop them."""
    if Capability.TAG_FILTER not in broker.capabilities and any(m.tag for m in messages):
        raise invalid("tag_unsupported", f"the {broker.name} broker has no message tags; "
                      "send the record without 'tag' (or put it in a header)")


#: What a produce request may take beyond ``produce_timeout_ms`` (the broker's acknowledgement)
#: for the rest of its work (metadata, the delay wheel's topics): the whole request is bounded by
#: the sum. Before, a delayed produce during a broker outage answered 503 only after 143-216 s
#: (metadata waits, topic checks and sends one after another, each with its own timeout).
PRODUCE_SLACK_S = 5.0

T = TypeVar("T")


async def within_produce_timeout(work: Awaitable[T], timeout_ms: int) -> T:
    """``work`` (a whole produce request), or :class:`BrokerUnavailable` once ``timeout_ms``
    plus :data:`PRODUCE_SLACK_S` have passed: a 503, which says retry. What was handed to the
    broker meanwhile may still be written, as with any produce answered 503."""
    bound = asyncio.timeout(timeout_ms / 1000 + PRODUCE_SLACK_S)
    try:
        async with bound:
            return await work
    except TimeoutError:
        if not bound.expired():
            raise
        raise BrokerUnavailable(f"the broker did not acknowledge the records within "
                                f"{timeout_ms / 1000 + PRODUCE_SLACK_S:g} s") from None


async def produce(broker: Broker, topic: str, messages: list[OutgoingMessage]) -> Produced:
    """Send after checking queues, so a message for a queue that does not exist fails alone
    and fast."""
    check_tags(broker, messages)
    queues = set(await broker.queues(topic))
    results: list[ProduceResult | None] = [misplaced(topic, queues, m) for m in messages]
    to_send = [i for i, r in enumerate(results) if r is None]
    sent = await broker.produce(topic, [messages[i] for i in to_send])
    for i, r in zip(to_send, sent, strict=True):
        results[i] = r
    return Produced(topic, [r for r in results if r is not None])
