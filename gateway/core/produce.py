"""Produce: check the caller against the key and the producer registry, then send.

The wire format (JSON, UTF-8 or base64 payloads) is the HTTP layer's; this module takes
broker messages and returns each one's typed result.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..broker import Broker, OutgoingMessage, ProduceResult
from ..store import Credential, OffsetStore
from .errors import bad_request, forbidden, unauthorized


@dataclass(frozen=True, slots=True)
class Produced:
    topic: str
    results: list[ProduceResult]  # one per message, in order; a failed one has an error_code

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.error_code)


async def check_producer(store: OffsetStore, credential: Credential | None, open_mode: bool,
                         producer: str, topic: str) -> None:
    """Refuse a produce the key or the producer registry does not allow (one Redis call; none
    at all when auth is off and the gateway is in open mode)."""
    if credential is None and open_mode and not producer:
        return
    verdict, who = await store.produce_check(credential, open_mode, producer, topic)
    if verdict == "ok":
        return
    if verdict == "unauthenticated":
        raise unauthorized("invalid_api_key", "the API key is not valid")
    if verdict == "forbidden":
        raise forbidden("forbidden", f"this API key may not produce as {who!r}" if who
                        else "this API key is not bound to any producer")
    if verdict == "producer_required":
        raise bad_request("missing_producer", "name the producer: 'producer' in the body")
    if verdict == "unregistered_producer":
        raise forbidden("unregistered_producer", f"producer {who!r} is not registered "
                        f"(PUT /admin/producers/{who})")
    raise forbidden("topic_not_allowed", f"producer {who!r} is not registered for topic {topic!r}")


async def produce(broker: Broker, topic: str, messages: list[OutgoingMessage]) -> Produced:
    """Send after checking queues, so a message for a queue that does not exist fails alone
    and fast."""
    queues = set(await broker.queues(topic))
    results: list[ProduceResult | None] = [None] * len(messages)
    to_send: list[int] = []
    for i, m in enumerate(messages):
        if m.queue is not None and m.queue not in queues:
            results[i] = ProduceResult(error_code="unknown_partition",
                                       error=f"topic {topic!r} has no partition {m.queue}")
        else:
            to_send.append(i)
    sent = await broker.produce(topic, [messages[i] for i in to_send])
    for i, r in zip(to_send, sent, strict=True):
        results[i] = r
    return Produced(topic, [r for r in results if r is not None])
