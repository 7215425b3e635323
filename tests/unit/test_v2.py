"""The Confluent REST Proxy v2 routes (gateway/api/v2.py, core/instances.py) in one process:
two apps on one fakeredis and one memory broker stand for two nodes, and every call of a
consumer instance goes to the other one of them (nothing of an instance lives in a node)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import fakeredis
import httpx
import orjson
import pytest

from gateway.api.app import create_app
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings

from .conftest import BASE_SETTINGS

pytestmark = pytest.mark.anyio

V2 = "application/vnd.kafka.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"


class Nodes:
    """Two nodes; :meth:`next` answers them in turn, as a round-robin load balancer."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self.n = 0

    def next(self) -> httpx.AsyncClient:
        self.n += 1
        return self.clients[self.n % len(self.clients)]

    async def post(self, path: str, body: Any = None, ctype: str = V2, **kw: Any) -> httpx.Response:
        content = orjson.dumps(body) if body is not None else b""
        return await self.next().post(path, content=content, headers={"content-type": ctype}, **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.next().request("GET", path, **kw)

    async def delete(self, path: str) -> httpx.Response:
        return await self.next().delete(path)

    async def records(self, path: str, accept: str = BINARY_V2) -> list[dict[str, Any]]:
        r = await self.get(path + "/records", params={"timeout": 0}, headers={"accept": accept})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == accept
        out: list[dict[str, Any]] = r.json()
        return out


@pytest.fixture
async def nodes(redis: fakeredis.FakeAsyncRedis, broker: MemoryBroker) -> AsyncIterator[Nodes]:
    settings = Settings(**{**BASE_SETTINGS, "alert_interval_ms": 0, "relay": False,
                           "start_position": "earliest", "instance_wait_ms": 0})
    async with AsyncExitStack() as stack:
        clients = []
        for i in range(2):
            app = create_app(settings, broker=broker, redis=redis)
            await stack.enter_async_context(app.router.lifespan_context(app))
            clients.append(await stack.enter_async_context(httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url=f"http://node{i}")))
        yield Nodes(clients)


def error(r: httpx.Response) -> tuple[int, int, str]:
    assert r.headers["content-type"] == V2, r.text
    body = r.json()
    assert set(body) == {"error_code", "message", "code"} and body["message"], body
    return r.status_code, body["error_code"], body["code"]


async def test_produce_json_and_binary_with_the_v2_answer(nodes: Nodes, broker: MemoryBroker) -> None:
    broker.create("t", 2)
    r = await nodes.post("/topics/t", {"records": [{"key": "k", "value": {"a": [1, 2]}},
                                                   {"value": None, "partition": 1}]}, JSON_V2)
    assert r.status_code == 200 and r.headers["content-type"] == V2, r.text
    body = r.json()
    assert body["key_schema_id"] is None and body["value_schema_id"] is None
    assert [o["error_code"] for o in body["offsets"]] == [None, None]
    assert body["offsets"][1] == {"partition": 1, "offset": 0, "error_code": None, "error": None}
    r = await nodes.post("/topics/t/partitions/0", {"records": [
        {"value": base64.b64encode(b"\x00\xff").decode()}]}, BINARY_V2)
    assert r.status_code == 200 and r.json()["offsets"][0]["partition"] == 0, r.text
    values = [rec.value for q in ("0", "1") for rec in broker.logs["t"][q].values()]
    assert b'{"a":[1,2]}' in values and None in values and b"\x00\xff" in values
    r = await nodes.post("/topics/t", {"records": [{"value": 1, "partition": 7}]}, JSON_V2)
    assert r.status_code == 200 and r.json()["offsets"][0]["error_code"] == 40402


async def test_produce_errors_in_the_v2_shape(nodes: Nodes, broker: MemoryBroker) -> None:
    broker.create("t", 1)
    assert error(await nodes.post("/topics/nope", {"records": [{"value": 1}]}, JSON_V2)) == \
        (404, 40401, "unknown_topic")
    assert error(await nodes.post("/topics/t", {"records": [{"value": 1}]}, V2))[:2] == (415, 415)
    assert error(await nodes.post("/topics/t", {"records": [{"value": 1}]},
                                  "application/vnd.kafka.avro.v2+json"))[:2] == (415, 415)
    assert error(await nodes.post("/topics/t", {"records": []}, JSON_V2)) == \
        (422, 422, "invalid_records")
    assert error(await nodes.post("/topics/t", {"records": [{"value": "%%"}]}, BINARY_V2)) == \
        (422, 422, "invalid_base64")
    r = await nodes.next().post("/topics/t", content=b"{", headers={"content-type": JSON_V2})
    assert error(r) == (400, 400, "invalid_json")


async def test_topic_metadata(nodes: Nodes, broker: MemoryBroker) -> None:
    broker.create("t", 2)
    broker.append("t", "1", "x", "y")
    r = await nodes.get("/topics")
    assert r.status_code == 200 and "t" in r.json() and r.headers["content-type"] == V2
    t = (await nodes.get("/topics/t")).json()
    assert t["name"] == "t" and t["configs"] == {} and [p["partition"] for p in t["partitions"]] == [0, 1]
    assert [p["partition"] for p in (await nodes.get("/topics/t/partitions")).json()] == [0, 1]
    assert (await nodes.get("/topics/t/partitions/1")).json()["partition"] == 1
    assert (await nodes.get("/topics/t/partitions/1/offsets")).json() == \
        {"beginning_offset": 0, "end_offset": 2}
    assert error(await nodes.get("/topics/t/partitions/5")) == (404, 40402, "unknown_partition")
    assert error(await nodes.get("/topics/nope"))[:2] == (404, 40401)


async def test_an_instance_on_two_nodes_json_produced_binary_consumed(
        nodes: Nodes, broker: MemoryBroker) -> None:
    """The flow of a REST proxy client, each call on the other node: produce as json, read as
    binary (base64 of the JSON bytes), auto-commit at the next fetch, delete."""
    broker.create("t", 2)
    r = await nodes.post("/topics/t", {"records": [{"key": "k1", "value": {"n": 1}},
                                                   {"key": "k2", "value": {"n": 2}}]}, JSON_V2)
    assert r.status_code == 200, r.text
    r = await nodes.post("/consumers/g", {"name": "i1", "format": "binary",
                                          "auto.offset.reset": "earliest"}, JSON_V2)
    assert r.status_code == 200, r.text
    assert r.json() == {"instance_id": "i1", "base_uri": "http://node0/consumers/g/instances/i1"} \
        or r.json()["base_uri"].endswith("/consumers/g/instances/i1")
    path = "/consumers/g/instances/i1"
    assert error(await nodes.post("/consumers/g", {"name": "i1"})) == (409, 40902, "instance_exists")
    assert error(await nodes.get(path + "/records"))[:2] == (409, 40903)  # not subscribed
    r = await nodes.post(path + "/subscription", {"topics": ["t"]}, JSON_V2)
    assert r.status_code == 204, r.text
    assert (await nodes.get(path + "/subscription")).json() == {"topics": ["t"]}
    got: list[dict[str, Any]] = []
    for _ in range(6):
        got += await nodes.records(path)
    assert sorted(orjson.loads(base64.b64decode(g["value"]))["n"] for g in got) == [1, 2]
    assert {base64.b64decode(g["key"]) for g in got} == {b'"k1"', b'"k2"'}
    assert all(set(g) == {"topic", "key", "value", "partition", "offset"} for g in got)
    assert error(await nodes.get(path + "/records", headers={"accept": JSON_V2}))[:2] == (406, 40601)
    r = await nodes.delete(path)
    assert r.status_code == 204
    assert error(await nodes.delete(path)) == (404, 40403, "unknown_instance")
    # auto-commit committed everything read: a new instance of the group starts after it
    await nodes.post("/consumers/g", {"name": "i2"})
    await nodes.post("/consumers/g/instances/i2/subscription", {"topics": ["t"]})
    assert await nodes.records("/consumers/g/instances/i2") == []


async def test_without_auto_commit_records_come_back_unless_committed(
        nodes: Nodes, broker: MemoryBroker, redis: fakeredis.FakeAsyncRedis) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "1", "2", "3")
    await nodes.post("/consumers/g", {"name": "a", "format": "json", "auto.commit.enable": "false"})
    path = "/consumers/g/instances/a"
    await nodes.post(path + "/subscription", {"topics": ["t"]})
    first = await nodes.records(path, JSON_V2)
    assert [g["value"] for g in first] == [1, 2, 3]
    # a commit of an offset inside the batch commits nothing; at its last record, all of it
    r = await nodes.post(path + "/offsets", {"offsets": [{"topic": "t", "partition": 0, "offset": 1}]})
    assert (r.status_code, r.content) == (200, b"")  # as Confluent's: no body
    r = await nodes.get(path + "/offsets", content=orjson.dumps(
        {"partitions": [{"topic": "t", "partition": 0}]}))
    assert r.json()["offsets"] == [{"topic": "t", "partition": 0, "offset": 0, "metadata": ""}]
    r = await nodes.post(path + "/offsets", {"offsets": [{"topic": "t", "partition": 0, "offset": 2}]})
    assert r.status_code == 200
    r = await nodes.get(path + "/offsets", content=orjson.dumps(
        {"partitions": [{"topic": "t", "partition": 0}]}))
    assert r.json()["offsets"][0]["offset"] == 3


async def test_deleting_an_instance_without_auto_commit_hands_its_batch_back(
        nodes: Nodes, broker: MemoryBroker) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "1")
    for name in ("a", "b"):
        await nodes.post("/consumers/g", {"name": name, "format": "json",
                                          "auto.commit.enable": False})
        await nodes.post(f"/consumers/g/instances/{name}/subscription", {"topics": ["t"]})
    assert len(await nodes.records("/consumers/g/instances/a", JSON_V2)) == 1
    assert await nodes.records("/consumers/g/instances/b", JSON_V2) == []  # a holds the queue
    assert (await nodes.delete("/consumers/g/instances/a")).status_code == 204
    assert [g["value"] for g in await nodes.records("/consumers/g/instances/b", JSON_V2)] == [1]


async def test_a_json_instance_refuses_a_record_that_is_not_json(
        nodes: Nodes, broker: MemoryBroker) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "not json")
    await nodes.post("/consumers/g", {"name": "a", "format": "json"})
    await nodes.post("/consumers/g/instances/a/subscription", {"topics": ["t"]})
    r = await nodes.get("/consumers/g/instances/a/records", headers={"accept": JSON_V2})
    assert error(r) == (422, 42203, "json_conversion")


@pytest.mark.parametrize("bad", [0, 4, 9])  # first, in the middle, last
@pytest.mark.parametrize("auto_commit", [True, False])
async def test_a_record_that_is_not_json_is_skipped_alone(
        nodes: Nodes, broker: MemoryBroker, bad: int, auto_commit: bool) -> None:
    """Issue 33: a batch holding one non-JSON record was answered 422, and the next auto-commit
    fetch (or a commit with no body) then committed the whole batch: the valid records after
    the bad one were never delivered. Now the records before it are answered, the bad one is a
    422 of its own, and a commit goes past it alone (docs/rest-v2.md)."""
    broker.create("t", 1)
    for i in range(10):
        broker.append("t", "0", "not json {" if i == bad else str(i))
    name = f"i{bad}{auto_commit}"
    await nodes.post("/consumers/g", {"name": name, "format": "json",
                                      "auto.commit.enable": auto_commit})
    path = f"/consumers/g/instances/{name}"
    await nodes.post(path + "/subscription", {"topics": ["t"]})
    got: list[Any] = []
    refused = 0
    for _ in range(6):
        r = await nodes.get(path + "/records", params={"timeout": 0}, headers={"accept": JSON_V2})
        if r.status_code == 422:
            assert error(r) == (422, 42203, "json_conversion") and f"offset {bad}" in r.text
            refused += 1
        else:
            assert r.status_code == 200, r.text
            got += [g["value"] for g in r.json()]
        if not auto_commit:
            c = await nodes.post(path + "/offsets")  # every batch fetched (the bad one too)
            assert c.status_code in (200, 204), c.text
    assert got == [i for i in range(10) if i != bad] and refused == 1
    committed = (await nodes.get(path + "/offsets", headers={"content-type": V2}, content=orjson.dumps(
        {"partitions": [{"topic": "t", "partition": 0}]}))).json()
    assert committed["offsets"][0]["offset"] == 10, committed


async def test_an_instance_subscribed_to_several_topics(nodes: Nodes, broker: MemoryBroker) -> None:
    broker.create("a", 1)
    broker.create("b", 1)
    broker.append("b", "0", "in-b")
    await nodes.post("/consumers/g", {"name": "i"})
    await nodes.post("/consumers/g/instances/i/subscription", {"topics": ["a", "b", "later"]})
    got = await nodes.records("/consumers/g/instances/i")
    assert [(g["topic"], base64.b64decode(g["value"])) for g in got] == [("b", b"in-b")]


async def test_instance_requests_refused_clearly(nodes: Nodes, broker: MemoryBroker) -> None:
    path = "/consumers/g/instances/x"
    assert error(await nodes.get(path + "/subscription")) == (404, 40403, "unknown_instance")
    assert error(await nodes.post("/consumers/g", {"format": "avro"}))[:2] == (422, 42204)
    assert error(await nodes.post("/consumers/g", {"nmae": "x"}))[:2] == (422, 422)
    assert error(await nodes.post("/consumers/g", {}, "text/plain"))[:2] == (415, 415)
    r = await nodes.post("/consumers/g", None)  # no body at all: a named-by-the-gateway instance
    assert r.status_code == 200 and r.json()["instance_id"].startswith("rest-consumer-")
    await nodes.post("/consumers/g", {"name": "x"})
    assert error(await nodes.post(path + "/subscription", {"topic_pattern": "a.*"}))[:2] == (422, 422)
    assert error(await nodes.get(path + "/assignments"))[:2] == (409, 40903)
    assert error(await nodes.post(path + "/positions/beginning", {"partitions": []}))[:2] == \
        (422, 422)
    assert error(await nodes.get(path + "/offsets"))[:2] == (404, 40402)
    assert error(await nodes.get(path + "/records", params={"timeout": "soon"}))[:2] == (422, 422)
    r = await nodes.next().head(path + "/records")
    assert r.status_code == 405


async def test_a_seek_moves_the_groups_committed_offsets(nodes: Nodes, broker: MemoryBroker) -> None:
    """positions/beginning after everything was read and committed: the records come again;
    positions with an offset: from there; the instance's batch of that queue is handed back."""
    broker.create("t", 1)
    broker.append("t", "0", "1", "2", "3")
    await nodes.post("/consumers/g", {"name": "a", "format": "json"})
    path = "/consumers/g/instances/a"
    await nodes.post(path + "/subscription", {"topics": ["t"]})
    assert len(await nodes.records(path, JSON_V2)) == 3
    assert await nodes.records(path, JSON_V2) == []  # auto-commit: all three committed
    r = await nodes.post(path + "/positions/beginning", {"partitions": [{"topic": "t", "partition": 0}]})
    assert r.status_code == 204, r.text
    assert [g["value"] for g in await nodes.records(path, JSON_V2)] == [1, 2, 3]
    r = await nodes.post(path + "/positions", {"offsets": [{"topic": "t", "partition": 0, "offset": 2}]})
    assert r.status_code == 204, r.text  # the pending batch (not committed yet) is handed back
    assert [g["value"] for g in await nodes.records(path, JSON_V2)] == [3]
    r = await nodes.post(path + "/positions", {"offsets": [{"topic": "t", "partition": 0, "offset": 9}]})
    assert error(r)[:2] == (422, 422)


async def test_over_the_rate_limit_records_answer_429_with_retry_after(
        nodes: Nodes, broker: MemoryBroker, redis: fakeredis.FakeAsyncRedis) -> None:
    broker.create("t", 1)
    broker.append("t", "0", *[str(i) for i in range(20)])
    r = await nodes.next().patch("/admin/consumers/g", json={"rateLimit": {
        "messagesPerSecond": 1, "burst": 1}})
    assert r.status_code == 200, r.text
    await nodes.post("/consumers/g", {"name": "i", "format": "json"})
    await nodes.post("/consumers/g/instances/i/subscription", {"topics": ["t"]})
    assert len(await nodes.records("/consumers/g/instances/i", JSON_V2)) == 1
    r = await nodes.get("/consumers/g/instances/i/records", params={"timeout": 0},
                        headers={"accept": JSON_V2})
    assert error(r) == (429, 42901, "rate_limited") and int(r.headers["retry-after"]) >= 1


async def test_brokers_and_the_routers_errors_in_the_v2_shape(nodes: Nodes, broker: MemoryBroker) -> None:
    """``GET /brokers`` (Confluent's clients call it) lists the broker ids; a path or a method
    the v2 API does not have answers in the v2 shape under a v2 path, in the native one
    elsewhere."""
    broker.create("t", 2)
    r = await nodes.get("/brokers")
    assert r.status_code == 200 and r.headers["content-type"] == V2
    assert isinstance(r.json()["brokers"], list)
    r = await nodes.next().put("/topics/t", content=b"{}")
    assert error(r)[:2] == (405, 405)
    assert error(await nodes.get("/topics/t/nope"))[:2] == (404, 404)
    assert error(await nodes.get("/consumers/g/instances/i/nope"))[:2] == (404, 404)
    native = await nodes.get("/no/such/path")
    assert native.status_code == 404 and native.json()["error"]["code"] == "not_found"
