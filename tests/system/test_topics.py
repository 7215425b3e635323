"""Topics in the admin API and CLI (issue 20): list with partitions and end offsets, describe,
create; the gateway's and the broker's own topics hidden unless asked for.

Real redis-server, the real broker (Tansu or Apache Kafka), gateway nodes as uvicorn processes;
the rules alone on the in-memory broker first.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core.errors import Conflict, Forbidden, Invalid
from gateway.core.topics import MAX_PARTITIONS, TopicService

from ..support import ON_ROCKETMQ, ON_TANSU, ROOT, Api, Secure, create_topic, queue_of, queue_ref, unique

#: the broker adapter itself: run on every broker (tests/conftest.py)
pytestmark = pytest.mark.every_broker

# -- the rules, on the in-memory broker ---------------------------------------------------------


def test_service_hides_internal_topics_and_refuses_bad_creates() -> None:
    b = MemoryBroker(topics={"orders": 3, "mqgw.delay.100ms": 2, "mqgw.retry.g.orders.x": 1,
                             "mqgw.dead.g": 1, "__consumer_offsets": 1})
    b.append("orders", "1", "a", "b")
    svc = TopicService(Settings(), b)

    async def body() -> None:
        names = [t.name for t in await svc.list()]
        assert names == ["mqgw.dead.g", "orders"]  # dead letters are the user's records
        every = {t.name: t.internal for t in await svc.list(include_internal=True)}
        assert every == {"orders": False, "mqgw.dead.g": False, "mqgw.delay.100ms": True,
                         "mqgw.retry.g.orders.x": True, "__consumer_offsets": True}
        orders = await svc.describe("orders")
        assert [(q.queue, q.low, q.high) for q in orders.queues] == [("0", 0, 0), ("1", 0, 2), ("2", 0, 0)]
        created = await svc.create("payments", 4, None)
        assert (created.name, len(created.queues), created.internal) == ("payments", 4, False)
        with pytest.raises(Conflict) as conflict:
            await svc.create("payments", 4, None)
        assert conflict.value.code == "topic_exists"
        for name, parts, repl, code in [
                ("a/b", 1, None, "invalid_topic"), ("", 1, None, "missing_topic"),
                ("..", 1, None, "invalid_topic"), ("x", 0, None, "invalid_partitions"),
                ("x", MAX_PARTITIONS + 1, None, "invalid_partitions"),
                ("x", 1, 0, "invalid_replication_factor"),
                ("x", 1, 3, "invalid_replication_factor")]:  # the memory broker keeps one copy
            with pytest.raises(Invalid) as bad:
                await svc.create(name, parts, repl)
            assert bad.value.code == code, (name, parts, repl)
        for name in ("mqgw.delay.5ms", "mqgw.retry.x", "__x", "mqgw_delay_l0", "MQGW.delay.l0"):
            with pytest.raises(Forbidden) as internal:
                await svc.create(name, 1, None)
            assert internal.value.code == "internal_topic"
        assert "x" not in b.logs
    asyncio.run(body())


# -- the HTTP API on the real broker --------------------------------------------------------------

def _by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in listing["topics"]}


def test_create_describe_list_and_produce_right_away(api: Api) -> None:
    topic = unique("orders")
    http = api.http
    # a poll on the topic before it exists: 404, and the node remembers that for a moment
    r = http.get(api.url("/message", 0), params={"consumer": unique(), "topic": topic})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_topic"
    r = http.post(api.url("/admin/topics", 0), json={"name": topic, "partitions": 3})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["name"], body["internal"], body["partitionCount"]) == (topic, False, 3)
    assert body["replicationFactor"] == 1  # the test brokers' default
    assert [queue_of(p) for p in body["partitions"]] == [queue_ref(i) for i in range(3)]
    for p in body["partitions"]:
        assert (p["earliestOffset"], p["endOffset"]) == (0, 0)
        assert p["leader"] is not None and p["replicas"] == [p["leader"]] and p["inSync"] == [p["leader"]]
    # usable at once, on every node, the one that just answered 404 included
    g = unique()
    assert http.patch(api.url(f"/admin/consumers/{g}", 0), json={"start": "earliest"}).status_code == 200
    for node in range(3):
        r = http.post(api.url("/produce", node), json={"topic": topic, "key": f"k{node}", "value": "v"})
        assert r.status_code == 200 and r.json()["failed"] == 0, r.text
    r = http.get(api.url("/message", 0), params={"consumer": g, "topic": topic, "wait_ms": 2000})
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    # one record per request, so each is a batch of its own: Tansu's end offsets are exact then
    described = http.get(api.url(f"/admin/topics/{topic}", 1)).json()
    assert sum(p["endOffset"] for p in described["partitions"]) == 3
    listed = _by_name(http.get(api.url("/admin/topics", 2)).json())
    assert listed[topic] == described
    # a second create of the same name
    r = http.post(api.url("/admin/topics", 1), json={"name": topic, "partitions": 3})
    assert r.status_code == 409 and r.json()["error"]["code"] == "topic_exists"


def test_internal_topics_are_listed_only_when_asked_for(api: Api, bootstrap: str) -> None:
    tag = unique("it")
    retry, level, dead = f"mqgw.retry.{tag}", f"mqgw.delay.{tag}", f"mqgw.dead.{tag}"
    for name in (retry, level, dead):  # as the gateway makes them (it bypasses the API's refusal)
        create_topic(bootstrap, name, 1)
    default = _by_name(api.http.get(api.url("/admin/topics")).json())
    assert dead in default and default[dead]["internal"] is False
    assert retry not in default and level not in default
    assert not [t for t in default if t.startswith("__")]
    every = _by_name(api.http.get(api.url("/admin/topics"), params={"internal": "true"}).json())
    assert every[retry]["internal"] is True and every[level]["internal"] is True
    assert all(every[t]["internal"] for t in every if t.startswith("__"))
    if ON_ROCKETMQ:  # the old delay levels' topic, one of RocketMQ's own
        assert every["SCHEDULE_TOPIC_XXXX"]["internal"] is True and "SCHEDULE_TOPIC_XXXX" not in default
        assert every["mqgw"]["internal"] is True  # the one named after the test cluster
    elif not ON_TANSU:  # Apache Kafka has its group offsets topic once any group was used
        assert "__consumer_offsets" in every
    # describe answers for an internal topic too, saying it is one
    assert api.http.get(api.url(f"/admin/topics/{retry}")).json()["internal"] is True


@pytest.mark.parametrize("body,status,code", [
    ({"partitions": 1}, 400, "missing_topic"),
    ({"name": "a:b", "partitions": 1}, 400, "invalid_topic"),
    ({"name": "x" * 250, "partitions": 1}, 400, "invalid_topic"),
    ({"name": 5, "partitions": 1}, 400, "invalid_topic"),
    ({"name": "{n}"}, 400, "missing_partitions"),
    ({"name": "{n}", "partitions": 0}, 400, "invalid_partitions"),
    ({"name": "{n}", "partitions": "3"}, 400, "invalid_partitions"),
    ({"name": "{n}", "partitions": 1.5}, 400, "invalid_partitions"),
    ({"name": "{n}", "partitions": True}, 400, "invalid_partitions"),
    ({"name": "{n}", "partitions": 10**6}, 400, "invalid_partitions"),
    ({"name": "{n}", "partitions": 1, "replicationFactor": 0}, 400, "invalid_replication_factor"),
    ({"name": "{n}", "partitions": 1, "replicationFactor": "1"}, 400, "invalid_replication_factor"),
    # librdkafka refuses over 10,000 before asking (a ValueError: it answered 500)
    ({"name": "{n}", "partitions": 1, "replicationFactor": 32767}, 400, "invalid_replication_factor"),
    ({"name": "{n}", "partitions": 1, "config": {}}, 400, "unknown_field"),
    ({"name": "mqgw.delay.1ms", "partitions": 1}, 403, "internal_topic"),
    ({"name": "mqgw.retry.g.t.x", "partitions": 1}, 403, "internal_topic"),
    ({"name": "__mine", "partitions": 1}, 403, "internal_topic"),
    # names that collide with the gateway's own or Kafka's (issue 33: accepted before, they
    # could then block the level topic the wheel makes later)
    ({"name": "mqgw_delay_l0", "partitions": 1}, 403, "internal_topic"),
    ({"name": "MQGW.delay.l0", "partitions": 1}, 403, "internal_topic"),
    ({"name": "_.mine", "partitions": 1}, 403, "internal_topic"),
    ([], 400, "invalid_body"),
])
def test_bad_creates_are_refused(api: Api, body: Any, status: int, code: str) -> None:
    if ON_ROCKETMQ and isinstance(body, dict) and str(body.get("name", "")).startswith(("__", "_.")):
        pytest.skip("'__' names are Kafka's own; RocketMQ's are refused in test_rocketmq.py")
    name = unique("never")
    if isinstance(body, dict) and body.get("name") == "{n}":
        body = {**body, "name": name}
    r = api.http.post(api.url("/admin/topics"), json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert api.http.get(api.url(f"/admin/topics/{name}")).status_code == 404  # nothing made


def test_unknown_and_bad_names_and_parameters(api: Api) -> None:
    r = api.http.get(api.url(f"/admin/topics/{unique('nope')}"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_topic"
    r = api.http.get(api.url("/admin/topics/a:b"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_topic"
    r = api.http.get(api.url("/admin/topics"), params={"internal": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_internal"
    r = api.http.get(api.url("/admin/topics"), params={"inernal": "true"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_parameter"
    r = api.http.post(api.url("/admin/topics"), content=b"")
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_body"


@pytest.mark.skipif(ON_TANSU, reason="Tansu accepts any replication factor (it keeps one copy)")
def test_more_replicas_than_brokers_is_the_brokers_refusal(api: Api) -> None:
    name = unique("repl")
    r = api.http.post(api.url("/admin/topics"), json={"name": name, "partitions": 1, "replicationFactor": 3})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_replication_factor", r.text
    assert "broker" in r.json()["error"]["message"]


def test_admin_key_required(sec: Secure, make_topic: Callable[..., str]) -> None:
    topic = make_topic(2)
    plain = sec.key(unique("plain"), consumers=["someone"])
    for method, path, body in [("GET", "/admin/topics", None), ("GET", f"/admin/topics/{topic}", None),
                               ("POST", "/admin/topics", {"name": unique("s"), "partitions": 1})]:
        assert sec.call(method, path, json=body).status_code == 401
        r = sec.call(method, path, plain, json=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert topic in _by_name(sec.admin("GET", "/admin/topics"))
    name = unique("s")
    assert sec.admin("POST", "/admin/topics", node=1, expect=201,
                     json={"name": name, "partitions": 2})["partitionCount"] == 2


def test_cli_lists_describes_and_creates(api: Api) -> None:
    url = api.urls[0]

    def mqgw(*args: str) -> tuple[int, Any, str]:
        p = subprocess.run([sys.executable, "-m", "gateway", "admin", "--url", url, "topics", *args],
                           cwd=ROOT, env={**os.environ, "MQGW_ADMIN_KEY": ""}, capture_output=True,
                           text=True, timeout=60)
        return p.returncode, json.loads(p.stdout) if p.stdout.strip() else None, p.stderr

    name = unique("cli")
    rc, body, err = mqgw("create", name, "--partitions", "2")
    assert rc == 0, err
    assert (body["name"], body["partitionCount"]) == (name, 2)
    rc, body, _ = mqgw("describe", name)
    assert rc == 0 and [queue_of(p) for p in body["partitions"]] == [queue_ref(0), queue_ref(1)]
    rc, body, _ = mqgw("list", "--internal", "--json")
    assert rc == 0 and name in _by_name(body)
    table = subprocess.run([sys.executable, "-m", "gateway", "admin", "--url", url, "topics", "list"],
                           cwd=ROOT, env={**os.environ, "MQGW_ADMIN_KEY": ""}, capture_output=True,
                           text=True, timeout=60)  # by default a table: one line a topic
    assert table.returncode == 0 and table.stdout.startswith("TOPIC")
    assert [ln.split()[:2] for ln in table.stdout.splitlines() if ln.startswith(name)] == [[name, "2"]]
    rc, _, err = mqgw("create", name, "--partitions", "2")
    assert rc == 1 and "409" in err and "topic_exists" in err
    rc, _, err = mqgw("create", unique("cli"), "--partitions", "1", "--replication-factor", "0")
    assert rc == 1 and "invalid_replication_factor" in err

