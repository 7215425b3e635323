"""Broker adapters behind one port (:mod:`.base`): ``kafka`` and the in-memory ``memory``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (
    QUEUE_ID,
    AlreadyWritten,
    Broker,
    BrokerUnavailable,
    CancelRefused,
    Capability,
    FetchResult,
    OutgoingMessage,
    ProduceError,
    ProduceResult,
    QueueInfo,
    Record,
    Skipped,
    SkipReason,
    TopicExists,
    TopicInfo,
    TopicRefused,
    UnknownTopic,
    check_queue_id,
    fitting,
    payload_bytes,
)

if TYPE_CHECKING:
    from ..config import Settings

__all__ = [
    "QUEUE_ID",
    "AlreadyWritten",
    "Broker",
    "BrokerUnavailable",
    "CancelRefused",
    "Capability",
    "FetchResult",
    "OutgoingMessage",
    "ProduceError",
    "ProduceResult",
    "QueueInfo",
    "Record",
    "SkipReason",
    "Skipped",
    "TopicExists",
    "TopicInfo",
    "TopicRefused",
    "UnknownTopic",
    "check_queue_id",
    "create",
    "fitting",
    "payload_bytes",
]

#: Broker names accepted by the ``broker`` setting.
KINDS = ("kafka", "rocketmq", "memory")


def create(settings: Settings) -> Broker:
    """The adapter the settings name. Each adapter is imported only when chosen."""
    if settings.broker == "kafka":
        from .kafka import KafkaBroker

        return KafkaBroker(settings.kafka_bootstrap, extra=settings.kafka_extra(),
                           pool_size=settings.fetch_pool_size, max_batch=settings.max_messages,
                           produce_timeout_ms=settings.produce_timeout_ms,
                           produce_linger_ms=settings.produce_linger_ms,
                           gap_recheck_ms=settings.gap_recheck_ms,
                           replication=settings.delay_replication)
    if settings.broker == "rocketmq":
        from .rocketmq import RocketMQBroker

        return RocketMQBroker(settings.rocketmq_namesrv, reader_group=settings.rocketmq_reader_group,
                              producer_group=settings.rocketmq_producer_group,
                              timeout_ms=settings.rocketmq_timeout_ms,
                              native_delay=settings.rocketmq_native_delay)
    if settings.broker == "memory":
        from .memory import MemoryBroker

        return MemoryBroker(topics=settings.memory_topic_map())
    raise ValueError(f"unknown broker {settings.broker!r}: one of {', '.join(KINDS)}")
