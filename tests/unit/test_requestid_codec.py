"""requestIds are signed: any change to any byte, or another key, is rejected."""

import base64
from collections.abc import Callable

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


def _stray_bits(text: str) -> str | None:
    """``text`` with an unused low bit of its last character set (the same bytes to a lenient
    decoder), or None when its length leaves no bit unused."""
    unused = {2: 4, 3: 2}.get(len(text) % 4)
    if unused is None:
        return None
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return text[:-1] + alphabet[alphabet.index(text[-1]) ^ 1]


def test_one_spelling_per_token() -> None:
    """requestIds and delay ids share one rule (gateway/core/b64url.py): ``=`` padding or stray
    bits give another string for the same bytes, and are refused. Before, a delay id with ``=``
    or ``==`` appended still cancelled its record."""
    from gateway.core.delay import DelayIds

    codec, ids = RequestIdCodec("k"), DelayIds("k")
    tokens: list[tuple[str, Callable[[str], object], str]] = []
    for topic in ("t", "to", "top", "orders"):  # lengths with and without unused bits
        tokens.append((codec.encode(BatchRef("kafka", "g", "", topic, "0", 0, 1, 1)), codec.decode,
                       "invalid_request_id"))
        tokens.append((ids.new(1_800_000_000_000, topic), ids.parse, "invalid_delay_id"))
    strays = 0
    for token, parse, code in tokens:
        parse(token)  # the one spelling is fine
        variants = [token + "=", token + "==", token + "===", token + "%3D%3D"]
        if "." in token:  # a delay id: padding on its first part too
            body, mac = token.split(".")
            variants += [f"{body}=.{mac}", f"{body}==.{mac}"]
            if (b := _stray_bits(body)) is not None:
                variants.append(f"{b}.{mac}")
            if (m := _stray_bits(mac)) is not None:
                variants.append(f"{body}.{m}")
        elif (s := _stray_bits(token)) is not None:
            variants.append(s)
        strays += len(variants) > 4 + ("." in token) * 2
        for v in variants:
            with pytest.raises(DomainError) as e:
                parse(v)
            assert isinstance(e.value, Invalid) and e.value.code == code, v
    assert strays  # the stray-bit case was exercised
