"""Retry policies and failed records (core/retry.py, core/nack.py, core/deadletters.py): the
schedule, the retry topic served beside the topic, the headers a retry carries, dead letters
after the last attempt, nacks that write nothing, and redrive."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.core.deadletters import DeadLetters, RedriveTarget
from gateway.core.delay import DelayService
from gateway.core.errors import DomainError, Invalid
from gateway.core.nack import NackService
from gateway.core.retry import (
    H_ATTEMPT,
    H_CLIENT,
    H_CONSUMER,
    H_ORIGIN_OFFSET,
    H_ORIGIN_TOPIC,
    RetryPolicy,
    attempt_of,
    check_policy_fields,
    retry_topic,
)
from gateway.core.wheel import H_DUE

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"


class Retrying:
    """A gateway with the nack and dead-letter services beside its consume service."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.delay = DelayService(gw.settings, gw.store, gw.broker)
        self.nack = NackService(gw.settings, gw.store, gw.broker, gw.consume, self.delay)
        self.dead = DeadLetters(gw.settings, gw.store, gw.broker, gw.consume.wm)


@pytest.fixture
def rt(make_gateway: Any, broker: MemoryBroker) -> Retrying:
    broker.create(T, 1)
    broker.append(T, "0", *"abc", timestamp=1234)
    return Retrying(make_gateway(delay_levels="100ms,1s,10s", delay_topic_prefix="d.",
                                 retry_partitions=1))


def hdrs(r: Any) -> dict[str, str]:
    return {n: v.decode() for n, v in r.headers}


def test_policy_arithmetic_and_names() -> None:
    from gateway.config import Settings

    s = Settings()
    p = RetryPolicy.of("g", {"retry_delays_ms": "10000,30000"}, s)
    assert p.max_attempts == 3 and [p.delay_before(a) for a in (2, 3, 4)] == [10000, 30000, 30000]
    p = RetryPolicy.of("g", {"retry_initial_delay_ms": "100", "retry_multiplier": "3",
                             "retry_max_delay_ms": "2000", "retry_max_attempts": "10000"}, s)
    assert [p.delay_before(a) for a in (2, 3, 4, 5, 10_000)] == [100, 300, 900, 2000, 2000]
    assert RetryPolicy.of("g", {"retry_dead_letter_topic": "dl"}, s).dead_letter_topic == "dl"
    with pytest.raises(Invalid) as e:
        check_policy_fields({"retry_delays_ms": "5", "retry_multiplier": "2"})
    assert e.value.code == "conflicting_retry"
    assert retry_topic("p.", "a.b", "c") != retry_topic("p.", "a", "b.c")
    assert len(retry_topic("p.", "g" * 200, "t" * 249, "c" * 200)) == 249


async def test_failed_records_come_back_with_their_attempt_then_go_to_dead_letters(
        rt: Retrying, broker: MemoryBroker) -> None:
    gw = rt.gw
    await gw.registry.patch_consumer(C, {"retry_max_attempts": "3", "retry_delays_ms": "0"})
    retry = retry_topic(gw.settings.retry_topic_prefix, C, T)
    got = await gw.fetch(C)
    assert got.batch and [r.value for r in got.batch.records] == [b"a", b"b", b"c"]
    failed = await rt.nack.fail(got.batch.request_id, {1: None})  # b fails
    assert (failed.ack.result, failed.ack.committed) == ("committed", 3)
    assert [(x.offset, x.attempt) for x in failed.retried] == [(1, 2)] and failed.retry_topic == retry
    for attempt in (2, 3):
        again = await gw.fetch(C, wait_ms=2_000)
        assert again.batch and again.batch.topic == retry  # served beside the topic
        rec, = again.batch.records
        h = hdrs(rec)
        assert rec.value == b"b" and attempt_of(rec) == attempt == int(h[H_ATTEMPT])
        assert (h[H_ORIGIN_TOPIC], h[H_ORIGIN_OFFSET], h[H_CONSUMER]) == (T, "1", C)
        failed = await rt.nack.fail(again.batch.request_id, None)
        assert failed.ack.result == "committed"
        if attempt < 3:
            assert [x.attempt for x in failed.retried] == [3] and failed.dead == []
    assert failed.retried == [] and failed.dead == [rec.offset]  # the last attempt
    assert failed.dead_letter_topic == "mqgw.dead." + C
    dead, = [r for q in broker.logs["mqgw.dead." + C].values() for r in q.values()]
    assert dead.value == b"b" and hdrs(dead)[H_ATTEMPT] == "3"
    assert (await gw.fetch(C, wait_ms=50)).status == "empty"  # nothing else comes


async def test_a_delayed_retry_goes_through_the_wheel_on_schedule(rt: Retrying, broker: MemoryBroker) -> None:
    gw = rt.gw
    await gw.registry.patch_consumer(C, {"retry_delays_ms": "5000"})
    got = await gw.fetch(C, client_id="A")
    assert got.batch is not None
    sent = int(time.time() * 1000)
    failed = await rt.nack.fail(got.batch.request_id, {0: None, 2: 20_000})
    by = {x.offset: x for x in failed.retried}
    assert set(by) == {0, 2} and by[0].deliver_at >= sent + 5_000 and by[2].deliver_at >= sent + 20_000
    level_1s = [hdrs(r) for q in broker.logs["d.1000ms"].values() for r in q.values()]
    level_10s = [hdrs(r) for q in broker.logs["d.10000ms"].values() for r in q.values()]
    assert [int(h[H_DUE]) for h in level_1s] == [by[0].deliver_at]
    assert [int(h[H_DUE]) for h in level_10s] == [by[2].deliver_at]
    assert {h[H_CLIENT] for h in level_1s + level_10s} == {"A"}  # the clientId's own retries
    assert failed.retry_topic == retry_topic(gw.settings.retry_topic_prefix, C, T, "A")


async def test_nacks_that_may_not_commit_write_nothing(rt: Retrying, broker: MemoryBroker) -> None:
    gw = rt.gw
    got = await gw.fetch(C)
    assert got.batch is not None
    with pytest.raises(DomainError) as e:
        await rt.nack.fail(got.batch.request_id, {got.batch.next_offset: None})
    assert e.value.code == "invalid_failed"
    assert (await gw.consume.ack(got.batch.request_id)).result == "committed"
    after = await rt.nack.fail(got.batch.request_id, None)  # after the ack: nothing to fail
    assert after.ack.result == "already_committed" and after.retried == [] and after.dead == []
    assert set(broker.logs) == {T}  # no retry, level or dead-letter topic was written or made


async def test_dead_letters_are_listed_and_redriven_once(rt: Retrying, broker: MemoryBroker) -> None:
    gw = rt.gw
    await gw.registry.patch_consumer(C, {"retry_max_attempts": "1"})
    got = await gw.fetch(C)
    assert got.batch is not None
    assert len((await rt.nack.fail(got.batch.request_id, None)).dead) == 3
    page = await rt.dead.page(C, limit=2)
    assert page.exists and page.count == 3 and [r.value for _, r in page.records] == [b"a", b"b"]
    assert await rt.dead.redrive(C, RedriveTarget.CONSUMER, limit=1) == 1
    assert (await rt.dead.page(C, limit=10)).count == 2
    assert await rt.dead.redrive(C, RedriveTarget.CONSUMER) == 2
    assert await rt.dead.redrive(C, RedriveTarget.CONSUMER) == 0  # nothing twice
    back = await gw.fetch(C, wait_ms=2_000)
    assert back.batch and [r.value for r in back.batch.records] == [b"a", b"b", b"c"]
    assert {attempt_of(r) for r in back.batch.records} == {1}


async def test_dead_letters_redriven_to_the_topic_reach_every_reader_as_new(
        rt: Retrying, broker: MemoryBroker) -> None:
    gw = rt.gw
    await gw.registry.patch_consumer(C, {"retry_max_attempts": "1"})
    got = await gw.fetch(C, client_id="A")
    assert got.batch is not None
    assert len((await rt.nack.fail(got.batch.request_id, {1: None})).dead) == 1
    assert await rt.dead.redrive(C, RedriveTarget.TOPIC) == 1
    back, = [r for q in broker.logs[T].values() for r in q.values() if r.offset == 3]
    assert back.value == b"b" and not any(n.startswith("mqgw-") for n, _ in back.headers)
    for client in ("A", "B"):  # B never failed it, and sees it too: a new record of the topic
        seen = []
        while (nxt := await gw.fetch(C, client_id=client, wait_ms=100)).batch is not None:
            seen += [r.value for r in nxt.batch.records]
            await gw.consume.ack(nxt.batch.request_id)
        assert seen[-1] == b"b" and seen.count(b"b") == (1 if client == "A" else 2)
