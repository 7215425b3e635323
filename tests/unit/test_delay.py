"""Delayed records (core/delay.py, core/wheel.py, store/delay.py's scripts): which level topic a
delayed record is written to and with which headers, the short remainder waited out in the
request, cancels and their cutoff, and delay ids that only this gateway can make."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.broker import CancelRefused, Capability, OutgoingMessage, ProduceResult
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core.delay import DelayService
from gateway.core.errors import Conflict, Invalid
from gateway.core.wheel import H_DUE, H_HOP_DUE, H_ID, H_PARTITION, H_TOPIC, Wheel, parse_levels
from gateway.store import OffsetStore

from .conftest import BASE_SETTINGS, Clock

pytestmark = pytest.mark.anyio

T = "orders"
LEVELS = "100ms,1s,10s"


@pytest.fixture
def delay(store: OffsetStore, broker: MemoryBroker) -> DelayService:
    broker.create(T, 2)
    return DelayService(Settings(**{**BASE_SETTINGS, "delay_levels": LEVELS,
                                    "delay_topic_prefix": "d."}), store, broker)


def now_ms() -> int:
    return int(time.time() * 1000)


def headers(broker: MemoryBroker, topic: str) -> list[dict[str, str]]:
    return [{n: v.decode() for n, v in r.headers}
            for q in broker.logs[topic].values() for r in q.values()]


async def test_each_record_goes_to_the_largest_level_that_does_not_overshoot(
        delay: DelayService, broker: MemoryBroker) -> None:
    now = now_ms()
    dues: list[int | None] = [now + 5_000, None, now + 25_000, now + 1_500]
    msgs = [OutgoingMessage(f"v{i}".encode(), None, [("own", b"h")]) for i in range(4)]
    msgs[3] = OutgoingMessage(b"v3", None, [], "1")  # a chosen queue travels in a header
    produced, delayed = await delay.produce(T, msgs, dues)
    assert sorted(delayed) == [0, 2, 3] and all(not r.error_code for r in produced.results)
    assert [r.value for r in broker.logs[T]["0"].values()] + \
        [r.value for r in broker.logs[T]["1"].values()] == [b"v1"]  # only the undelayed one
    assert set(broker.logs) == {T, "d.100ms", "d.1000ms", "d.10000ms"}  # the levels were made
    one_s = headers(broker, "d.1000ms")
    assert sorted(h[H_DUE] for h in one_s) == sorted([str(now + 5_000), str(now + 1_500)])
    for h in one_s:
        assert h[H_TOPIC] == T and 0 <= int(h[H_HOP_DUE]) - now - 1_000 < 1_000
        assert h[H_ID] in {d.delay_id for d in delayed.values()}
    assert {h.get(H_PARTITION) for h in one_s} == {None, "1"}
    assert {h.get("own") for h in one_s} == {"h", None}  # the record's own headers travel too
    ten_s, = headers(broker, "d.10000ms")
    assert ten_s[H_DUE] == str(now + 25_000) and ten_s["own"] == "h"
    assert headers(broker, "d.100ms") == []
    assert delayed[2].deliver_at == now + 25_000


async def test_a_remainder_below_the_smallest_level_is_waited_out_never_early(
        delay: DelayService, broker: MemoryBroker) -> None:
    due = now_ms() + 40
    produced, delayed = await delay.produce(T, [OutgoingMessage(b"soon", None, [])], [due])
    assert now_ms() >= due  # the request held it until its due time
    assert list(delayed) == [0] and not produced.results[0].error_code
    rec, = [r for q in broker.logs[T].values() for r in q.values()]
    assert rec.value == b"soon" and dict(rec.headers)[H_DUE] == str(due).encode()
    assert all(not q for lvl in ("d.100ms", "d.1000ms") for q in broker.logs[lvl].values())


async def test_cancel_before_the_cutoff_and_refusals_after_it(delay: DelayService,
                                                               clock: Clock) -> None:
    now = now_ms()
    _, delayed = await delay.produce(T, [OutgoingMessage(b"keep", None, []),
                                         OutgoingMessage(b"drop", None, [])],
                                     [now + 600_000, now + 1_500])
    far, near = delayed[0].delay_id, delayed[1].delay_id
    c = await delay.cancel(far)
    assert (c.delay_id, c.deliver_at, c.topic, c.already) == (far, now + 600_000, T, False)
    again = await delay.cancel(far)  # again: still cancelled, not an error, and said so
    assert (again.delay_id, again.already) == (far, True)
    clock.advance(600)  # Redis' clock: within delay_cancel_cutoff_ms (1 s) of its due time
    with pytest.raises(Conflict) as e:
        await delay.cancel(near)
    assert e.value.code == "already_delivered"


@pytest.mark.parametrize("mangle", [
    lambda d: d + "=",  # one spelling per id
    lambda d: d + "==",
    lambda d: d[:-2] + ("AA" if not d.endswith("AA") else "BB"),  # a forged signature
    lambda d: "garbage",
    lambda d: d.split(".")[0],  # no signature at all
])
async def test_delay_ids_are_refused_unless_this_gateway_made_them(
        delay: DelayService, mangle: Any) -> None:
    _, delayed = await delay.produce(T, [OutgoingMessage(b"x", None, [])], [now_ms() + 60_000])
    with pytest.raises(Invalid) as e:
        await delay.cancel(mangle(delayed[0].delay_id))
    assert e.value.code == "invalid_delay_id"


async def test_an_id_signed_with_another_key_is_refused(store: OffsetStore, broker: MemoryBroker,
                                                        delay: DelayService) -> None:
    other = DelayService(Settings(**{**BASE_SETTINGS, "hmac_key": "another-key-0123456789abcdef",
                                     "delay_levels": LEVELS, "delay_topic_prefix": "d."}),
                         store, broker)
    _, delayed = await other.produce(T, [OutgoingMessage(b"x", None, [])], [now_ms() + 60_000])
    with pytest.raises(Invalid):
        await delay.cancel(delayed[0].delay_id)


def test_plans_never_overshoot_and_leave_less_than_the_smallest_level() -> None:
    w = Wheel(parse_levels(LEVELS), "d.")
    assert w.plan(25_000) == (1, [10_000, 1_000, 1_000, 1_000, 1_000, 1_000])
    for d in (1, 99, 100, 101, 999, 1_000, 12_345, 86_400_000):
        loops, hops = w.plan(d)
        travelled = loops * 10_000 + sum(hops)
        assert travelled <= d and d - travelled < 100, d
    assert w.level_for(99) is None and w.level_for(5_000) == 1_000
    assert w.act_by(hop_due=1_000, due=1_050, slack_ms=20) == 1_050  # its topic next: at due
    assert w.act_by(hop_due=1_000, due=9_000, slack_ms=20) == 1_020  # another level: may wait
    assert w.act_by(hop_due=1_000, due=1_110, slack_ms=50) == 1_010  # never below the smallest


# -- a broker with timers of its own (RocketMQ 5) ------------------------------------------------

class TimerBroker(MemoryBroker):
    """Holds records up to 10 s itself (as RocketMQ's timers do, to ``timerMaxDelaySec``): it
    keeps what it was asked to hold, and answers cancels as the test says."""

    capabilities = MemoryBroker.capabilities | {Capability.DELAYED_DELIVERY}
    native_delay_max_ms = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.held: list[OutgoingMessage] = []
        self.cancelled: list[str] = []
        self.refuse: CancelRefused | None = None

    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        now = [m for m in messages if m.deliver_at is None]
        out = iter(await super().produce(topic, now))
        results = []
        for m in messages:
            if m.deliver_at is None:
                results.append(next(out))
            else:
                self.held.append(m)
                results.append(ProduceResult(cancel_handle=f"h{len(self.held)}"))
        return results

    async def cancel_delayed(self, topic: str, handle: str) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.cancelled.append(handle)


@pytest.fixture
def timers(store: OffsetStore) -> tuple[DelayService, TimerBroker]:
    broker = TimerBroker()
    broker.create(T, 2)
    return DelayService(Settings(**{**BASE_SETTINGS, "delay_levels": LEVELS,
                                    "delay_topic_prefix": "d."}), store, broker), broker


async def test_delays_within_the_brokers_limit_are_the_brokers_and_longer_ones_the_wheels(
        timers: tuple[DelayService, TimerBroker]) -> None:
    delay, broker = timers
    now = now_ms()
    msgs = [OutgoingMessage(b"short"), OutgoingMessage(b"long")]
    produced, delayed = await delay.produce(T, msgs, [now + 5_000, now + 25_000])
    assert not produced.failed and sorted(delayed) == [0, 1]
    assert [(m.value, m.deliver_at) for m in broker.held] == [(b"short", now + 5_000)]
    assert [r.value for r in broker.logs["d.10000ms"]["0"].values()] + \
        [r.value for r in broker.logs["d.10000ms"].get("1", {}).values()] == [b"long"]
    assert delay.ids.parse(delayed[0].delay_id).handle == "h1"  # the broker's cancel handle
    assert delay.ids.parse(delayed[1].delay_id).handle == ""  # the wheel's: a mark in Redis
    assert delayed[0].deliver_at == now + 5_000  # the answer says when, either way


async def test_a_cancel_of_a_record_the_broker_holds_goes_to_the_broker(
        timers: tuple[DelayService, TimerBroker]) -> None:
    delay, broker = timers
    now = now_ms()
    _, delayed = await delay.produce(T, [OutgoingMessage(b"a"), OutgoingMessage(b"b"),
                                         OutgoingMessage(b"c")], [now + 9_000] * 3)
    assert (await delay.cancel(delayed[0].delay_id)).deliver_at == now + 9_000
    assert broker.cancelled == ["h1"]
    broker.refuse = CancelRefused(True, "due already")
    with pytest.raises(Conflict) as e:
        await delay.cancel(delayed[1].delay_id)
    assert e.value.code == "already_delivered"
    broker.refuse = CancelRefused(False, "recall is off")
    with pytest.raises(Conflict) as e:
        await delay.cancel(delayed[2].delay_id)
    assert e.value.code == "cancel_unsupported"


async def test_a_cancel_within_the_cutoff_never_reaches_the_broker(
        store: OffsetStore) -> None:
    broker = TimerBroker()
    broker.create(T, 1)
    delay = DelayService(Settings(**{**BASE_SETTINGS, "delay_levels": LEVELS,
                                     "delay_cancel_cutoff_ms": 60_000}), store, broker)
    _, delayed = await delay.produce(T, [OutgoingMessage(b"a")], [now_ms() + 9_000])
    with pytest.raises(Conflict) as e:
        await delay.cancel(delayed[0].delay_id)
    assert e.value.code == "already_delivered" and broker.cancelled == []


async def test_a_delivered_record_names_its_delay_id(
        redis: Any, broker: MemoryBroker) -> None:
    """Issue 33: a delivered record carried ``mqgw-delay-due`` but no delay id, so a consumer
    could not tell a copy the wheel wrote twice (a relay that stalled past its lock) from two
    records. Every record the wheel delivers names it (``mqgw-delay-id``, the produce answer's
    ``delayId``); the wheel's other headers stay behind. The record hops twice through the
    100 ms level, and is delivered by the relay within ~10 s at the latest."""
    import asyncio

    from gateway.services import close_services, open_services

    broker.create(T, 1)
    s = await open_services(Settings(**{**BASE_SETTINGS, "delay_levels": LEVELS,
                                        "delay_topic_prefix": "d.", "relay": True}),
                            broker=broker, redis=redis, serve=False)
    try:
        now = now_ms()
        _, delayed = await s.delay.produce(T, [OutgoingMessage(b"hop", None, [("own", b"h")]),
                                               OutgoingMessage(b"soon", None, [])],
                                           [now + 250, now + 30])
        for _ in range(1000):  # (delivered in ~0.3 s; before, a parked level queue's wake-up
            if len(headers(broker, T)) == 2:  # was missed and the relay slept 5 s)
                break
            await asyncio.sleep(0.01)
    finally:
        await close_services(s)
    got = {h[H_ID]: h for h in headers(broker, T)}
    assert set(got) == {d.delay_id for d in delayed.values()}, got
    for h in got.values():
        assert not {H_TOPIC, H_HOP_DUE, H_PARTITION} & set(h), h
        assert H_DUE in h


async def test_a_relay_whose_read_outlasts_its_lock_keeps_the_queue_and_sends_once(
        redis: Any, broker: MemoryBroker) -> None:
    """Issue 33: a level queue's lock (``relay_lock_ms``) ran out while its relay's read was in
    flight (72 s under load), another relay took the queue and sent its records, and then the
    first sent them too: 412 of 2,930 delayed records written 2-5 times. Two relays here (two
    services on one Redis), the first read of a level queue taking 4 lock timeouts: the holder
    keeps its lock alive meanwhile, and every record is delivered once."""
    import asyncio

    from gateway.services import close_services, open_services

    broker.create(T, 1)
    real_fetch = broker.fetch
    slow = [1]

    async def fetch(topic: str, *a: Any, **kw: Any) -> Any:
        if topic.startswith("d.") and slow[0]:
            slow[0] -= 1
            await asyncio.sleep(1.2)
        return await real_fetch(topic, *a, **kw)

    broker.fetch = fetch  # type: ignore[method-assign]
    conf = Settings(**{**BASE_SETTINGS, "delay_levels": LEVELS, "delay_topic_prefix": "d.",
                       "relay": True, "relay_lock_ms": 300})
    relays = [await open_services(conf, broker=broker, redis=redis, serve=False) for _ in range(2)]
    try:
        now = now_ms()
        _, delayed = await relays[0].delay.produce(
            T, [OutgoingMessage(f"v{i}".encode(), None, []) for i in range(20)], [now + 150] * 20)
        for _ in range(1000):
            if len(headers(broker, T)) >= 20 and not slow[0]:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.5)  # time for a second copy to arrive, if one would
    finally:
        for s in relays:
            await close_services(s)
    ids = [h[H_ID] for h in headers(broker, T)]
    assert sorted(ids) == sorted(d.delay_id for d in delayed.values()), \
        f"{len(ids)} delivered for 20 records"
