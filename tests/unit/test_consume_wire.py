"""The consume answers as JSON (api/consume_wire.py), rendered from real fetches: field names,
encodings, the ack and unlock bodies and their error codes, and the ``failed`` parameter."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.api.consume_wire import (
    ack_body,
    extend_body,
    fetched_body,
    parse_delay_ms,
    parse_failed,
    unlock_body,
    with_ack_error,
)
from gateway.broker import Record
from gateway.broker.memory import MemoryBroker
from gateway.core.errors import Invalid
from gateway.store import (
    AckOutcome,
    AckResult,
    ExtendOutcome,
    ExtendResult,
    LockState,
    UnlockOutcome,
    UnlockResult,
)

from .conftest import Clock, Gateway

pytestmark = pytest.mark.anyio

T = "orders"


@pytest.fixture(autouse=True)
def records(broker: MemoryBroker) -> None:
    broker.create(T, 1)
    broker.append(T, "0", "text", timestamp=7)
    broker.logs[T]["0"][1] = Record(1, b"\xff", b"\xfe\x00", [("h", b"\x80")], 5)
    broker.end[(T, "0")] = 2


async def test_a_batch_as_json(gw: Gateway) -> None:
    got = await gw.fetch("c1")
    body = orjson.loads(orjson.dumps(fetched_body(got, "memory", "utf8")))  # as the client reads it
    assert set(body) == {"status", "requestId", "broker", "topic", "queue", "offset", "nextOffset",
                         "backlog", "redelivered", "lockTimeoutMs", "messages"}
    assert (body["status"], body["broker"], body["topic"], body["queue"]) == ("ok", "memory", T, "0")
    assert (body["offset"], body["nextOffset"], body["backlog"]) == (0, 2, 2)
    assert body["redelivered"] is False and body["lockTimeoutMs"] == 1000
    text, raw = body["messages"]
    assert text == {"offset": 0, "timestamp": 7, "key": None, "value": "text", "headers": [],
                    "encoding": "utf8", "attempt": 1}
    # not UTF-8: that record (only) comes back as base64
    assert (raw["encoding"], raw["value"], raw["key"], raw["headers"]) == \
        ("base64", "/gA=", "/w==", [["h", "gA=="]])
    assert all(m["encoding"] == "base64" for m in fetched_body(got, "memory", "base64")["messages"])
    assert fetched_body(got, "memory", "base64")["messages"][0]["value"] == "dGV4dA=="


async def test_a_batch_answered_after_its_lock_ran_out_is_flagged(
        gw: Gateway, broker: MemoryBroker, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 (the duplicate audit, once in CI on RocketMQ): a node stalled between choose and
    its answer (SIGSTOP, a GC pause, a slow broker read) answered its batch unflagged after
    another fetch had taken the expired lock and handed the same records out flagged, so the
    client saw the second copy unflagged. The flag is decided when the answer is written: a
    batch whose lock has run out (or has under a tenth of it left) is flagged."""
    import gateway.api.consume_wire as wire

    clock.freeze()
    monkeypatch.setattr(wire, "now_ms", clock.now_ms)
    real_fetch = broker.fetch
    stalled, resume = asyncio.Event(), asyncio.Event()

    async def stalling_fetch(*a: Any) -> Any:
        if not stalled.is_set():  # the first read only
            stalled.set()
            await resume.wait()
        return await real_fetch(*a)

    monkeypatch.setattr(broker, "fetch", stalling_fetch)
    slow = asyncio.create_task(gw.fetch("c1"))
    await stalled.wait()  # locked, reading
    clock.advance(1_500)  # past the 1 s lock: another fetch takes the queue over
    taken = await gw.fetch("c1")
    assert taken.batch and taken.batch.redelivered
    assert fetched_body(taken, "memory", "utf8")["redelivered"] is True
    resume.set()
    late = await slow  # the stalled node answers now: the same records, second
    assert late.batch and [r.offset for r in late.batch.records] == [0, 1]
    assert late.batch.redelivered is False  # what choose said when it locked
    assert fetched_body(late, "memory", "utf8")["redelivered"] is True  # what the answer says
    # a batch answered in time is not flagged; with under a tenth of its lock left, it is
    fresh = await gw.fetch("c2")
    assert fetched_body(fresh, "memory", "utf8")["redelivered"] is False
    clock.advance(899)
    assert fetched_body(fresh, "memory", "utf8")["redelivered"] is False
    clock.advance(1)
    assert fetched_body(fresh, "memory", "utf8")["redelivered"] is True


async def test_empty_paused_and_rate_limited_answers(gw: Gateway, broker: MemoryBroker) -> None:
    first = await gw.fetch("c1")
    assert first.batch is not None
    acked = await gw.fetch("c1", ack_request_id=first.batch.request_id)
    assert fetched_body(acked, "memory", "utf8") == {
        "status": "empty", "topic": T, "messages": [],
        "ack": {"result": "committed", "committedOffset": 2, "message": "offsets committed",
                "lock": "held"}}
    await gw.registry.set_paused("c1", True)
    assert fetched_body(await gw.fetch("c1"), "memory", "utf8") == \
        {"status": "paused", "topic": T, "messages": []}
    await gw.registry.set_paused("c1", False)
    await gw.registry.patch_consumer("c2", {"rate": "1", "burst": "1"})
    assert (await gw.fetch("c2", max_messages=1)).batch is not None
    limited = fetched_body(await gw.fetch("c2"), "memory", "utf8")
    assert limited["status"] == "rate_limited" and 0 < limited["retryAfterMs"] <= 1000


async def test_a_skip_is_reported(gw: Gateway, broker: MemoryBroker) -> None:
    first = await gw.fetch("c1", max_messages=1)
    assert first.batch is not None
    await gw.consume.ack(first.batch.request_id)
    broker.append(T, "0", "c")
    broker.delete_before(T, "0", 2)  # retention took offset 1
    body = fetched_body(await gw.fetch("c1"), "memory", "utf8")
    assert body["skipped"] == {"from": 1, "to": 2, "reason": "out_of_retention"}
    assert body["offset"] == 1 and [m["value"] for m in body["messages"]] == ["c"]


def test_ack_and_unlock_bodies_with_their_error_codes() -> None:
    ok = AckResult(AckOutcome.COMMITTED, 5, LockState.EXPIRED)
    assert with_ack_error(ok, ack_body(ok)) == {"result": "committed", "committedOffset": 5,
                                                "message": "offsets committed", "lock": "expired"}
    for outcome, code in ((AckOutcome.LOCK_LOST, "lock_lost"), (AckOutcome.UNKNOWN, "unknown_queue"),
                          (AckOutcome.OFFSET_RESET, "offset_reset")):
        r = AckResult(outcome, 3, LockState.NONE)
        body = with_ack_error(r, ack_body(r))
        assert body["error"]["code"] == code and "lock" not in body and body["committedOffset"] == 3
    again = AckResult(AckOutcome.ALREADY_COMMITTED, 5, LockState.NONE)
    assert "error" not in with_ack_error(again, ack_body(again))
    assert unlock_body(UnlockResult(UnlockOutcome.UNLOCKED, 4)) == \
        {"result": "unlocked", "committedOffset": 4}
    assert unlock_body(UnlockResult(UnlockOutcome.LOCK_LOST, 4))["error"]["code"] == "lock_lost"


def test_extend_bodies_with_their_error_codes() -> None:
    assert extend_body(ExtendResult(ExtendOutcome.EXTENDED, 4, 30_000)) == \
        {"result": "extended", "committedOffset": 4, "lockTimeoutMs": 30_000}
    for outcome in ExtendOutcome:
        if outcome in (ExtendOutcome.EXTENDED, ExtendOutcome.UNAUTHORIZED):
            continue
        body = extend_body(ExtendResult(outcome, 4, 0))
        code = "unknown_queue" if outcome is ExtendOutcome.UNKNOWN else outcome.value
        assert body["error"]["code"] == code and body["error"]["message"]
        assert "lockTimeoutMs" not in body and body["result"] == outcome.value


@pytest.mark.parametrize("v,want", [
    (None, None), ([], {}), ([3, 4], {3: None, 4: None}),
    ([{"offset": 2, "delayMs": 600}, 5], {2: 600, 5: None}), ([{"offset": 1.0}], {1: None}),
])
def test_failed_offsets(v: Any, want: Any) -> None:
    assert parse_failed(v) == want


@pytest.mark.parametrize("v", ["all", [-1], ["3"], [{"offset": 0, "why": 1}], [{"delayMs": 5}],
                               [{"offset": 0, "delayMs": -1}], [1.5], [True]])
def test_bad_failed_offsets(v: Any) -> None:
    with pytest.raises(Invalid) as e:
        parse_failed(v)
    assert e.value.code in ("invalid_failed", "invalid_delay")


def test_retry_delays() -> None:
    assert parse_delay_ms(None) is None and parse_delay_ms(0) == 0 and parse_delay_ms(5.0) == 5
    for bad in (-1, "soon", 1.5, 10 ** 20, True):
        with pytest.raises(Invalid) as e:
            parse_delay_ms(bad)
        assert e.value.code == "invalid_delay"


def test_a_fetch_names_one_topic_or_several() -> None:
    from gateway.api.consume_wire import MAX_FETCH_TOPICS, fetch_topics
    from gateway.core.errors import DomainError
    from gateway.core.names import InternalTopics
    assert fetch_topics("a", InternalTopics()) == ("a",)
    assert fetch_topics("a,b", InternalTopics()) == ("a", "b")
    for bad in ("a,", "a,a", ["a", "b"], ",".join(f"t{i}" for i in range(MAX_FETCH_TOPICS + 1)),
                "a,_mqgw.retry.x"):
        with pytest.raises(DomainError):
            fetch_topics(bad, InternalTopics(("_mqgw",)))
