"""Names that end up in Redis keys and broker requests (core/names.py) and the one spelling of
signed tokens (core/b64url.py)."""

from __future__ import annotations

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core import b64url
from gateway.core.errors import Forbidden, Invalid
from gateway.core.names import (
    InternalTopics,
    check_name,
    check_public_topic,
    check_topic,
)


@pytest.mark.parametrize("name", ["a", "orders-svc", "A.b_c-9", "x" * 200])
def test_good_names(name: str) -> None:
    assert check_name(name, "consumer") == name


@pytest.mark.parametrize("value,code", [
    (None, "missing_consumer"), ("", "missing_consumer"), ("a:b", "invalid_consumer"),
    ("{g}", "invalid_consumer"), (".", "invalid_consumer"), ("..", "invalid_consumer"),
    ("x" * 201, "invalid_consumer"), ("é", "invalid_consumer"), (5, "invalid_consumer"),
    ("_mqgw.relay", "reserved_consumer"),
])
def test_bad_consumer_names(value: object, code: str) -> None:
    with pytest.raises(Invalid) as e:
        check_name(value, "consumer")
    assert e.value.code == code


def test_client_ids_are_optional_and_internal_names_readable_where_allowed() -> None:
    assert check_name(None, "clientId", required=False) == ""
    with pytest.raises(Invalid) as e:
        check_name("a b", "clientId")
    assert e.value.code == "invalid_client_id"
    assert check_name("_mqgw.relay", "consumer", internal_ok=True) == "_mqgw.relay"


def test_topics() -> None:
    assert check_topic("t" * 249) == "t" * 249
    for bad, code in ((None, "missing_topic"), ("t" * 250, "invalid_topic"), ("..", "invalid_topic"),
                      ("a/b", "invalid_topic")):
        with pytest.raises(Invalid) as e:
            check_topic(bad)
        assert e.value.code == code
    internal = InternalTopics.of(Settings(), MemoryBroker().owns_topic)
    assert "mqgw.delay.100ms" in internal
    assert "mqgw.retry.g.t.0123456789" in internal
    assert "__consumer_offsets" in internal  # the broker's (the memory broker keeps '__')
    assert "orders" not in internal and "mqgw" not in internal
    # names that would collide with the gateway's own (issue 33): '.' and '_' one, any case
    for collides in ("mqgw_delay_l0", "MQGW.delay.l0", "Mqgw_Retry.g", "mqgw_registry"):
        assert collides in internal, collides
    with pytest.raises(Forbidden) as f:
        check_public_topic("mqgw.registry", internal)
    assert f.value.code == "internal_topic"


def test_each_broker_names_its_own_topics() -> None:
    """Issue 33: on RocketMQ the timer log (every pending timer record of every topic) and the
    other system topics were open to /produce and /message; core/names.py knew only Kafka's
    '__'. Each adapter says which are its own."""
    from gateway.broker.kafka.metadata import is_own_topic
    from gateway.broker.rocketmq.topics import is_system_topic

    for t in ("__consumer_offsets", "__transaction_state", "_.consumer_offsets", "._x"):
        assert is_own_topic(t), t
    assert not is_own_topic("orders") and not is_own_topic("_orders")
    own = {"broker-a", "DefaultCluster"}
    for t in ("rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
              "RMQ_SYS_TRANS_OP_HALF_TOPIC", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC",
              "rmq_sys_REVIVE_LOG_DefaultCluster", "BenchmarkTest", "TBW102", "broker-a",
              "DefaultCluster", "DefaultCluster_REPLY_TOPIC"):
        assert is_system_topic(t, own), t
    for t in ("orders", "broker-b", "a.b", "Benchmark"):
        assert not is_system_topic(t, own), t


def test_b64url_takes_only_what_it_makes() -> None:
    for raw in (b"", b"\x00", b"ab", b"abc", bytes(range(256))):
        text = b64url.encode(raw)
        assert "=" not in text and (not raw or b64url.decode(text, 1000) == raw)
    good = b64url.encode(b"ab")  # "YWI": 3 characters, the last 2 bits unused
    stray = good[:-1] + "J"  # the same bytes to a lenient decoder (an unused bit set)
    assert stray != good
    for bad in (good + "=", good + "==", stray, "a+b/", "", "abcde", good * 100):
        with pytest.raises(ValueError):
            b64url.decode(bad, 16)
