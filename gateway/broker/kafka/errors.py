"""librdkafka's error codes in the broker port's terms.

Which codes mean that a topic or partition does not exist, that a leader or a group coordinator
is moving (so that a moment cures them), that a topic creation is refused for good, and which
:class:`~gateway.broker.base.ProduceError` a failed write is. Written once here, so that the
metadata, group, produce and fetch modules agree on them.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from ..base import ProduceError

#: The topic or the partition does not exist (the port's UnknownTopic).
UNKNOWN_CODES = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                 KafkaError._UNKNOWN_PARTITION}
#: ListOffsets failed because a partition's leader is moving (a broker restarted, a topic was
#: just created): fresh metadata and a moment cure it.
LEADER_CHANGE = {KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
                 KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH,
                 KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.REQUEST_TIMED_OUT,
                 KafkaError._TRANSPORT, KafkaError._TIMED_OUT}
#: A group's coordinator is being elected or loaded (a new cluster creates __consumer_offsets,
#: 50 partitions, on the first group request).
COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                      KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT,
                      KafkaError.REQUEST_TIMED_OUT}
#: CreateTopics errors that a retry cannot cure: the request itself is refused (TopicRefused).
CREATE_REFUSALS = {
    KafkaError.TOPIC_EXCEPTION: "invalid_topic",  # InvalidTopicException, e.g. a collision
    KafkaError.INVALID_PARTITIONS: "invalid_partitions",
    KafkaError.INVALID_REPLICATION_FACTOR: "invalid_replication_factor",
    KafkaError.INVALID_REPLICA_ASSIGNMENT: "invalid_replication_factor",
    KafkaError.POLICY_VIOLATION: "policy_violation",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "not_authorized",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "not_authorized",
}


def error_of(e: KafkaException) -> KafkaError | None:
    """The KafkaError a KafkaException carries (None if it carries none)."""
    err = e.args[0] if e.args else None
    return err if isinstance(err, KafkaError) else None


def is_unknown(err: KafkaError | None) -> bool:
    """Whether the topic or the partition does not exist."""
    return err is not None and err.code() in UNKNOWN_CODES


def is_leader_change(err: KafkaError | None) -> bool:
    """Whether ListOffsets failed for a reason that a moment (and fresh metadata) cures."""
    return err is not None and (err.code() in LEADER_CHANGE or bool(err.retriable()))


def is_coordinator_moving(err: KafkaError | None) -> bool:
    """Whether a group request failed because its coordinator is moving: ask again soon."""
    return err is not None and err.code() in COORDINATOR_MOVING


def produce_error(err: KafkaError) -> ProduceError:
    """What a failed write of one record is in the port's terms."""
    code = err.code()
    if code == KafkaError._UNKNOWN_PARTITION:
        return ProduceError.UNKNOWN_PARTITION
    if code in UNKNOWN_CODES:
        return ProduceError.UNKNOWN_TOPIC
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return ProduceError.MESSAGE_TOO_LARGE
    if code == KafkaError._MSG_TIMED_OUT:
        return ProduceError.BROKER_TIMEOUT
    return ProduceError.BROKER_ERROR
