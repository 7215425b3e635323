"""Queue views show what an operator needs, including consumers that stopped polling."""

from __future__ import annotations

import time

import pytest

from .helpers import Api, unique


@pytest.mark.timeout(60)
def test_idle_consumer_backlog_keeps_growing_in_the_view(api: Api, make_topic) -> None:
    topic, idle, busy = make_topic(2), unique(), unique()
    for g in (idle, busy):
        assert api.message(consumer=g, topic=topic).json()["status"] == "empty"  # both at latest
    api.produce_exact(topic, [f"v{i}" for i in range(10)], partition=1)
    # the busy consumer's long poll ends once a node has listed the new watermarks into Redis
    assert api.message(consumer=busy, topic=topic, wait_ms=5000).json()["status"] == "ok"
    view = api.http.get(api.url(f"/consumers/{idle}/queues")).json()
    by_queue = {q["queue"]: q for q in view["queues"]}
    assert by_queue["1"]["backlog"] == 10 and by_queue["1"]["committedOffset"] == 0
    assert by_queue["0"]["backlog"] == 0
    assert by_queue["1"]["locked"] is False and by_queue["1"]["lockAgeMs"] is None


@pytest.mark.timeout(60)
def test_view_shows_lock_age_and_client(api: Api, make_topic) -> None:
    topic, g = make_topic(1), unique()
    api.config(g, start="earliest", consumeTimeoutMs=60_000)  # no stall of a loaded machine ends it
    api.produce_exact(topic, ["a", "b"])
    time.sleep(0.25)
    api.http.get(api.url("/message"), params={"consumer": g, "topic": topic, "max": 1},
                 headers={"x-forwarded-for": "10.1.2.3"})
    time.sleep(0.2)
    q = api.http.get(api.url(f"/consumers/{g}/queues")).json()["queues"][0]
    assert q["locked"] is True and 150 <= q["lockAgeMs"] < 60_000
    assert q["lastClientAddress"] == "10.1.2.3" and q["backlog"] == 2
    # a queue's tokens start at (ms of its first lock) x 1000, so this first lock ends in 001
    assert q["lockToken"] % 1000 == 1 and q["lockToken"] // 1000 > time.time() * 1000 - 60_000
