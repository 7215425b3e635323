"""librdkafka's errors in the broker port's terms (gateway/broker/kafka/errors.py), and which
produce errors are permanent (gateway/broker/base.py): the relay drops a record whose error is
permanent and retries the rest, so a wrong row here either loses records or retries forever."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka import KafkaError

from gateway.broker import ProduceError
from gateway.broker.kafka.errors import is_coordinator_moving, is_leader_change, is_unknown, produce_error


@pytest.mark.parametrize("code,expected", [
    (KafkaError._UNKNOWN_PARTITION, ProduceError.UNKNOWN_PARTITION),
    (KafkaError._UNKNOWN_TOPIC, ProduceError.UNKNOWN_TOPIC),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, ProduceError.UNKNOWN_TOPIC),
    (KafkaError.MSG_SIZE_TOO_LARGE, ProduceError.MESSAGE_TOO_LARGE),
    (KafkaError._MSG_TIMED_OUT, ProduceError.BROKER_TIMEOUT),
    (KafkaError.NOT_LEADER_FOR_PARTITION, ProduceError.BROKER_ERROR),
    (KafkaError._TRANSPORT, ProduceError.BROKER_ERROR),
])
def test_a_failed_write_is_named_in_the_ports_terms(code: int, expected: ProduceError) -> None:
    assert produce_error(KafkaError(code)) is expected


def test_only_what_a_retry_cannot_cure_is_permanent() -> None:
    assert {e for e in ProduceError if e.permanent} == {
        ProduceError.UNKNOWN_TOPIC, ProduceError.UNKNOWN_PARTITION, ProduceError.MESSAGE_TOO_LARGE,
        ProduceError.INVALID_RECORD, ProduceError.INVALID_DELAY}


def test_produce_errors_go_on_the_wire_as_their_codes() -> None:
    assert orjson.dumps({"error": ProduceError.BROKER_TIMEOUT}) == b'{"error":"broker_timeout"}'
    assert f"{ProduceError.UNKNOWN_TOPIC}" == "unknown_topic"


def test_unknown_leader_and_coordinator_codes() -> None:
    assert is_unknown(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)) and not is_unknown(None)
    assert not is_unknown(KafkaError(KafkaError._TRANSPORT))
    assert is_leader_change(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
    assert not is_leader_change(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert is_coordinator_moving(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    assert not is_coordinator_moving(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
