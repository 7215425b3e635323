"""requestIds are signed: any change to any byte, or another key, is rejected."""

import base64

import pytest

from gateway.core.errors import DomainError, Invalid
from gateway.core.requestid import BatchRef, RequestIdCodec

REF = BatchRef("kafka", "orders", "", "payments", "3", 100, 132, 7)


def test_round_trip() -> None:
    c = RequestIdCodec("k")
    assert c.decode(c.encode(REF)) == REF
    bc = BatchRef("kafka", "g", "client-1", "t", "0", 0, 1, 1)
    assert c.decode(c.encode(bc)) == bc


def test_every_altered_byte_is_rejected() -> None:
    c = RequestIdCodec("k")
    raw = bytearray(base64.urlsafe_b64decode(c.encode(REF) + "=="))
    for i in range(len(raw)):
        forged = bytearray(raw)
        forged[i] ^= 0x01
        text = base64.urlsafe_b64encode(bytes(forged)).rstrip(b"=").decode()
        with pytest.raises(DomainError) as e:
            c.decode(text)
        assert isinstance(e.value, Invalid) and e.value.code == "invalid_request_id"  # 400


def test_other_key_and_garbage_rejected() -> None:
    with pytest.raises(DomainError):
        RequestIdCodec("other").decode(RequestIdCodec("k").encode(REF))
    for junk in ["", "x", "!!!!", "a" * 5000, "AAAA"]:
        with pytest.raises(DomainError):
            RequestIdCodec("k").decode(junk)
