"""requestIds at the consume service (core/requestid.py through core/consume.py): an altered,
foreign or misplaced requestId is refused before any script runs, and commits nothing. The
codec byte by byte: tests/unit/test_requestid_codec.py."""

from __future__ import annotations

import base64

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.core.errors import Invalid
from gateway.core.requestid import RequestIdCodec

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"


@pytest.fixture(autouse=True)
def records(broker: MemoryBroker) -> None:
    broker.create(T, 1)
    broker.create("other", 1)
    broker.append(T, "0", "a", "b")


async def fetched(gw: Gateway) -> str:
    got = await gw.fetch(C, max_messages=1)
    assert got.batch is not None
    return got.batch.request_id


def flip(request_id: str, at: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(request_id + "=" * (-len(request_id) % 4)))
    raw[at] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@pytest.mark.parametrize("at", [3, 20, -1])  # a field, an offset digit, the signature
async def test_an_altered_request_id_is_refused_everywhere_and_commits_nothing(
        gw: Gateway, at: int) -> None:
    rid = await fetched(gw)
    forged = flip(rid, at)
    for call in (gw.consume.ack, gw.consume.unlock):
        with pytest.raises(Invalid) as e:
            await call(forged)
        assert e.value.code == "invalid_request_id"
    with pytest.raises(Invalid):
        await gw.fetch(C, ack_request_id=forged)
    state, = await gw.store.queue_states(C)
    assert state.committed == 0 and state.lock_ms > 0  # still held, nothing committed


async def test_a_request_id_signed_with_another_key_is_refused(gw: Gateway) -> None:
    ref = gw.consume.decode(await fetched(gw))
    foreign = RequestIdCodec("another-gateways-key").encode(ref)
    with pytest.raises(Invalid) as e:
        await gw.consume.ack(foreign)
    assert e.value.code == "invalid_request_id" and "signature" in str(e.value)


async def test_a_piggy_backed_ack_must_name_this_consumer_client_and_topic(gw: Gateway) -> None:
    rid = await fetched(gw)
    for kw in (dict(consumer="c2"), dict(client_id="x"), dict(topic="other")):
        consumer = kw.pop("consumer", C)
        with pytest.raises(Invalid) as e:
            await gw.fetch(consumer, ack_request_id=rid, **kw)
        assert e.value.code == "request_id_mismatch"
    got = await gw.fetch(C, ack_request_id=rid)
    assert got.ack is not None and got.ack.result == "committed" and got.batch is not None
