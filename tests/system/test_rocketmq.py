"""Apache RocketMQ's own behaviour through the gateway (issue 22), on the session's RocketMQ
5.5.0 (tests/conftest.py ``rocketmq``: timers up to 5 s, recall on).

- The broker SIGKILLed and restarted under produce and fetch/ack load through two nodes:
  nothing ``/produce`` acknowledged is lost, no committed offset goes back, and the gateway
  answers 503 (never 500) while the broker is gone.
- Tags: ``/produce`` ``tag``, ``/message`` ``tag=A||B`` (the others are committed past).
- Delays: the broker's timers up to its limit (cancelled by recall), the gateway's wheel beyond.
- Keys: the gateway's murmur2 rule over the queues, UTF-8 keys only.
- Every listening socket of both JVMs is on loopback (the HA service of gateway/cli/java).

The rest of the product on RocketMQ is the ``every_broker`` tests, run in the RocketMQ pass.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.broker.partitioner import partition_for_key

from ..support import ON_ROCKETMQ, TLS, Api, Node, unique, wait_for

pytestmark = [pytest.mark.rocketmq,
              pytest.mark.skipif(not ON_ROCKETMQ, reason="RocketMQ's own (MQGW_TEST_BROKER=rocketmq)")]


def test_every_listener_is_on_loopback(rocketmq: Any) -> None:
    listeners = rocketmq.listeners()
    assert listeners and all(a.startswith("127.0.0.1:") for a in listeners), listeners


@pytest.mark.timeout(120)
def test_the_brokers_own_topics_are_refused_on_every_route(api: Api) -> None:
    """Issue 33: ``/produce`` to ``rmq_sys_wheel_timer`` (the timer log, holding every pending
    timer record of every topic) was written, and ``/message`` on it and on the other system
    topics answered 200: any consumer could read every delayed record. Each is now
    ``403 internal_topic`` wherever a topic is named, as Kafka's ``__`` topics are."""
    cluster = api.http.get(api.url("/admin/topics"), params={"internal": "true"}).json()
    names = {t["name"] for t in cluster["topics"]}
    assert "rmq_sys_wheel_timer" in names or "SCHEDULE_TOPIC_XXXX" in names, sorted(names)
    from gateway.cli.rocketmq_dist import BROKER_NAME, CLUSTER

    system = ["rmq_sys_wheel_timer", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
              "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "BenchmarkTest", "TBW102", BROKER_NAME,
              CLUSTER, *sorted(n for n in names if n.startswith("rmq_sys_REVIVE_LOG_"))]
    g = unique()
    api.config(g, start="earliest")

    def refused(r: httpx.Response) -> None:
        assert r.status_code == 403, r.text
        assert "internal_topic" in r.text, r.text

    for t in system:
        refused(api.http.post(api.url("/produce"), json={"topic": t, "value": "x"}))
        refused(api.message(consumer=g, topic=t))
        refused(api.http.put(api.url(f"/admin/producers/{unique('p')}"), json={"topics": [t]}))
        refused(api.http.patch(api.url(f"/admin/consumers/{g}"),
                               json={"retry": {"deadLetterTopic": t}}))
        refused(api.http.post(api.url("/admin/topics"), json={"name": t, "partitions": 1}))
        refused(api.http.post(api.url(f"/topics/{t}"), json={"records": [{"value": "eA=="}]},
                              headers={"content-type": "application/vnd.kafka.binary.v2+json"}))


@pytest.mark.timeout(120)
def test_a_tag_filter_gets_its_tags_and_commits_past_the_rest(api: Api,
                                                              make_topic: Callable[..., str]) -> None:
    topic, g = make_topic(1), unique()
    api.config(g, start="earliest")
    r = api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": f"v{i}", "tag": "A" if i % 2 else "B", "queue": "broker-a.0"} for i in range(6)]})
    assert r.status_code == 200 and r.json()["failed"] == 0, r.text
    body = api.message(consumer=g, topic=topic, tag="A || C", max=10, wait_ms=5000).json()
    assert [(m["value"], m["tag"]) for m in body["messages"]] == [("v1", "A"), ("v3", "A"), ("v5", "A")]
    assert api.ack(body["requestId"]).json()["committedOffset"] == 6  # past the B records too
    other = unique()
    api.config(other, start="earliest")
    body = api.message(consumer=other, topic=topic, max=10, wait_ms=5000).json()
    assert [m["tag"] for m in body["messages"]] == ["B", "A"] * 3  # no filter: all of them
    r = api.message(consumer=g, topic=topic, tag="A|B")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_tag", r.text


@pytest.mark.timeout(120)
def test_keys_go_where_the_gateways_rule_puts_them_and_must_be_text(
        api: Api, make_topic: Callable[..., str]) -> None:
    topic = make_topic(5)
    keys = [f"order-{i}" for i in range(20)]
    r = api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"key": k, "value": "v"} for k in keys]})
    assert r.status_code == 200 and r.json()["failed"] == 0, r.text
    assert [x["queue"] for x in r.json()["results"]] == \
        [f"broker-a.{partition_for_key(k.encode(), 5)}" for k in keys]
    r = api.http.post(api.url("/produce"), json={"topic": topic, "encoding": "base64", "messages": [
        {"key": "//4=", "value": "AA=="}, {"key": "YQ==", "value": "AA==", "headers": {"KEYS": "eA=="}}]})
    assert r.status_code == 200 and r.json()["failed"] == 2, r.text
    assert {x["error"]["code"] for x in r.json()["results"]} == {"invalid_record"}


@pytest.mark.timeout(180)
def test_timers_hold_short_delays_the_wheel_long_ones_and_both_cancel(
        node_factory: Callable[..., Node], make_topic: Callable[..., str]) -> None:
    topic, g = make_topic(2), unique()
    # relay on, with levels of its own: delays over the broker's 5 s limit go through the wheel
    node = node_factory(relay="true", delay_levels="100ms,1s,5s", delay_topic_prefix=unique("d") + ".",
                        delay_cancel_cutoff_ms=500)
    with httpx.Client(base_url=node.url, timeout=30, verify=TLS) as http:
        assert http.get("/message", params={"consumer": g, "topic": topic}).status_code == 200
        r = http.post("/produce", json={"topic": topic, "messages": [
            {"value": "timer", "delayMs": 1500}, {"value": "timer-cancelled", "delayMs": 4000},
            {"value": "wheel", "delayMs": 7000}, {"value": "wheel-cancelled", "delayMs": 9000}]})
        assert r.status_code == 200, r.text
        results = {v: x for v, x in zip(["timer", "timer-cancelled", "wheel", "wheel-cancelled"],
                                        r.json()["results"], strict=True)}
        for v in ("timer-cancelled", "wheel-cancelled"):
            c = http.delete(f"/delayed/{results[v]['delayId']}")
            assert c.status_code == 200 and c.json()["result"] == "cancelled", c.text
        arrived: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while len(arrived) < 2 and time.monotonic() < deadline:
            body = http.get("/message", params={"consumer": g, "topic": topic, "max": 10,
                                                "wait_ms": 1000}).json()
            for m in body.get("messages", []):
                arrived[m["value"]] = int(time.time() * 1000)
                headers = dict(m["headers"])
                assert int(headers["mqgw-delay-due"]) == results[m["value"]]["deliverAt"]
            if body.get("requestId"):
                http.post("/ack", json={"requestId": body["requestId"]})
        # past both cancelled records' due times: nothing more comes
        time.sleep(max(0, results["wheel-cancelled"]["deliverAt"] - time.time() * 1000) / 1000 + 1)
        body = http.get("/message", params={"consumer": g, "topic": topic, "wait_ms": 2000}).json()
    assert sorted(arrived) == ["timer", "wheel"] and body["status"] == "empty", (arrived, body)
    for v, at in arrived.items():
        assert at >= results[v]["deliverAt"], v  # never early


@pytest.mark.timeout(300)
def test_broker_killed_under_load_loses_nothing_acknowledged(
        rocketmq: Any, node_factory: Callable[..., Node], make_topic: Callable[..., str]) -> None:
    topic, g = make_topic(2), unique("kill")
    nodes = [node_factory(), node_factory()]
    urls = [n.url for n in nodes]
    acked: set[str] = set()
    seen: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    committed: dict[str, int] = {}
    went_back: list[tuple[str, int, int]] = []
    stop_producing = threading.Event()
    lock = threading.Lock()

    def call(http: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response | None:
        try:
            r = http.request(method, random.choice(urls) + path, **kw)
        except httpx.HTTPError:
            return None
        with lock:
            statuses[r.status_code] += 1
        return r

    def produce() -> None:
        n = 0
        with httpx.Client(timeout=30, verify=TLS) as http:
            while not stop_producing.is_set():
                values = [f"v{n + i}" for i in range(20)]
                n += 20
                r = call(http, "POST", "/produce", json={"topic": topic, "messages": [
                    {"value": v} for v in values]})
                if r is not None and r.status_code == 200:
                    with lock:
                        acked.update(v for v, x in zip(values, r.json()["results"], strict=True)
                                     if "error" not in x)
                time.sleep(0.01)

    def consume(until: Callable[[], bool]) -> None:
        with httpx.Client(timeout=30, verify=TLS) as http:
            while not until():
                r = call(http, "GET", "/message", params={"consumer": g, "topic": topic, "max": 50,
                                                           "wait_ms": 200})
                if r is None or r.status_code != 200 or not r.json().get("requestId"):
                    time.sleep(0.05)
                    continue
                body = r.json()
                a = call(http, "POST", "/ack", json={"requestId": body["requestId"]})
                if a is None or a.status_code != 200 or a.json()["result"] != "committed":
                    continue  # not acked: redelivered later (at least once)
                with lock:
                    seen.update(m["value"] for m in body["messages"])
                    q, c = body["queue"], a.json()["committedOffset"]
                    if c < committed.get(q, 0):
                        went_back.append((q, committed[q], c))
                    committed[q] = max(committed.get(q, 0), c)

    lagging = unique("lag")  # a consumer with a backlog: its polls read the broker, not nothing

    def lagging_poll(http: httpx.Client) -> int:
        r = call(http, "GET", "/message", params={"consumer": lagging, "topic": topic, "wait_ms": 0})
        if r is not None and r.status_code == 200 and r.json().get("requestId"):
            call(http, "POST", "/unlock", json={"requestId": r.json()["requestId"]})
        return r.status_code if r is not None else 0

    with httpx.Client(timeout=30, verify=TLS) as http:
        for c in (g, lagging):
            assert http.patch(f"{urls[0]}/admin/consumers/{c}", json={"start": "earliest"}).status_code == 200
    producer = threading.Thread(target=produce)
    done = threading.Event()
    consumer = threading.Thread(target=consume, args=(done.is_set,))
    producer.start()
    consumer.start()
    try:
        wait_for(lambda: len(seen) >= 500, "records flowing before the kill", timeout=60)
        with httpx.Client(timeout=30, verify=TLS) as http:
            assert lagging_poll(http) == 200
            rocketmq.kill_broker(signal.SIGKILL)
            try:
                # a poll that must read the broker: 503 (the broker is unavailable), never 500
                wait_for(lambda: lagging_poll(http) == 503, "a 503 while the broker is gone", timeout=60)
                time.sleep(1)  # the load goes on against the dead broker for a moment
            finally:
                rocketmq.start_broker()
        before = len(acked)
        wait_for(lambda: len(acked) >= before + 500, "records acknowledged after the restart",
                 timeout=120)
    finally:
        stop_producing.set()
        producer.join(60)
        # every acknowledged record is delivered (and acked) in the end
        deadline = time.monotonic() + 120
        while not acked <= set(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        done.set()
        consumer.join(60)
    lost = acked - set(seen)
    assert not lost, f"{len(lost)} acknowledged records never delivered, e.g. {sorted(lost)[:5]}"
    assert not went_back, went_back
    assert statuses[500] == 0 and set(statuses) <= {200, 503}, statuses
