"""Names that end up in Redis keys and broker requests (core/names.py) and the one spelling of
signed tokens (core/b64url.py)."""

from __future__ import annotations

import pytest

from gateway.config import Settings
from gateway.core import b64url
from gateway.core.errors import Forbidden, Invalid
from gateway.core.names import (
    check_name,
    check_public_topic,
    check_topic,
    internal_topic_prefixes,
    is_internal_topic,
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
    prefixes = internal_topic_prefixes(Settings())
    assert is_internal_topic("mqgw.delay.100ms", prefixes)
    assert is_internal_topic("mqgw.retry.g.t.0123456789", prefixes)
    assert is_internal_topic("__consumer_offsets", prefixes)
    assert not is_internal_topic("orders", prefixes)
    with pytest.raises(Forbidden) as f:
        check_public_topic("mqgw.registry", prefixes)
    assert f.value.code == "internal_topic"


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
