"""Bad input gets a 4xx with a machine-readable code; nothing gives a 500 or hangs."""

from __future__ import annotations

import base64
import random
import string

import httpx
import pytest

from ..support import Api, unique


@pytest.fixture(scope="module")
def topic(make_topic_module) -> str:
    return make_topic_module


@pytest.fixture(scope="module")
def make_topic_module(bootstrap: str) -> str:
    from gateway.cli import devstack

    name = unique("errors")
    devstack.create_topic(bootstrap, name, 2)
    return name


def expect(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.json()["error"]["code"] == code, r.text


def test_message_parameter_errors(api: Api, topic: str) -> None:
    g = unique()
    cases = [
        ({"topic": topic}, 400, "missing_consumer"),
        ({"consumer": g}, 400, "missing_topic"),
        ({"consumer": g, "topic": "no-such-topic-" + unique()}, 404, "unknown_topic"),
        ({"consumer": g, "topic": "bad topic!"}, 400, "invalid_topic"),
        ({"consumer": "bad:group", "topic": topic}, 400, "invalid_consumer"),
        ({"consumer": g, "topic": topic, "clientId": "{x}"}, 400, "invalid_client_id"),
        ({"consumer": g, "topic": topic, "max": 0}, 400, "invalid_max"),
        ({"consumer": g, "topic": topic, "max": 1001}, 400, "invalid_max"),
        ({"consumer": g, "topic": topic, "max": "ten"}, 400, "invalid_max"),
        ({"consumer": g, "topic": topic, "wait_ms": -1}, 400, "invalid_wait_ms"),
        ({"consumer": g, "topic": topic, "wait_ms": 30001}, 400, "invalid_wait_ms"),
        ({"consumer": g, "topic": topic, "max_bytes": 0}, 400, "invalid_max_bytes"),
        ({"consumer": g, "topic": topic, "max_bytes": 2**31}, 400, "invalid_max_bytes"),
        ({"consumer": g, "topic": topic, "encoding": "latin1"}, 400, "invalid_encoding"),
        ({"consumer": g, "topic": topic, "requestId": "forged"}, 400, "invalid_request_id"),
    ]
    for params, status, code in cases:
        expect(api.message(**params), status, code)
        expect(api.http.post(api.url("/message"), json=params), status, code)


def test_forged_and_altered_request_ids(api: Api, topic: str) -> None:
    g = unique()
    api.config(g, start="earliest")
    api.produce(topic, ["f1"], partition=0)
    body = api.message(consumer=g, topic=topic).json()
    rid = body["requestId"]
    raw = bytearray(base64.urlsafe_b64decode(rid + "=" * (-len(rid) % 4)))
    raw[10] ^= 0x20  # flip one bit of the payload
    altered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    for bad in (altered, rid[:-2], rid + "A", "x" * 40):
        for path in ("/ack", "/unlock"):
            expect(api.http.post(api.url(path), json={"requestId": bad}), 400, "invalid_request_id")
    expect(api.http.post(api.url("/ack"), json={}), 400, "missing_request_id")
    for bad in (5, 0, False, []):
        expect(api.http.post(api.url("/ack"), json={"requestId": bad}), 400, "invalid_request_id")
        expect(api.http.post(api.url("/message"), json={"consumer": g, "topic": topic, "requestId": bad}),
               400, "invalid_request_id")
    assert api.ack(rid).json()["result"] == "committed"


def test_produce_errors(api: Api, topic: str) -> None:
    url = api.url("/produce")
    cases = [
        ({"messages": [{"value": "x"}]}, 400, "missing_topic"),
        ({"topic": "missing-" + unique(), "value": "x"}, 404, "unknown_topic"),
        ({"topic": topic}, 400, "missing_value"),
        ({"topic": topic, "messages": []}, 400, "invalid_messages"),
        ({"topic": topic, "messages": "x"}, 400, "invalid_messages"),
        ({"topic": topic, "messages": [5]}, 400, "invalid_message"),
        ({"topic": topic, "value": "!!!", "encoding": "base64"}, 400, "invalid_base64"),
        ({"topic": topic, "messages": [{"value": "x", "key": "%%%", "encoding": "base64"}]}, 400,
         "invalid_base64"),
        ({"topic": topic, "value": 5}, 400, "invalid_value"),
        ({"topic": topic, "value": "x", "partition": -1}, 400, "invalid_partition"),
        ({"topic": topic, "value": "x", "partition": "1"}, 400, "invalid_partition"),
        ({"topic": topic, "value": "x", "timestamp": "now"}, 400, "invalid_timestamp"),
        # wider than Kafka's int64 / int32 fields: refused before any record of the batch is sent
        ({"topic": topic, "messages": [{"value": "a"}, {"value": "b", "timestamp": 2**63}]}, 400,
         "invalid_timestamp"),
        ({"topic": topic, "messages": [{"value": "a"}, {"value": "b", "partition": 2**31}]}, 400,
         "invalid_partition"),
        ({"topic": topic, "value": "x", "headers": "h"}, 400, "invalid_headers"),
        ({"topic": topic, "value": "x", "headers": [["h"]]}, 400, "invalid_headers"),
        ({"topic": topic, "value": "x", "headers": {f"h{i}": "v" for i in range(65)}}, 413,
         "too_many_headers"),
        ({"topic": topic, "value": "x", "delay": 5}, 400, "unknown_field"),
        ({"topic": topic, "messages": [{"value": "x"}] * 10_001}, 413, "too_many_messages"),
        ([1, 2], 400, "invalid_body"),
    ]
    for body, status, code in cases:
        expect(api.http.post(url, json=body), status, code)
    expect(api.http.post(url, content=b"{not json"), 400, "invalid_json")
    # a partition that does not exist fails alone; the others are written
    r = api.http.post(url, json={"topic": topic, "messages": [{"value": "ok"},
                                                               {"value": "x", "partition": 7}]})
    assert r.status_code == 200 and r.json()["failed"] == 1
    assert r.json()["results"][1]["error"]["code"] == "unknown_partition"
    assert r.json()["results"][0]["offset"] >= 0


def test_oversized_body_is_413(api: Api, topic: str) -> None:
    big = "x" * (9 * 1024 * 1024)
    expect(api.http.post(api.url("/produce"), json={"topic": topic, "value": big}), 413, "body_too_large")

    def chunks():  # no content-length: the limit applies while streaming
        for _ in range(10):
            yield b"x" * (1024 * 1024)
    expect(api.http.post(api.url("/produce"), content=chunks()), 413, "body_too_large")


def test_ack_unknown_queue_and_routes(api: Api, topic: str) -> None:
    expect(api.http.get(api.url("/nope")), 404, "not_found")
    expect(api.http.delete(api.url("/produce")), 405, "method_not_allowed")
    expect(api.http.patch(api.url(f"/admin/consumers/{unique()}"), json={"start": "middle"}), 400,
           "invalid_start")
    expect(api.http.patch(api.url(f"/admin/consumers/{unique()}"), json={"consumeTimeoutMs": 5}), 400,
           "invalid_consume_timeout_ms")
    expect(api.http.patch(api.url(f"/admin/consumers/{unique()}"), json={"consumeTimeoutMs": "1"}), 400,
           "invalid_consume_timeout_ms")
    expect(api.http.patch(api.url(f"/admin/consumers/{unique()}"), json={"x": 1}), 400, "unknown_field")
    expect(api.http.put(api.url(f"/admin/consumers/{unique()}"), json={"mode": "cluster"}), 400,
           "missing_topics")
    expect(api.http.get(api.url("/consumers/bad:name/queues")), 400, "invalid_consumer")
    expect(api.http.post(api.url(f"/admin/consumers/{unique()}/reset"),
                         json={"topic": topic, "to": "timestamp", "timestamp": 2**63}), 400,
           "invalid_timestamp")


def test_head_on_message_does_not_lock_a_queue(api: Api, make_topic, rds) -> None:
    """starlette answers HEAD on GET routes; on /message that would lock and drop a batch."""
    topic, g = make_topic(1), unique("g")  # own topic: "kept" is its only record
    api.http.patch(api.url(f"/admin/consumers/{g}"), json={"start": "earliest"}).raise_for_status()
    api.http.post(api.url("/produce"), json={"topic": topic, "value": "kept"}).raise_for_status()
    r = api.http.head(api.url("/message"), params={"consumer": g, "topic": topic})
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    assert not rds.exists(f"mqgw:{{{g}}}:q")  # nothing was locked (nor even looked at)
    body = api.http.get(api.url("/message"), params={"consumer": g, "topic": topic, "max": 1000,
                                                      "wait_ms": 5000}).json()
    assert [m["value"] for m in body["messages"]] == ["kept"]


def test_random_garbage_never_gives_500(api: Api, topic: str) -> None:
    rnd = random.Random(7)
    alphabet = string.printable + "\u00e9\u4e2d\x00"

    def junk() -> object:
        kind = rnd.randrange(6)
        if kind == 0:
            return "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(20)))
        if kind == 1:
            return rnd.randrange(-10**12, 10**12)
        if kind == 2:
            return [junk() for _ in range(rnd.randrange(3))]
        if kind == 3:
            return {"".join(rnd.choice(string.ascii_letters) for _ in range(3)): junk()}
        if kind == 4:
            return None
        return rnd.random()

    fields = ["topic", "consumer", "clientId", "max", "wait_ms", "requestId", "encoding", "value",
              "key", "headers", "partition", "messages", "timestamp"]
    for _ in range(300):
        body = {f: junk() for f in rnd.sample(fields, rnd.randrange(1, 6))}
        if rnd.random() < 0.5:
            body["topic"] = topic
        body.pop("wait_ms", None)
        for path in ("/produce", "/message", "/ack", "/unlock"):
            r = api.http.post(api.url(path), json=body)
            assert r.status_code < 500, (path, body, r.text)
            if r.status_code >= 400:
                assert isinstance(r.json()["error"]["code"], str)


@pytest.mark.timeout(60)
def test_a_read_only_redis_is_503_not_500(bootstrap: str, tmp_path, topic: str) -> None:
    """A failover in progress (the node's Redis became a replica) is "retry shortly", like an
    unreachable Redis, never an internal error."""
    import redis as sync_redis

    from gateway.cli import devstack

    from ..support import start_node

    r = devstack.start_redis()
    node = None
    try:
        url = r.extra["url"]
        with sync_redis.Redis.from_url(url) as c:  # a replica of a master that is not there
            c.execute_command("REPLICAOF", "127.0.0.1", str(devstack.free_port()))
        node = start_node(url, bootstrap, tmp_path)
        got = httpx.get(f"{node.url}/message", params={"consumer": unique(), "topic": topic}, timeout=10)
        expect(got, 503, "unavailable")
        assert got.headers["retry-after"] == "1"
    finally:
        if node is not None:
            node.stop()
        r.stop()


@pytest.mark.timeout(60)
def test_auth_with_the_public_hmac_key_refuses_to_start(redis_url: str, bootstrap: str, tmp_path) -> None:
    from gateway.config import DEV_HMAC_KEY

    from ..support import start_node

    try:
        node = start_node(redis_url, bootstrap, tmp_path, auth="true", hmac_key=DEV_HMAC_KEY)
    except RuntimeError as e:
        assert "MQGW_HMAC_KEY is the public default" in str(e)
    else:
        node.stop()
        pytest.fail("a node with auth on started with the public HMAC key")
