"""The delayed-produce phase's second half: how late the relay delivered (run.py ``delay``).

The phase produces records with random delays through the gateway (loadgen, ``max_delay_ms``);
this module then waits until the last of them is due, reads the target topic with a raw
consumer, and compares each record's broker timestamp (when the relay wrote it) with its
``mqgw-delay-due`` header (when it was due). Delivered records per second are counted over
the span in which they were due.

On Apache RocketMQ the gateway gives delays up to the brokers' ``timerMaxDelaySec`` (3 days) to
the broker's timers, so there the phase measures RocketMQ's timer wheel, not the gateway's:
:func:`lateness_rocketmq` reads the topic with the gateway's adapter, whose record time of a
record a timer held is when the timer delivered it (``TIMER_DEQUEUE_MS``).
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

#: The bench gateway's wheel: the default decades scaled down by 60 (an hour becomes a minute),
#: so that delays "up to an hour" go through the same number of levels in a minute or less.
LEVELS = ("100ms,200ms,300ms,400ms,500ms,600ms,700ms,800ms,900ms,"
          "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,20s,30s")
TOPIC_PREFIX = "bench.delay."
DUE = "mqgw-delay-due"


def env() -> dict[str, str]:
    """Gateway settings for the phase (the relay runs in every worker, as by default)."""
    return {"MQGW_DELAY_LEVELS": LEVELS, "MQGW_DELAY_TOPIC_PREFIX": TOPIC_PREFIX,
            "MQGW_DELAY_PARTITIONS": "2"}


def lateness(bootstrap: str, topic: str, partitions: int, expected: int,
             timeout_s: float) -> dict[str, Any]:
    """Read ``topic`` from the start until ``expected`` delayed records (or ``timeout_s``)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-delay-reader",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 0,
                  "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    late: list[int] = []
    dues: list[int] = []
    early = 0
    deadline = time.monotonic() + timeout_s
    try:
        while len(late) < expected and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error():
                    continue
                due = next((int(v) for k, v in (m.headers() or []) if k == DUE), None)
                if due is None:
                    continue
                ts = m.timestamp()[1]
                late.append(ts - due)
                dues.append(due)
                early += ts < due
    finally:
        c.close()
    return summary(late, dues, early, expected)


def lateness_rocketmq(namesrv: str, topic: str, expected: int, timeout_s: float) -> dict[str, Any]:
    """:func:`lateness` on Apache RocketMQ: every queue of ``topic`` pulled from offset 0 (the
    adapter's connections and routes, PULL_MESSAGE as its reads send it) until ``expected``
    delayed records (or ``timeout_s``). A record's delivery time is when the broker's timer
    released it (``TIMER_DEQUEUE_MS``); a record whose due time had passed when the broker got it
    is stored at once, without a timer ("direct": its delivery time is its store time; the
    adapter's record time, the producer's born time, would make it look early)."""
    import asyncio

    from gateway.broker.rocketmq import RocketMQBroker
    from gateway.broker.rocketmq.codes import PULL_SUBSCRIPTION, Req, Resp
    from gateway.broker.rocketmq.message import TIMER_DEQUEUE_MS, decode_messages, to_broker_name

    async def go() -> dict[str, Any]:
        b = RocketMQBroker(namesrv)
        await b.start()
        client = b._client  # the adapter's reads give the born time only: pulled here instead
        late: list[int] = []
        dues: list[int] = []
        early = direct = 0

        async def pull(q: str, at: int) -> tuple[list[Any], int]:
            addr, qid = await client.master_of(topic, q)
            resp = await client.call(addr, Req.PULL_MESSAGE, {
                "consumerGroup": "mqgw_reader", "topic": to_broker_name(topic), "queueId": str(qid),
                "queueOffset": str(at), "maxMsgNums": "32", "sysFlag": str(PULL_SUBSCRIPTION),
                "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
                "subVersion": "0", "expressionType": "TAG"})
            if resp.code != Resp.SUCCESS:
                return [], at
            got = [m for m in decode_messages(resp.body) if m.queue_offset >= at]
            return got, max(int(resp.ext.get("nextBeginOffset", at)), got[-1].queue_offset + 1 if got else at)

        try:
            queues = await b.queues(topic)
            at = dict.fromkeys(queues, 0)
            deadline = time.monotonic() + timeout_s
            while len(late) < expected and time.monotonic() < deadline:
                results = await asyncio.gather(*(pull(q, at[q]) for q in queues))
                for q, (msgs, nxt) in zip(queues, results, strict=True):
                    at[q] = nxt
                    for m in msgs:
                        due = m.properties.get(DUE)
                        if due is None:
                            continue
                        deq = m.properties.get(TIMER_DEQUEUE_MS, "")
                        direct += not deq.isdigit()
                        ts = int(deq) if deq.isdigit() else m.store_timestamp
                        late.append(ts - int(due))
                        dues.append(int(due))
                        early += ts < int(due)
                if not any(msgs for msgs, _ in results):
                    await asyncio.sleep(0.2)
        finally:
            await b.close()
        return {**summary(late, dues, early, expected), "direct": direct}

    return asyncio.run(go())


def summary(late: list[int], dues: list[int], early: int, expected: int) -> dict[str, Any]:
    late.sort()

    def q(p: float) -> int | None:
        return late[min(len(late) - 1, int(len(late) * p))] if late else None

    span_s = (max(dues) - min(dues)) / 1000 if len(dues) > 1 else 0
    return {"delivered": len(late), "expected": expected, "early": early,
            "lateness_ms": {"min": late[0] if late else None, "p50": q(0.5), "p99": q(0.99),
                            "max": late[-1] if late else None},
            "due_span_s": round(span_s, 1),
            "delivered_per_s": round(len(late) / span_s) if span_s else None}
