"""Creating topics: the gateway's own (delay levels, retry topics, the registry's copy) and the
admin API's. Both wait until every partition answers ListOffsets, because Apache Kafka lists a
new topic's partitions before their leaders serve them, and a produce right after would fail.
"""

from __future__ import annotations

import asyncio
import logging
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from ..base import BrokerUnavailable, TopicExists, TopicRefused, UnknownTopic
from .clients import Clients
from .errors import CREATE_REFUSALS, error_of
from .metadata import Metadata

#: A topic that keeps the last record of each key and deletes nothing else (the registry's copy).
COMPACTED = {"cleanup.policy": "compact", "retention.ms": "-1"}
#: How often a new topic is asked whether it is served yet.
_SERVED_POLL_S = 0.1

log = logging.getLogger("mqgw.kafka")


class TopicMaker:
    """Topic creation through the process's admin client."""

    def __init__(self, clients: Clients, metadata: Metadata, replication: int) -> None:
        self._clients = clients
        self._metadata = metadata
        #: Replication factor of the topics the gateway creates (-1: the broker's default).
        self._replication = replication

    async def ensure(self, topics: dict[str, int], timeout_s: float, compacted: bool) -> None:
        """CreateTopics with the gateway's replication factor (by default -1, the broker's
        default, KIP-464) for those missing, then wait until ListOffsets answers for every
        partition of them (see devstack.create_topic)."""
        missing: dict[str, int] = {}
        for topic, n in topics.items():
            try:
                await self._metadata.partitions(topic, fresh=True)
            except UnknownTopic:
                missing[topic] = n
        if missing:
            def create() -> None:
                futures = self._clients.admin.create_topics(
                    [NewTopic(t, n, self._replication, config=COMPACTED if compacted else {})
                     for t, n in missing.items()],
                    request_timeout=timeout_s)
                for f in futures.values():
                    try:
                        f.result(timeout_s)
                    except KafkaException as e:
                        err = error_of(e)
                        if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                            raise BrokerUnavailable(f"creating topics: {e}") from None
            await self._clients.run(create)
        deadline = time.monotonic() + timeout_s
        for topic in missing:
            while True:
                try:
                    await self._metadata.watermarks(topic)
                    break
                except (UnknownTopic, BrokerUnavailable):
                    if time.monotonic() > deadline:
                        raise BrokerUnavailable(f"topic {topic} is not served yet") from None
                    await asyncio.sleep(_SERVED_POLL_S)

    async def create(self, name: str, queues: int, replication: int | None,
                     timeout_s: float) -> None:
        """CreateTopics (replication None: -1, the broker's ``default.replication.factor``,
        KIP-464), then wait until every partition answers ListOffsets, as :meth:`ensure` does."""
        def create() -> None:
            new = NewTopic(name, queues, -1 if replication is None else replication)
            future = self._clients.admin.create_topics([new], request_timeout=timeout_s)[name]
            try:
                future.result(timeout_s)
            except KafkaException as e:
                err = error_of(e)
                code = err.code() if err is not None else None
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    raise TopicExists(name) from None
                refused = CREATE_REFUSALS.get(code) if code is not None else None
                if err is not None and refused is not None:
                    raise TopicRefused(refused, err.str()) from None
                raise BrokerUnavailable(f"creating topic {name}: {e}") from None
        try:
            await self._clients.run(create)
        except BrokerUnavailable as e:
            # A CreateTopics that timed out may have been applied all the same (the controller
            # took it; the answer was lost or late): look before saying it did not happen. It
            # was a 503, and the client's retry got 409 topic_exists for a write that happened.
            self._metadata.forget(name)
            try:
                await self._metadata.partitions(name, fresh=True)
            except (UnknownTopic, BrokerUnavailable):
                raise BrokerUnavailable(f"{e}; the broker does not list topic {name} now (a "
                                        "creation it received late may still make it)") from None
            log.warning("creating topic %s failed (%s) but the topic exists: created", name, e)
        self._metadata.forget(name)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                served = await self._metadata.all_watermarks(
                    [TopicPartition(name, p) for p in await self._metadata.partitions(name, fresh=True)])
                if len(served) >= queues:
                    return
            except (UnknownTopic, BrokerUnavailable):
                pass
            if time.monotonic() > deadline:
                # Created: that is the answer (the caller describes what is served so far). It
                # was a 503, and a client that retried got 409 topic_exists for a write that
                # had happened.
                log.warning("topic %s was created but not every partition serves yet", name)
                return
            await asyncio.sleep(_SERVED_POLL_S)
