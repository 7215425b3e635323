"""openapi.yaml describes the running gateway: every route, every status, every response body.

The document itself is checked (OpenAPI 3.1, every ``$ref`` resolves, every schema is a valid
JSON Schema of the OAS 3.1 dialect, every example matches its schema, the security declarations
cover every operation but the open ones), its paths are compared with the routes of the app
``gateway.api.app.create_app`` builds, both ways, and then real requests go through real gateway
processes (conftest's cluster: uvicorn + redis-server + the broker): each response's status
must be documented for its operation and its body must validate against the declared schema.

Most requests go to the shared cluster, which runs in open mode with auth off. The statuses
that need API keys and a closed registry (401, 403, the registry's 400s) come from one extra
node with ``auth=true`` and ``open_mode=false`` and a key prefix of its own, whose first admin
key is written to Redis with ``KeyStore.create``, as an operator would bootstrap it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio as aioredis
from starlette.routing import Route

from gateway.api.app import create_app
from gateway.cli import devstack
from gateway.config import Settings
from gateway.core.auth import KeyStore
from gateway.core.delay import DelayIds
from gateway.core.requestid import BatchRef, RequestIdCodec
from gateway.store import OffsetStore

from ..support import HMAC_KEY, ON_TANSU, Api, Node, start_node, unique
from ..support.openapi import (
    BROKER_ONLY_OPERATIONS,
    DRIVERS_DONE,
    EXERCISED,
    OAS31_DIALECT,
    OPEN_OPERATIONS,
    REGISTRY,
    SPEC,
    SPEC_URI,
    OAS31Validator,
    assert_valid,
    check,
    check_query,
    check_request_body,
    deref,
    esc,
    lookup,
    operations,
    sample_path,
    security_of,
    validator_at,
)

pytestmark = pytest.mark.timeout(60)

#: The REST v2 routes (gateway/api/v2.py): an instance's path, and a json produce's header.
V2_I = "/consumers/{group}/instances/{instance}"
V2_JSON = {"content-type": "application/vnd.kafka.json.v2+json"}


# -- small clients ------------------------------------------------------------------------------------

def call(api: Api, method: str, path: str, template: str | None = None, status: int | None = None,
         code: str | None = None, **kw: Any) -> Any:
    r = api.http.request(method, api.url(path), **kw)
    return check(r, template or path, status, code)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def configure(api: Api, group: str, values: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    """PATCH a consumer's settings (open mode: also for an unregistered consumer)."""
    check_request_body(values, "/admin/consumers/{consumer}", "patch")
    body = call(api, "PATCH", f"/admin/consumers/{group}", "/admin/consumers/{consumer}", 200,
                json=values, headers=headers)
    for k, v in values.items():
        if v is not None and not isinstance(v, dict):  # objects come back with defaults filled in
            assert body[k] == v, (k, body)
    return body


def register_consumer(api: Api, group: str, values: dict[str, Any], status: int,
                      headers: dict[str, str] | None = None) -> dict[str, Any]:
    check_request_body(values, "/admin/consumers/{consumer}", "put")
    body = call(api, "PUT", f"/admin/consumers/{group}", "/admin/consumers/{consumer}", status,
                json=values, headers=headers)
    assert body["consumer"] == group and body["registered"] is True
    assert body["topics"] == sorted(set(values["topics"]))
    return body


def register_producer(api: Api, name: str, topics: list[str], status: int,
                      headers: dict[str, str] | None = None) -> dict[str, Any]:
    check_request_body({"topics": topics}, "/admin/producers/{name}", "put")
    body = call(api, "PUT", f"/admin/producers/{name}", "/admin/producers/{name}", status,
                json={"topics": topics}, headers=headers)
    assert body["producer"] == name and body["topics"] == sorted(set(topics))
    return body


def produce(api: Api, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    check_request_body(body, "/produce", "post")
    out = call(api, "POST", "/produce", status=200, json=body, headers=headers)
    assert out["failed"] == 0, out
    return out


def fetch(api: Api, headers: dict[str, str] | None = None, status: int = 200, **params: Any) -> dict[str, Any]:
    check_query(params, "/message", "get")
    r = api.http.get(api.url("/message"), params=params, headers=headers)
    return check(r, "/message", status)


def fetch_ok(api: Api, headers: dict[str, str] | None = None, **params: Any) -> dict[str, Any]:
    params.setdefault("wait_ms", 5000)
    body = fetch(api, headers, **params)
    assert body["status"] == "ok", body
    return body


def ack(api: Api, rid: str, status: int = 200, headers: dict[str, str] | None = None) -> dict[str, Any]:
    check_request_body({"requestId": rid}, "/ack", "post")
    return call(api, "POST", "/ack", status=status, json={"requestId": rid}, headers=headers)


def extend(api: Api, rid: str, status: int = 200, headers: dict[str, str] | None = None) -> dict[str, Any]:
    check_request_body({"requestId": rid}, "/extend", "post")
    return call(api, "POST", "/extend", status=status, json={"requestId": rid}, headers=headers)


def unlock(api: Api, rid: str, status: int = 200, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return call(api, "POST", "/unlock", status=status, json={"requestId": rid}, headers=headers)


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def forge(rid: str) -> str:
    """The same requestId with one character in the middle changed."""
    i = len(rid) // 2
    return rid[:i] + ("A" if rid[i] != "A" else "B") + rid[i + 1:]


def route_pairs() -> set[tuple[str, str]]:
    """(path template, method) of every route of the app the gateway serves."""
    out = set()
    for r in create_app(Settings()).routes:  # building the app connects to nothing
        assert isinstance(r, Route), f"not a plain route, check it by hand: {r!r}"
        path = re.sub(r"\{([^}:]+)(?::[^}]+)?\}", r"{\1}", r.path)  # drop starlette converters
        for m in r.methods or ():
            if m != "HEAD":  # starlette adds HEAD to every GET route by itself
                out.add((path, m.lower()))
    return out


def create_key(redis_url: str, prefix: str, name: str, **grants: Any) -> tuple[str, str]:
    """Write an API key straight into Redis (how the first admin key is bootstrapped): (key, id)."""
    async def go() -> tuple[str, str]:
        r = aioredis.Redis.from_url(redis_url)
        try:
            key, rec = await KeyStore(OffsetStore(r, prefix)).create(name, **grants)
        finally:
            await r.aclose()
        return key, rec.id
    return asyncio.run(go())


# -- fixtures -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_topic(bootstrap: str) -> str:
    name = f"oa-{uuid.uuid4().hex[:10]}"
    devstack.create_topic(bootstrap, name, 2)
    return name


@pytest.fixture(scope="module")
def other_topic(bootstrap: str) -> str:
    name = f"oa-{uuid.uuid4().hex[:10]}"
    devstack.create_topic(bootstrap, name, 1)
    return name


@dataclass
class Secured:
    """A gateway node with auth on and open mode off, in a key prefix of its own."""

    api: Api
    prefix: str
    admin_key: str  # bootstrapped straight into Redis
    admin: dict[str, str]  # headers with it


@pytest.fixture(scope="module")
def secured(redis_url: str, bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    prefix = unique("oa")
    node = start_node(redis_url, bootstrap, tmp_path_factory.mktemp("secured"), auth="true",
                      open_mode="false", key_prefix=prefix)
    api = Api([node.url])
    try:
        key, _ = create_key(redis_url, prefix, "bootstrap-admin", admin=True)
        yield Secured(api, prefix, key, bearer(key))
    finally:
        api.http.close()
        node.stop()


@pytest.fixture
def done(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Call at the end of a request-driving test: it ran through (for the coverage check)."""
    return lambda: DRIVERS_DONE.add(request.node.originalname)


# =========================================================================================
# The document
# =========================================================================================

def test_document_is_openapi_31() -> None:
    assert str(SPEC["openapi"]).startswith("3.1."), SPEC["openapi"]
    assert SPEC.get("jsonSchemaDialect", OAS31_DIALECT) == OAS31_DIALECT
    assert SPEC["info"]["title"] and SPEC["info"]["version"]
    op_ids = [op["operationId"] for _, _, op in operations()]
    assert len(op_ids) == len(set(op_ids)), "operationIds must be unique"
    for path, method, op in operations():
        assert op.get("responses"), f"{method} {path} documents no response"
        assert op.get("summary") and op.get("description"), f"{method} {path} needs a summary and description"
        for st, resp in op["responses"].items():
            assert re.fullmatch(r"[1-5]\d\d", st), f"{method} {path}: status {st}"
            resp, _ = deref(resp, "")
            assert resp.get("description"), f"{method} {path} {st} has no description"
            for ctype, media in (resp.get("content") or {}).items():
                assert "schema" in media, f"{method} {path} {st} {ctype} has no schema"
        # path parameters are declared exactly as the template names them
        names = set(re.findall(r"\{([^}]+)\}", path))
        declared = {deref(p, "")[0]["name"] for p in op.get("parameters", [])
                    if deref(p, "")[0]["in"] == "path"}
        assert names == declared, f"{method} {path}: path parameters {declared} != {names}"


def _walk(node: Any, pointer: str = "") -> Iterator[tuple[str, Any]]:
    yield pointer, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{pointer}/{esc(k)}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{pointer}/{i}")


def test_every_ref_resolves_and_every_schema_is_valid() -> None:
    resolver = REGISTRY.resolver(SPEC_URI)
    refs = 0
    for _pointer, node in _walk(SPEC):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            resolver.lookup(node["$ref"])  # raises when it points nowhere
            refs += 1
    assert refs > 20
    schemas = [f"/components/schemas/{esc(n)}" for n in SPEC["components"]["schemas"]]
    for pointer, node in _walk(SPEC):
        if pointer.endswith("/schema") and "/components/schemas/" not in pointer and isinstance(node, dict):
            schemas.append(pointer)
    for pointer in schemas:
        OAS31Validator.check_schema(lookup(pointer))
        validator_at(pointer)  # builds: refs inside resolve


def test_examples_match_their_schemas() -> None:
    checked = 0
    for pointer, node in _walk(SPEC):
        if not (isinstance(node, dict) and "schema" in node):
            continue
        if "example" in node:
            assert_valid(node["example"], f"{pointer}/schema", f"example at #{pointer}")
            checked += 1
        for name, ex in (node.get("examples") or {}).items():
            if isinstance(ex, dict) and "value" in ex:
                assert_valid(ex["value"], f"{pointer}/schema", f"example {name} at #{pointer}")
                checked += 1
    assert checked >= 8


def test_security_is_declared() -> None:
    """A bearer scheme applies to everything but the open endpoints, and every operation that
    needs a key documents 401 (with WWW-Authenticate) and 403."""
    schemes = SPEC["components"]["securitySchemes"]
    assert any(s["type"] == "http" and s["scheme"].lower() == "bearer" for s in schemes.values())
    assert SPEC["security"], "security must apply globally"
    for requirement in SPEC["security"]:
        assert set(requirement) <= set(schemes), requirement
    for path, method, op in operations():
        sec = security_of(op)
        if (path, method) in OPEN_OPERATIONS:
            assert sec == [], f"{method} {path} is open: it needs 'security: []'"
            assert "401" not in op["responses"] and "403" not in op["responses"]
            continue
        assert sec and all(set(r) <= set(schemes) for r in sec), f"{method} {path}: {sec}"
        for st in ("401", "403"):
            assert st in op["responses"], f"{method} {path} needs a key but does not document {st}"
        unauthorized, _ = deref(op["responses"]["401"], "")
        assert "WWW-Authenticate" in unauthorized.get("headers", {}), f"{method} {path} 401"


def test_every_route_is_documented_and_nothing_else() -> None:
    in_app = route_pairs()
    in_spec = {(path, method) for path, method, _ in operations()}
    assert in_app - in_spec == set(), f"routes missing from openapi.yaml: {sorted(in_app - in_spec)}"
    assert in_spec - in_app == set(), f"documented operations the app lacks: {sorted(in_spec - in_app)}"


# =========================================================================================
# Live requests
# =========================================================================================

def test_operational_endpoints(api: Api, done: Callable[[], None]) -> None:
    assert call(api, "GET", "/healthz", status=200) == {"status": "ok"}
    ready = call(api, "GET", "/readyz", status=200)
    assert ready == {"status": "ok", "checks": {"redis": True, "broker": True}}
    doc = call(api, "GET", "/openapi.yaml", status=200)  # parsed: a YAML mapping
    assert doc == SPEC, "the gateway serves another document than openapi.yaml"
    metrics = call(api, "GET", "/metrics", status=200)
    assert "# TYPE mqgw_requests_total counter" in metrics
    assert "<title>mq-gateway console</title>" in call(api, "GET", "/console", status=200)
    assert "use strict" in call(api, "GET", "/console/console.js", "/console/{asset}", 200)
    assert ":root" in call(api, "GET", "/console/console.css", "/console/{asset}", 200)
    call(api, "GET", "/console/..%2Fopenapi.yaml", "/console/{asset}", 404, "not_found")
    done()


def test_produce_fetch_ack_empty(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    call(api, "GET", f"/admin/consumers/{g}", "/admin/consumers/{consumer}", 404, "unknown_consumer")
    configure(api, g, {"start": "earliest"})
    view = call(api, "GET", f"/admin/consumers/{g}", "/admin/consumers/{consumer}", 200)
    assert (view["consumer"], view["registered"], view["start"], view["topics"]) == (g, False, "earliest", None)

    one = produce(api, {"topic": topic, "key": "k-1", "value": "hello", "headers": {"h": "v"}})
    assert one["topic"] == topic and len(one["results"]) == 1 and one["results"][0]["partition"] == 0
    batch = produce(api, {"topic": topic, "messages": [
        {"value": "second", "headers": [["dup", "a"], ["dup", "b"]]},
        {"value": b64(b"\xff\xfe not utf-8"), "key": b64(b"kk"), "encoding": "base64"},
        {"value": None, "key": "tombstone", "partition": 0, "timestamp": 1_700_000_000_000},
    ]})
    offsets = [one["results"][0]["offset"]] + [r["offset"] for r in batch["results"]]
    assert offsets == list(range(offsets[0], offsets[0] + 4))

    # a batch, acked with /ack, then the same ack again
    first = fetch_ok(api, consumer=g, topic=topic, max=2)
    assert first["queue"] == "0" and first["offset"] == 0 and first["redelivered"] is False
    assert first["nextOffset"] == first["messages"][-1]["offset"] + 1
    assert first["lockTimeoutMs"] == 60_000 and first["backlog"] >= len(first["messages"])
    msgs = list(first["messages"])
    r = ack(api, first["requestId"])
    assert r["result"] == "committed" and r["lock"] == "held" and r["committedOffset"] == first["nextOffset"]
    r = ack(api, first["requestId"])
    assert r["result"] == "already_committed" and "lock" not in r

    # the rest, each batch acked by piggy-backing its requestId on the next fetch
    rid = ""
    deadline = time.monotonic() + 20
    while len(msgs) < 4 and time.monotonic() < deadline:
        body = fetch(api, consumer=g, topic=topic, max=2, wait_ms=2000, **({"requestId": rid} if rid else {}))
        if rid:
            assert body["ack"]["result"] == "committed", body
        rid = ""
        if body["status"] == "ok":
            msgs += body["messages"]
            rid = body["requestId"]
    assert len(msgs) == 4, msgs
    m0, m1, m2, m3 = msgs
    assert (m0["key"], m0["value"], m0["headers"], m0["encoding"]) == ("k-1", "hello", [["h", "v"]], "utf8")
    assert m0["timestamp"] > 1_600_000_000_000
    assert (m1["key"], m1["value"], m1["headers"]) == (None, "second", [["dup", "a"], ["dup", "b"]])
    # not UTF-8: this record alone falls back to base64
    assert (m2["encoding"], m2["value"], m2["key"]) == ("base64", b64(b"\xff\xfe not utf-8"), b64(b"kk"))
    assert (m3["encoding"], m3["key"], m3["value"]) == ("utf8", "tombstone", None)
    assert m3["timestamp"] == 1_700_000_000_000

    # an empty fetch that still carries the piggy-backed ack, then one without, then a long poll
    body = fetch(api, consumer=g, topic=topic, requestId=rid)
    assert body["status"] == "empty" and body["messages"] == [] and body["ack"]["result"] == "committed"
    body = fetch(api, consumer=g, topic=topic, requestId=rid)
    assert body["status"] == "empty" and body["ack"]["result"] == "already_committed"
    t0 = time.monotonic()
    assert fetch(api, consumer=g, topic=topic, wait_ms=300) == {"status": "empty", "topic": topic, "messages": []}
    assert time.monotonic() - t0 >= 0.25

    # the cluster-mode queue view
    view = call(api, "GET", f"/consumers/{g}/queues", "/consumers/{consumer}/queues", 200)
    assert view["consumer"] == g and view["clientId"] is None and view["consumeTimeoutMs"] == 60_000
    (q,) = view["queues"]
    assert (q["topic"], q["queue"], q["committedOffset"], q["backlog"], q["locked"]) == (topic, "0", 4, 0, False)
    assert q["lockAgeMs"] is None and q["lastAccessMs"] is not None and q["lockToken"] >= 2

    # a piggy-backed requestId of another consumer or a forged one fails the whole request
    other = unique()
    call(api, "GET", "/message", status=400, code="request_id_mismatch",
         params={"consumer": other, "topic": topic, "requestId": rid})
    call(api, "GET", "/message", status=400, code="invalid_request_id",
         params={"consumer": g, "topic": topic, "requestId": forge(rid)})
    call(api, "POST", "/ack", status=400, code="invalid_request_id", json={"requestId": forge(rid)})
    call(api, "POST", "/unlock", status=400, code="invalid_request_id", json={"requestId": forge(rid)})
    done()


def test_extend_on_any_node_and_its_refusals(
        node_factory: Callable[..., Any], make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    """/extend through the other node than the fetch's, then its 409 shapes. That an extended
    lock outlives its first timeout is proven on a test clock (tests/unit/test_consume.py), with
    no sleep here."""
    nodes = [node_factory(consume_timeout_ms=7000) for _ in range(2)]
    a, b = Api([nodes[0].url]), Api([nodes[1].url])
    topic, g = make_topic(1), unique()
    configure(a, g, {"start": "earliest"})
    produce(a, {"topic": topic, "messages": [{"value": "slow"}]})
    first = fetch_ok(a, None, consumer=g, topic=topic)
    body = extend(b, first["requestId"])  # the requestId says it all: any node
    assert (body["result"], body["lockTimeoutMs"], body["committedOffset"]) == ("extended", 7000, first["offset"])
    assert ack(b, first["requestId"])["result"] == "committed"
    gone = extend(a, first["requestId"], status=409)
    assert gone["result"] == gone["error"]["code"] == "already_committed"
    produce(a, {"topic": topic, "messages": [{"value": "lost"}]})
    held = fetch_ok(a, None, consumer=g, topic=topic)
    assert unlock(a, held["requestId"])["result"] == "unlocked"
    handed_back = extend(b, held["requestId"], status=409)
    assert handed_back["result"] == handed_back["error"]["code"] == "not_locked"
    again = fetch_ok(b, None, consumer=g, topic=topic)  # redelivered at once after the unlock
    lost = extend(a, held["requestId"], status=409)
    assert lost["result"] == lost["error"]["code"] == "lock_lost"
    assert ack(b, again["requestId"])["result"] == "committed"
    call(a, "POST", "/extend", status=400, code="invalid_request_id", json={"requestId": forge(held["requestId"])})
    done()


def test_max_bytes_ends_the_batch_and_the_ack_commits_up_to_there(
        api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    configure(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": v * 10} for v in "abc"]})
    q = {"consumer": g, "topic": topic, "wait_ms": 5000}
    body = call(api, "GET", "/message", status=200, params={**q, "max_bytes": 15})
    assert [m["value"] for m in body["messages"]] == ["a" * 10] and body["nextOffset"] == body["offset"] + 1
    ack = call(api, "POST", "/ack", status=200, params={"requestId": body["requestId"]})
    assert ack["committedOffset"] == body["nextOffset"]
    body = call(api, "POST", "/message", status=200, json={**q, "max_bytes": 25})
    assert [m["value"] for m in body["messages"]] == ["b" * 10, "c" * 10]
    done()


def test_post_message_and_base64(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    configure(api, g, {"start": "earliest", "consumeTimeoutMs": 5000})
    produce(api, {"topic": topic, "messages": [{"value": "dGV4dA==", "key": "AAE=",
                                                "headers": [["x", "eQ=="]]}], "encoding": "base64"})
    req = {"consumer": g, "topic": topic, "max": 10, "wait_ms": 5000, "encoding": "base64"}
    check_request_body(req, "/message", "post")
    body = call(api, "POST", "/message", status=200, json=req)
    assert body["status"] == "ok" and body["lockTimeoutMs"] == 5000
    (m,) = body["messages"]
    assert (m["encoding"], m["value"], m["key"], m["headers"]) == ("base64", "dGV4dA==", "AAE=", [["x", "eQ=="]])
    # query parameters work for POST too, and the ack can ride along in the body
    body = call(api, "POST", "/message", status=200, params={"consumer": g, "topic": topic},
                json={"requestId": body["requestId"]})
    assert body["status"] == "empty" and body["ack"]["result"] == "committed"
    assert call(api, "POST", "/message", status=200, params={"consumer": g, "topic": topic})["status"] == "empty"
    done()


def test_unlock_lock_lost_redelivery(api: Api, make_topic: Callable[..., str], rds: redis.Redis,
                                     done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    configure(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": f"m{i}"} for i in range(10)]})

    a = fetch_ok(api, consumer=g, topic=topic, max=2,
                 headers={"X-Forwarded-For": "203.0.113.7, 10.0.0.1"})
    assert fetch(api, consumer=g, topic=topic, max=2)["status"] == "empty"  # the only queue is locked
    (q,) = call(api, "GET", f"/consumers/{g}/queues", "/consumers/{consumer}/queues", 200)["queues"]
    assert q["locked"] is True and isinstance(q["lockAgeMs"], int) and q["lastClientAddress"] == "203.0.113.7"

    u = unlock(api, a["requestId"])
    assert u == {"result": "unlocked", "committedOffset": 0}
    assert unlock(api, a["requestId"]) == {"result": "not_locked", "committedOffset": 0}
    b = fetch_ok(api, consumer=g, topic=topic, max=2)  # handed back: delivered again at once
    # handed out before: flagged (issue 33)
    assert b["offset"] == 0 and b["messages"] == a["messages"] and b["redelivered"] is True
    r = ack(api, a["requestId"], 409)  # b holds the queue now
    assert r["result"] == "lock_lost" and r["error"]["code"] == "lock_lost" and r["committedOffset"] == 0
    assert unlock(api, a["requestId"], 409)["result"] == "lock_lost"

    # a lock that times out is taken over: the batch is redelivered, the old holder's ack loses
    configure(api, g, {"consumeTimeoutMs": 100})
    time.sleep(0.3)
    c = fetch_ok(api, consumer=g, topic=topic, max=2)
    assert c["offset"] == 0 and c["redelivered"] is True and c["lockTimeoutMs"] == 100
    assert ack(api, b["requestId"], 409)["result"] == "lock_lost"
    time.sleep(0.3)  # c's lock expires too, but nobody takes the queue: a late ack still counts
    r = ack(api, c["requestId"])
    assert (r["result"], r["lock"], r["committedOffset"]) == ("committed", "expired", c["nextOffset"])

    # an ack after an unlock still commits when nobody fetched in between
    configure(api, g, {"consumeTimeoutMs": 60_000})
    d = fetch_ok(api, consumer=g, topic=topic, max=2)
    assert d["offset"] == c["nextOffset"]
    assert unlock(api, d["requestId"])["result"] == "unlocked"
    r = ack(api, d["requestId"])
    assert (r["result"], r["lock"]) == ("committed", "released")

    # an offset reset while a batch is out: offset_mismatch
    e = fetch_ok(api, consumer=g, topic=topic, max=3)
    assert len(e["messages"]) >= 2, e
    key = f"{Settings.load().key_prefix}:{{{g}}}:q"
    assert rds.hget(key, f"{topic}:0:com") == str(e["offset"]).encode()
    rds.hset(key, f"{topic}:0:com", e["offset"] + 1)
    r = ack(api, e["requestId"], 409)
    assert (r["result"], r["error"]["code"], r["committedOffset"]) == ("offset_mismatch", "offset_mismatch", e["offset"] + 1)

    # the consumer's queues are gone: unknown -> 404 unknown_queue
    rds.delete(key)
    r = ack(api, e["requestId"], 404)
    assert (r["result"], r["committedOffset"], r["error"]["code"]) == ("unknown", -1, "unknown_queue")
    r = unlock(api, e["requestId"], 404)
    assert (r["result"], r["committedOffset"], r["error"]["code"]) == ("unknown", -1, "unknown_queue")
    # and a well-signed requestId of a consumer that never existed, sent as a query parameter
    ghost = RequestIdCodec(HMAC_KEY).encode(BatchRef("kafka", unique(), "", topic, "0", 0, 1, 1))
    assert call(api, "POST", "/ack", status=404, params={"requestId": ghost})["result"] == "unknown"
    done()


def test_broadcast_clients_and_queue_views(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(2), unique()
    configure(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": f"v{i}", "partition": i % 2} for i in range(4)]})
    for client in ("c1", "c2"):
        seen = 0
        while seen < 4:  # every broadcast client sees every record
            b = fetch_ok(api, consumer=g, topic=topic, clientId=client, max=10)
            seen += len(b["messages"])
            assert ack(api, b["requestId"])["result"] == "committed"
        assert seen == 4
    clients = call(api, "GET", f"/consumers/{g}/clients", "/consumers/{consumer}/clients", 200)
    assert clients["consumer"] == g and clients["idleExpiryMs"] > 0
    assert sorted(c["clientId"] for c in clients["clients"]) == ["c1", "c2"]
    tmpl = "/consumers/{consumer}/clients/{client_id}/queues"
    view = call(api, "GET", f"/consumers/{g}/clients/c1/queues", tmpl, 200)
    assert view["clientId"] == "c1" and [q["queue"] for q in view["queues"]] == ["0", "1"]
    assert all(q["committedOffset"] == 2 and q["backlog"] == 0 for q in view["queues"])
    # cluster mode of the same consumer has read nothing
    view = call(api, "GET", f"/consumers/{g}/queues", "/consumers/{consumer}/queues", 200)
    assert view["clientId"] is None and view["queues"] == []
    # a clientId (or consumer) never seen is told, not shown as empty
    call(api, "GET", f"/consumers/{g}/clients/nobody/queues", tmpl, 404, "unknown_client")
    call(api, "GET", f"/consumers/{unique()}/clients/c1/queues", tmpl, 404, "unknown_consumer")
    done()


def test_admin_pause_resume_reset(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    configure(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": "a"}, {"value": "b"}]})
    out = fetch_ok(api, consumer=g, topic=topic, max=1)
    tmpl = "/admin/consumers/{consumer}/"
    assert call(api, "POST", f"/admin/consumers/{g}/pause", tmpl + "pause", 200)["paused"] is True
    assert fetch(api, consumer=g, topic=topic)["status"] == "paused"
    assert call(api, "GET", f"/admin/consumers/{g}", "/admin/consumers/{consumer}", 200)["paused"] is True
    assert call(api, "POST", f"/admin/consumers/{g}/resume", tmpl + "resume", 200)["paused"] is False
    assert call(api, "GET", f"/admin/consumers/{g}", "/admin/consumers/{consumer}", 200)["paused"] is False
    body = {"topic": topic, "to": "latest"}
    check_request_body({**body, "dryRun": True}, tmpl + "reset", "post")
    dry = call(api, "POST", f"/admin/consumers/{g}/reset", tmpl + "reset", 200,
               json={**body, "dryRun": True})
    assert dry["dryRun"] is True and dry["moved"] == 1
    call(api, "POST", f"/admin/consumers/{g}/reset", tmpl + "reset", 400, "invalid_dry_run",
         json={**body, "dryRun": 1})
    check_request_body(body, tmpl + "reset", "post")
    r = call(api, "POST", f"/admin/consumers/{g}/reset", tmpl + "reset", 200, json=body)
    assert r["queues"][0]["from"] == 0
    assert ack(api, out["requestId"], status=409)["result"] == "offset_reset"
    call(api, "POST", f"/admin/consumers/{g}/reset", tmpl + "reset", 400, "invalid_to",
         json={"topic": topic, "to": "soon"})
    call(api, "POST", f"/admin/consumers/{g}/reset", tmpl + "reset", 404, "unknown_queue",
         json={"topic": topic, "to": "earliest", "queue": "7"})
    call(api, "POST", "/admin/consumers/a:b/pause", tmpl + "pause", 400, "invalid_consumer")
    done()


def test_produce_partial_failure(api: Api, shared_topic: str, done: Callable[[], None]) -> None:
    body = {"topic": shared_topic, "messages": [{"value": "ok"}, {"value": "nope", "partition": 9}]}
    check_request_body(body, "/produce", "post")
    out = call(api, "POST", "/produce", status=200, json=body)
    assert out["failed"] == 1 and "offset" in out["results"][0]
    assert out["results"][1]["error"]["code"] == "unknown_partition"
    done()


def test_delayed_produce_and_cancel(node_factory: Callable[..., Node], make_topic: Callable[..., str],
                                   done: Callable[[], None]) -> None:
    topic = make_topic(1)
    node = node_factory(relay="true", delay_levels="1s,2s", delay_partitions=1,
                        delay_topic_prefix=unique("oa") + ".")
    api = Api([node.url])
    try:
        out = produce(api, {"topic": topic, "delayMs": 60_000, "messages": [
            {"value": "later"}, {"value": "soon", "delayMs": 10},
            {"value": "dated", "deliverAt": "2099-01-01T00:00:00+01:00"}, {"value": "now", "delayMs": 0}]})
        later, soon, dated, now = out["results"]
        assert later["deliverAt"] > time.time() * 1000 + 50_000 and "offset" in now
        assert dated["deliverAt"] == 4070905200000
        tmpl = "/delayed/{delay_id}"
        body = call(api, "DELETE", f"/delayed/{later['delayId']}", tmpl, 200)
        assert body["topic"] == topic and body["deliverAt"] == later["deliverAt"]
        call(api, "DELETE", f"/delayed/{soon['delayId']}", tmpl, 409, "already_delivered")
        call(api, "DELETE", "/delayed/garbage", tmpl, 400, "invalid_delay_id")
        call(api, "DELETE", f"/delayed/{dated['delayId']}?nope=1", tmpl, 400, "unknown_parameter")
        call(api, "POST", "/produce", "/produce", 400, "conflicting_delay",
             json={"topic": topic, "value": "x", "delayMs": 1, "deliverAt": 1})
    finally:
        api.http.close()
    done()


def test_nack_retries_and_dead_letters(node_factory: Callable[..., Node],
                                       make_topic: Callable[..., str],
                                       done: Callable[[], None]) -> None:
    topic = make_topic(1)
    tag = unique("oa")
    node = node_factory(relay="true", delay_levels="100ms,1s", delay_partitions=1,
                        delay_topic_prefix=f"{tag}.d.", retry_topic_prefix=f"{tag}.r.",
                        dead_letter_prefix=f"{tag}.dead.", retry_partitions=1)
    api = Api([node.url])
    group = unique("nack")
    try:
        call(api, "PATCH", f"/admin/consumers/{group}", "/admin/consumers/{consumer}", 200,
             json={"retry": {"delaysMs": [100], "maxAttempts": 2}})
        fetch(api, consumer=group, topic=topic)
        produce(api, {"topic": topic, "messages": [{"value": "x"}, {"value": "y"}]})
        b = fetch(api, consumer=group, topic=topic, wait_ms=5000)
        assert len(b["messages"]) == 2 and {m["attempt"] for m in b["messages"]} == {1}
        first = b["messages"][0]["offset"]
        call(api, "POST", "/nack", status=400, code="invalid_failed",
             json={"requestId": b["requestId"], "failed": [first + 2]})
        call(api, "POST", "/ack", status=400, code="invalid_failed",
             json={"requestId": b["requestId"], "failed": ["x"]})
        ack = {"requestId": b["requestId"], "failed": [{"offset": first, "delayMs": 0}]}
        check_request_body(ack, "/ack", "post")
        out = call(api, "POST", "/ack", status=200, json=ack)
        assert out["result"] == "committed" and out["retried"][0]["attempt"] == 2
        again = fetch(api, consumer=group, topic=topic, wait_ms=5000)
        assert [m["value"] for m in again["messages"]] == ["x"] and "retryTopic" in again
        assert again["messages"][0]["attempt"] == 2
        nack = {"requestId": again["requestId"], "delayMs": 0}
        check_request_body(nack, "/nack", "post")
        out = call(api, "POST", "/nack", status=200, json=nack)
        assert out["retried"] == [] and out["deadLettered"] == [again["messages"][0]["offset"]]
        out = call(api, "POST", "/nack", status=200, json=nack)
        assert out["result"] == "already_committed" and "retried" not in out
        tmpl = "/admin/consumers/{consumer}/dead-letters"
        check_query({"limit": 5}, tmpl, "get")
        page = call(api, "GET", f"/admin/consumers/{group}/dead-letters?limit=5", tmpl, 200)
        assert page["count"] == 1 and page["messages"][0]["value"] == "x"
        call(api, "GET", f"/admin/consumers/{group}/dead-letters?partition=7", tmpl, 400,
             "invalid_partition")
        call(api, "GET", f"/admin/consumers/{group}/dead-letters?nope=1", tmpl, 400,
             "unknown_parameter")
        tmpl += "/redrive"
        call(api, "POST", f"/admin/consumers/{group}/dead-letters/redrive", tmpl, 400,
             "invalid_limit", json={"limit": 0})
        body = {"target": "consumer", "limit": 10}
        check_request_body(body, tmpl, "post")
        out = call(api, "POST", f"/admin/consumers/{group}/dead-letters/redrive", tmpl, 200,
                   json=body)
        assert out["redriven"] == 1
        back = fetch(api, consumer=group, topic=topic, wait_ms=5000)
        assert [(m["value"], m["attempt"]) for m in back["messages"]] == [("x", 1)]
    finally:
        api.http.close()
    done()


def test_admin_consumer_registry(api: Api, make_topic: Callable[..., str], other_topic: str,
                                 done: Callable[[], None]) -> None:
    """Register, replace, patch, list and unregister consumers; registered ones are held to their
    registration even in open mode."""
    topic, g, gb = make_topic(1), unique(), unique()
    tmpl = "/admin/consumers/{consumer}"
    full = {"topics": [topic, topic], "mode": "cluster", "consumeTimeoutMs": 5000, "maxBatch": 1,
            "start": "earliest", "paused": False,
            "rateLimit": {"messagesPerSecond": 1000, "burst": 2000},
            "retry": {"maxAttempts": 5, "initialDelayMs": 100, "multiplier": 1.5, "maxDelayMs": 60_000,
                      "deadLetterTopic": other_topic},
            "alerts": {"backlogMessages": 100, "oldestAgeMs": 60_000}}
    created = register_consumer(api, g, full, 201)
    assert created["topics"] == [topic] and created["createdMs"] == created["updatedMs"]
    assert created["rateLimit"] == {"messagesPerSecond": 1000, "burst": 2000}
    assert created["retry"] == full["retry"] and created["alerts"] == full["alerts"]
    # PUT replaces everything: what is left out goes back to the defaults
    replaced = register_consumer(api, g, {"topics": [topic], "start": "earliest", "maxBatch": 1}, 200)
    assert replaced["createdMs"] == created["createdMs"]
    assert (replaced["mode"], replaced["consumeTimeoutMs"], replaced["rateLimit"], replaced["retry"],
            replaced["alerts"]) == ("cluster", 60_000, None, None, None)
    assert call(api, "GET", f"/admin/consumers/{g}", tmpl, 200) == replaced
    listed = call(api, "GET", "/admin/consumers", status=200)["consumers"]
    assert replaced in listed

    # held to the registration in open mode too: its topics, its mode, its batch cap
    produce(api, {"topic": topic, "messages": [{"value": "a"}, {"value": "b"}]})
    call(api, "GET", "/message", status=403, code="topic_not_allowed", params={"consumer": g, "topic": other_topic})
    call(api, "GET", "/message", status=400, code="client_id_not_allowed",
         params={"consumer": g, "topic": topic, "clientId": "c1"})
    first = fetch_ok(api, consumer=g, topic=topic, max=10)
    assert len(first["messages"]) == 1  # maxBatch
    assert ack(api, first["requestId"])["result"] == "committed"
    register_consumer(api, gb, {"topics": [topic], "mode": "broadcast", "start": "earliest"}, 201)
    call(api, "POST", "/message", status=400, code="client_id_required", json={"consumer": gb, "topic": topic})
    assert fetch_ok(api, consumer=gb, topic=topic, clientId="c1", max=10)["messages"]

    # PATCH changes the given fields; null clears one; a registered consumer keeps its topics
    patched = configure(api, g, {"maxBatch": None, "consumeTimeoutMs": 7000, "alerts": {"backlogMessages": 5}})
    assert (patched["maxBatch"], patched["consumeTimeoutMs"], patched["topics"]) == (1000, 7000, [topic])
    assert patched["alerts"] == {"backlogMessages": 5} and patched["updatedMs"] >= replaced["updatedMs"]
    call(api, "PATCH", f"/admin/consumers/{g}", tmpl, 400, "invalid_topics", json={"topics": None})
    second = fetch_ok(api, consumer=g, topic=topic, max=10)
    assert second["lockTimeoutMs"] == 7000 and [m["value"] for m in second["messages"]] == ["b"]

    # unregister, keeping the offsets, then with them
    gone = call(api, "DELETE", f"/admin/consumers/{g}", tmpl, 200)
    assert gone == {"consumer": g, "unregistered": True, "offsetsDeleted": False, "keysDeleted": 0}
    # its offsets are still there: known, unregistered
    assert call(api, "GET", f"/admin/consumers/{g}", tmpl, 200)["registered"] is False
    assert call(api, "GET", f"/consumers/{g}/queues", "/consumers/{consumer}/queues", 200)["queues"]
    gone = call(api, "DELETE", f"/admin/consumers/{g}", tmpl, 200, params={"deleteOffsets": "true"})
    assert gone["unregistered"] is False and gone["offsetsDeleted"] is True and gone["keysDeleted"] >= 1
    # nothing is left of it: unknown again
    call(api, "GET", f"/admin/consumers/{g}", tmpl, 404, "unknown_consumer")
    call(api, "GET", f"/consumers/{g}/queues", "/consumers/{consumer}/queues", 404, "unknown_consumer")
    gone = call(api, "DELETE", f"/admin/consumers/{gb}", tmpl, 200, params={"deleteOffsets": "1"})
    assert gone["unregistered"] is True and gone["keysDeleted"] >= 2  # clients zset + c1's offsets
    done()


def test_rate_limited_fetch(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    view = configure(api, g, {"start": "earliest", "rateLimit": {"messagesPerSecond": 0.5}})
    assert view["rateLimit"] == {"messagesPerSecond": 0.5, "burst": 1} and view["registered"] is False
    produce(api, {"topic": topic, "messages": [{"value": "a"}, {"value": "b"}]})
    first = fetch_ok(api, consumer=g, topic=topic, max=10)
    assert len(first["messages"]) == 1  # the bucket held one token
    r = api.http.get(api.url("/message"), params={"consumer": g, "topic": topic, "max": 10,
                                                  "requestId": first["requestId"]})
    body = check(r, "/message", 429)
    assert body["status"] == "rate_limited" and body["messages"] == [] and body["topic"] == topic
    assert body["ack"]["result"] == "committed"  # the piggy-backed ack still ran
    assert 0 < body["retryAfterMs"] <= 2000
    assert int(r.headers["Retry-After"]) == -(-body["retryAfterMs"] // 1000)
    r = api.http.post(api.url("/message"), json={"consumer": g, "topic": topic})
    assert "ack" not in check(r, "/message", 429)
    configure(api, g, {"rateLimit": None})
    assert [m["value"] for m in fetch_ok(api, consumer=g, topic=topic, max=10)["messages"]] == ["b"]
    done()


def test_rest_v2_operations(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    """Every REST v2 operation (gateway/api/v2.py), its answers and its refusals, in the v2
    error shape (``error_code``, ``message``, ``code``)."""
    topic = make_topic(1)
    group = unique("v2")
    inst = f"/consumers/{group}/instances/i"

    def v2(method: str, path: str, template: str, status: int, code: str | None = None,
           body: Any = None, ctype: str = "application/vnd.kafka.v2+json", **kw: Any) -> Any:
        if body is not None:
            kw["content"] = orjson.dumps(body)
            kw.setdefault("headers", {})["content-type"] = ctype
        out = call(api, method, path, template, status, code, **kw)
        if status >= 400:
            assert set(out) == {"error_code", "message", "code"} and out["message"], out
        return out

    # produce and metadata
    r = v2("POST", f"/topics/{topic}", "/topics/{topic}", 200, body={"records": [
        {"key": "k", "value": {"n": 1}}, {"value": [2]}]}, ctype=V2_JSON["content-type"])
    assert [o["offset"] for o in r["offsets"]] == [0, 1]
    r = v2("POST", f"/topics/{topic}/partitions/0", "/topics/{topic}/partitions/{partition}", 200,
           body={"records": [{"value": b64(b"\x00")}]}, ctype="application/vnd.kafka.binary.v2+json")
    assert r["offsets"][0] == {"partition": 0, "offset": 2, "error_code": None, "error": None}
    r = v2("POST", f"/topics/{topic}", "/topics/{topic}", 200, body={"records": [
        {"value": 1, "partition": 9}]}, ctype=V2_JSON["content-type"])
    assert r["offsets"][0]["error_code"] == 40402
    v2("POST", f"/topics/{topic}", "/topics/{topic}", 415, "unsupported_media_type",
       body={"records": [{"value": 1}]})
    v2("POST", f"/topics/{topic}", "/topics/{topic}", 422, "invalid_records", body={"records": []},
       ctype=V2_JSON["content-type"])
    v2("POST", f"/topics/{topic}", "/topics/{topic}", 400, "invalid_json",
       content=b"{", headers=V2_JSON)
    v2("POST", "/topics/nope-" + group, "/topics/{topic}", 404, "unknown_topic",
       body={"records": [{"value": 1}]}, ctype=V2_JSON["content-type"])
    v2("POST", f"/topics/{topic}/partitions/7", "/topics/{topic}/partitions/{partition}", 200,
       body={"records": [{"value": 1}]}, ctype=V2_JSON["content-type"])
    assert topic in v2("GET", "/topics", "/topics", 200)
    v2("GET", "/topics?x=1", "/topics", 422, "unknown_parameter")
    assert v2("GET", f"/topics/{topic}", "/topics/{topic}", 200)["name"] == topic
    v2("GET", "/topics/nope-" + group, "/topics/{topic}", 404, "unknown_topic")
    v2("GET", "/topics/a%20b", "/topics/{topic}", 422, "invalid_topic")
    assert len(v2("GET", f"/topics/{topic}/partitions", "/topics/{topic}/partitions", 200)) == 1
    v2("GET", "/topics/nope-" + group + "/partitions", "/topics/{topic}/partitions", 404, "unknown_topic")
    v2("GET", f"/topics/{topic}/partitions/0", "/topics/{topic}/partitions/{partition}", 200)
    v2("GET", f"/topics/{topic}/partitions/3", "/topics/{topic}/partitions/{partition}", 404,
       "unknown_partition")
    assert v2("GET", f"/topics/{topic}/partitions/0/offsets",
              "/topics/{topic}/partitions/{partition}/offsets", 200)["end_offset"] == 3
    v2("GET", f"/topics/{topic}/partitions/5/offsets", "/topics/{topic}/partitions/{partition}/offsets",
       404, "unknown_partition")
    # an instance
    r = v2("POST", f"/consumers/{group}", "/consumers/{group}", 200,
           body={"name": "i", "format": "json", "auto.offset.reset": "earliest",
                 "auto.commit.enable": "false", "max.poll.records": 2})
    assert r["base_uri"].endswith(inst)
    v2("POST", f"/consumers/{group}", "/consumers/{group}", 409, "instance_exists", body={"name": "i"})
    v2("POST", f"/consumers/{group}", "/consumers/{group}", 422, "invalid_format", body={"format": "avro"})
    v2("POST", f"/consumers/{group}", "/consumers/{group}", 415, "unsupported_media_type",
       body={"name": "j"}, ctype="text/plain")
    v2("POST", f"/consumers/{group}", "/consumers/{group}", 400, "invalid_json", content=b"[",
       headers={"content-type": "application/vnd.kafka.v2+json"})
    v2("GET", inst + "/records", V2_I + "/records", 409, "not_subscribed")
    assert v2("GET", inst + "/subscription", V2_I + "/subscription", 200) == {"topics": []}
    v2("POST", inst + "/subscription", V2_I + "/subscription", 204, body={"topics": [topic]})
    v2("POST", inst + "/subscription", V2_I + "/subscription", 422, "topic_pattern_unsupported",
       body={"topic_pattern": "x.*"})
    v2("POST", inst + "/subscription", V2_I + "/subscription", 400, "invalid_json", content=b"{",
       headers={"content-type": "application/vnd.kafka.v2+json"})
    v2("POST", inst + "/subscription", V2_I + "/subscription", 415, "unsupported_media_type",
       body={"topics": [topic]}, ctype="text/plain")
    accept = {"accept": "application/vnd.kafka.json.v2+json"}
    got = v2("GET", inst + "/records?timeout=2000", V2_I + "/records", 200, headers=accept)
    assert [g["value"] for g in got] == [{"n": 1}, [2]]  # the binary record is not JSON
    v2("GET", inst + "/records", V2_I + "/records", 406, "format_mismatch",
       headers={"accept": "application/vnd.kafka.binary.v2+json"})
    v2("GET", inst + "/records?timeout=soon", V2_I + "/records", 422, "invalid_timeout")
    v2("POST", inst + "/offsets", V2_I + "/offsets", 200,
       body={"offsets": [{"topic": topic, "partition": 0, "offset": 1}]})
    v2("POST", inst + "/offsets", V2_I + "/offsets", 422, "invalid_offsets", body={"offsets": 1})
    v2("POST", inst + "/offsets", V2_I + "/offsets", 400, "invalid_json", content=b"{",
       headers={"content-type": "application/vnd.kafka.v2+json"})
    r = v2("GET", inst + "/offsets", V2_I + "/offsets", 200,
           body={"partitions": [{"topic": topic, "partition": 0}]})
    assert r["offsets"][0]["offset"] == 2
    v2("GET", inst + "/offsets", V2_I + "/offsets", 404, "unknown_partition")
    v2("GET", inst + "/offsets", V2_I + "/offsets", 400, "invalid_json", content=b"{",
       headers={"content-type": "application/vnd.kafka.v2+json"})
    v2("GET", inst + "/records", V2_I + "/records", 422, "json_conversion", headers=accept)
    for suffix in ("/beginning", "/end"):
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 204,
           body={"partitions": [{"topic": topic, "partition": 0}]})
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 422,
           "invalid_partitions", body={"partitions": []})
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 400, "invalid_json",
           content=b"{", headers={"content-type": "application/vnd.kafka.v2+json"})
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 415,
           "unsupported_media_type", body={"partitions": []}, ctype="text/plain")
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 404, "unknown_queue",
           body={"partitions": [{"topic": topic, "partition": 4}]})
    for suffix in ("", "/"):
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 204,
           body={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]})
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 422,
           "offset_out_of_range", body={"offsets": [{"topic": topic, "partition": 0, "offset": 99}]})
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 400, "invalid_json",
           content=b"{", headers={"content-type": "application/vnd.kafka.v2+json"})
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 415,
           "unsupported_media_type", body={"offsets": []}, ctype="text/plain")
    for method in ("GET", "POST"):
        v2(method, inst + "/assignments", V2_I + "/assignments", 409, "assignments_unsupported")
        v2(method, f"/consumers/{group}/instances/nope/assignments", V2_I + "/assignments", 404,
           "unknown_instance")
    v2("DELETE", inst + "/subscription", V2_I + "/subscription", 204)
    v2("DELETE", inst, V2_I, 204)
    for method, suffix in [("DELETE", ""), ("GET", "/subscription"), ("DELETE", "/subscription"),
                           ("GET", "/records"), ("POST", "/offsets")]:
        v2(method, inst + suffix, V2_I + suffix, 404, "unknown_instance")
    v2("POST", inst + "/subscription", V2_I + "/subscription", 404, "unknown_instance",
       body={"topics": [topic]})
    v2("GET", inst + "/offsets", V2_I + "/offsets", 404, "unknown_instance",
       body={"partitions": [{"topic": topic, "partition": 0}]})
    for suffix in ("", "/"):
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 404, "unknown_instance",
           body={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]})
    for suffix in ("/beginning", "/end"):
        v2("POST", inst + "/positions" + suffix, V2_I + "/positions" + suffix, 404,
           "unknown_instance", body={"partitions": [{"topic": topic, "partition": 0}]})
    v2("DELETE", "/consumers/a:b/instances/i", V2_I, 422, "invalid_consumer")
    v2("GET", f"/consumers/{group}/instances/a:b/subscription", V2_I + "/subscription", 422,
       "invalid_instance")
    v2("POST", f"/consumers/{group}", "/consumers/{group}", 422, "unknown_field", body={"nmae": "x"})
    v2("POST", "/consumers/a:b", "/consumers/{group}", 422, "invalid_consumer", body={})
    done()


def test_admin_topics(api: Api, done: Callable[[], None]) -> None:
    name, tmpl = unique("oat"), "/admin/topics/{topic}"
    body = {"name": name, "partitions": 2}
    check_request_body(body, "/admin/topics", "post")
    created = call(api, "POST", "/admin/topics", status=201, json=body)
    assert call(api, "GET", f"/admin/topics/{name}", tmpl, 200) == created
    call(api, "POST", "/admin/topics", status=409, code="topic_exists", json=body)
    call(api, "POST", "/admin/topics", status=400, code="invalid_partitions",
         json={"name": unique("oat"), "partitions": 0})
    call(api, "POST", "/admin/topics", status=403, code="internal_topic",
         json={"name": "mqgw.delay.1ms", "partitions": 1})
    call(api, "GET", f"/admin/topics/{unique('none')}", tmpl, 404, "unknown_topic")
    call(api, "GET", "/admin/topics/a:b", tmpl, 400, "invalid_topic")
    check_query({"internal": "true"}, "/admin/topics", "get")
    listed = call(api, "GET", "/admin/topics", status=200, params={"internal": "true"})
    assert name in {t["name"] for t in listed["topics"]}
    call(api, "GET", "/admin/topics", status=400, code="invalid_internal", params={"internal": "x"})
    done()


def test_admin_producers(api: Api, make_topic: Callable[..., str], other_topic: str,
                         done: Callable[[], None]) -> None:
    topic, name = make_topic(1), unique("p")
    tmpl = "/admin/producers/{name}"
    call(api, "GET", f"/admin/producers/{name}", tmpl, 404, "unknown_producer")
    # auth is off on this cluster: whatever key comes along is ignored
    call(api, "GET", f"/admin/producers/{name}", tmpl, 404, "unknown_producer", headers={"Authorization": "Basic eA=="})
    created = register_producer(api, name, [topic], 201, headers=bearer("mqgw_0123456789abcdef_" + "A" * 43))
    replaced = register_producer(api, name, [topic, topic], 200)
    assert replaced["createdMs"] == created["createdMs"] and replaced["updatedMs"] >= created["updatedMs"]
    assert call(api, "GET", f"/admin/producers/{name}", tmpl, 200) == replaced
    assert replaced in call(api, "GET", "/admin/producers", status=200)["producers"]
    # a registered producer is held to its topics, in open mode too
    produce(api, {"topic": topic, "producer": name, "value": "x"})
    produce(api, {"topic": topic, "producer": name, "messages": [{"value": "y"}]})
    call(api, "POST", "/produce", status=403, code="topic_not_allowed",
         json={"topic": other_topic, "producer": name, "value": "x"})
    assert call(api, "DELETE", f"/admin/producers/{name}", tmpl, 200) == {"producer": name, "unregistered": True}
    call(api, "DELETE", f"/admin/producers/{name}", tmpl, 404, "unknown_producer")
    produce(api, {"topic": other_topic, "producer": name, "value": "open mode again"})
    done()


@pytest.mark.timeout(120)
def test_backlog_and_alerts(node_factory: Callable[..., Node], make_topic: Callable[..., str],
                            done: Callable[[], None]) -> None:
    """On a node of its own (own key prefix, no periodic alert evaluation) so that the views list
    exactly this test's consumers."""
    node = node_factory(key_prefix=unique("oabl"), alert_interval_ms=0)
    api = Api([node.url])
    try:
        topic, g, gb = make_topic(1), unique(), unique()
        assert call(api, "GET", "/admin/alerts", status=200) == {"alerts": [], "evaluatedMs": None}
        assert call(api, "GET", "/admin/backlog", status=200)["consumers"] == []
        configure(api, g, {"start": "earliest", "alerts": {"backlogMessages": 1, "oldestAgeMs": 3_600_000}})
        configure(api, gb, {"start": "earliest"})
        # One record per request only on Tansu (its ListOffsets defect, see Api.produce_exact).
        for vals in ([["a"], ["b"], ["c"]] if ON_TANSU else [["a", "b", "c"]]):
            produce(api, {"topic": topic, "messages": [{"value": v} for v in vals]})
        fetch_ok(api, consumer=g, topic=topic, max=1)  # not acked: everything still waits
        fetch_ok(api, consumer=gb, topic=topic, clientId="c1", max=1)

        view = call(api, "GET", "/admin/backlog", status=200)
        assert [c["consumer"] for c in view["consumers"]] == sorted([g, gb])
        rows = {c["consumer"]: c for c in view["consumers"]}
        assert (rows[g]["mode"], rows[g]["registered"], rows[g]["totalBacklog"]) == ("cluster", False, 3)
        assert rows[g]["alerts"] == {"backlogMessages": 1, "oldestAgeMs": 3_600_000}
        assert isinstance(rows[g]["oldestAgeMs"], int) and rows[g]["queues"][0]["lockAgeMs"] is not None
        assert (rows[gb]["mode"], rows[gb]["alerts"], rows[gb]["clients"][0]["clientId"]) == ("broadcast", None, "c1")
        assert rows[gb]["queues"][0]["clientId"] == "c1"
        r = api.http.get(api.url("/admin/backlog"), params=[("consumer", g), ("consumer", gb), ("age", "FALSE")])
        view = check(r, "/admin/backlog", 200)
        assert [c["consumer"] for c in view["consumers"]] == sorted([g, gb])
        assert all(c["oldestAgeMs"] is None for c in view["consumers"])
        nobody = unique("nobody")  # a name never seen: told, not listed as empty
        call(api, "GET", "/admin/backlog", status=404, code="unknown_consumer", params={"consumer": nobody})
        call(api, "GET", "/admin/backlog", status=400, code="invalid_consumer", params={"consumer": "a:b"})
        call(api, "GET", "/admin/backlog", status=400, code="missing_consumer", params={"consumer": ""})
        call(api, "GET", "/admin/backlog", status=400, code="invalid_age", params={"age": "maybe"})

        # alerts: g's backlog reaches its threshold; gb has none
        body = call(api, "POST", "/admin/alerts/evaluate", status=200, params={"all": "true"})
        (alert,) = body["alerts"]
        assert (alert["consumer"], alert["state"], alert["reasons"], alert["totalBacklog"]) == (g, "firing", ["backlog"], 3)
        assert [s["consumer"] for s in body["all"]] == [g] and body["evaluatedMs"] == alert["evaluatedMs"]
        body = call(api, "GET", "/admin/alerts", status=200)
        assert body["alerts"] == [alert] and "all" not in body
        configure(api, g, {"alerts": {"backlogMessages": 1_000_000}})
        body = call(api, "POST", "/admin/alerts/evaluate", status=200)
        assert body["alerts"] == [] and body["evaluatedMs"] > alert["evaluatedMs"]
        (state,) = call(api, "GET", "/admin/alerts", status=200, params={"all": "1"})["all"]
        assert (state["consumer"], state["state"], state["reasons"]) == (g, "ok", [])
        call(api, "GET", "/admin/alerts", status=400, code="invalid_all", params={"all": "maybe"})
        call(api, "POST", "/admin/alerts/evaluate", status=400, code="invalid_all", params={"all": "yes"})
        done()
    finally:
        api.http.close()


def test_every_secured_operation_needs_a_key(secured: Secured, done: Callable[[], None]) -> None:
    """With auth on, every operation but the open ones answers 401 without a key or with a bad
    one, and every admin operation answers 403 to a valid key that is not an admin key."""
    api, admin = secured.api, secured.admin
    body = call(api, "POST", "/admin/keys", status=201, json={"name": "no-admin", "consumers": ["nobody"]},
                headers=admin)
    plain = bearer(body["key"])
    bad_keys = [({}, "missing_api_key"), ({"Authorization": "Basic dXNlcjpwdw=="}, "invalid_api_key"),
                ({"Authorization": "Bearer not-a-key"}, "invalid_api_key"),
                ({"X-API-Key": "mqgw_0123456789abcdef_" + "A" * 43}, "invalid_api_key"),
                ({"Authorization": "Bearer " + body["key"][:-1] + ("A" if body["key"][-1] != "A" else "B")},
                 "invalid_api_key")]
    for path, method, op in operations():
        url = sample_path(path)
        if not security_of(op):
            for headers, _ in bad_keys[:2]:
                r = api.http.request(method.upper(), api.url(url), headers=headers)
                assert r.status_code not in (401, 403), f"{method} {path} is open: {r.status_code} {r.text[:300]}"
                check(r, path)
            continue
        # no key, or a malformed one: refused before anything else is looked at
        for headers, code in bad_keys[:3]:
            r = api.http.request(method.upper(), api.url(url), headers=headers)
            check(r, path, 401, code)
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
        if path.startswith("/admin/"):
            for headers, code in bad_keys[3:]:  # well-formed but unknown, or wrong secret
                call(api, method.upper(), url, path, 401, code, headers=headers)
            call(api, method.upper(), url, path, 403, "forbidden", headers=plain)
    done()


def test_keys_registry_and_auth_on_a_closed_gateway(secured: Secured, make_topic: Callable[..., str],
                                                    other_topic: str, done: Callable[[], None]) -> None:
    api, admin = secured.api, secured.admin
    topic, g, gb, other, p, p2 = make_topic(1), unique(), unique(), unique(), unique("p"), unique("p")

    def new_key(**req: Any) -> tuple[dict[str, str], dict[str, Any]]:
        check_request_body(req, "/admin/keys", "post")
        rec = call(api, "POST", "/admin/keys", status=201, json=req, headers=admin)
        assert rec["name"] == req["name"] and rec["admin"] is req.get("admin", False)
        assert rec["key"].startswith(f"mqgw_{rec['id']}_")
        return bearer(rec["key"]), rec

    consumer_h, consumer_rec = new_key(name="consumer", consumers=[g, gb, g])
    assert consumer_rec["consumers"] == sorted([g, gb]) and consumer_rec["producers"] == []
    other_h, other_rec = new_key(name="other", consumers=[other])
    producer_h, _ = new_key(name="producer", producers=[p])
    multi_h, _ = new_key(name="multi", producers=[p, p2], consumers=None)
    admin2_h, admin2_rec = new_key(name="admin-2", admin=True)
    keys = call(api, "GET", "/admin/keys", status=200, headers=admin2_h)["keys"]
    assert "key" not in keys[0] and {k["id"] for k in keys} >= {consumer_rec["id"], other_rec["id"]}
    public = {k: v for k, v in consumer_rec.items() if k != "key"}
    assert call(api, "GET", f"/admin/keys/{consumer_rec['id']}", "/admin/keys/{key_id}", 200, headers=admin) == public

    # consuming: the key must be bound to the consumer, and the consumer registered
    q = {"consumer": g, "topic": topic}
    call(api, "GET", "/message", status=403, code="unregistered_consumer", params=q, headers=consumer_h)
    call(api, "GET", "/message", status=403, code="forbidden", params=q, headers=other_h)
    call(api, "GET", "/message", status=403, code="forbidden", params=q, headers=admin)  # admin is no consumer
    call(api, "PATCH", f"/admin/consumers/{g}", "/admin/consumers/{consumer}", 404, "unknown_consumer",
         json={"start": "earliest"}, headers=admin)
    register_consumer(api, g, {"topics": [topic], "start": "earliest"}, 201, headers=admin)
    register_consumer(api, gb, {"topics": [topic], "mode": "broadcast", "start": "earliest"}, 201, headers=admin)
    call(api, "GET", "/message", status=403, code="topic_not_allowed", params={"consumer": g, "topic": other_topic},
         headers=consumer_h)
    call(api, "POST", "/message", status=400, code="client_id_not_allowed", json={**q, "clientId": "c1"},
         headers=consumer_h)
    call(api, "POST", "/message", status=400, code="client_id_required", json={"consumer": gb, "topic": topic},
         headers=consumer_h)
    call(api, "POST", "/message", status=401, code="invalid_api_key", json=q,
         headers={"X-API-Key": "mqgw_0123456789abcdef_" + "A" * 43})

    # producing: the key must be bound to the producer, and the producer registered for the topic
    one = {"topic": topic, "value": "hello"}
    call(api, "POST", "/produce", status=403, code="unregistered_producer", json=one, headers=producer_h)
    register_producer(api, p, [topic], 201, headers=admin)
    call(api, "POST", "/produce", status=403, code="topic_not_allowed", json={**one, "topic": other_topic},
         headers=producer_h)
    call(api, "POST", "/produce", status=403, code="forbidden", json=one, headers=consumer_h)  # no producer
    call(api, "POST", "/produce", status=403, code="forbidden", json={**one, "producer": p2}, headers=producer_h)
    call(api, "POST", "/produce", status=400, code="missing_producer", json=one, headers=multi_h)
    call(api, "POST", "/produce", status=401, code="invalid_api_key", json=one,
         headers=bearer("mqgw_0123456789abcdef_" + "A" * 43))
    produce(api, one, headers=producer_h)  # the key's only producer is implied
    produce(api, {"topic": topic, "producer": p, "messages": [{"value": "again"}]}, headers=multi_h)

    # fetch, ack and unlock as the consumer; another consumer's key may do none of it
    b = fetch_ok(api, consumer_h, consumer=g, topic=topic, max=1)
    assert b["messages"][0]["value"] == "hello"
    ack(api, b["requestId"], 403, headers=other_h)
    unlock(api, b["requestId"], 403, headers=other_h)
    ack(api, b["requestId"], 401, headers=bearer("mqgw_0123456789abcdef_" + "A" * 43))
    assert unlock(api, b["requestId"], headers=consumer_h)["result"] == "unlocked"
    b = fetch_ok(api, consumer_h, consumer=g, topic=topic, max=1)
    assert ack(api, b["requestId"], headers=consumer_h)["result"] == "committed"
    assert fetch_ok(api, consumer_h, consumer=gb, topic=topic, clientId="c1")["status"] == "ok"

    # queue views: an admin key or a key bound to the consumer
    views = [(f"/consumers/{g}/queues", "/consumers/{consumer}/queues"),
             (f"/consumers/{gb}/clients", "/consumers/{consumer}/clients"),
             (f"/consumers/{gb}/clients/c1/queues", "/consumers/{consumer}/clients/{client_id}/queues")]
    for url, tmpl in views:
        call(api, "GET", url, tmpl, 200, headers=consumer_h)
        call(api, "GET", url, tmpl, 200, headers=admin)
        call(api, "GET", url, tmpl, 403, "forbidden", headers=other_h)
        call(api, "GET", url, tmpl, 403, "forbidden", headers=producer_h)

    # the admin API lists what this (closed) gateway knows; X-API-Key works as well as Bearer
    names = [c["consumer"] for c in call(api, "GET", "/admin/consumers", status=200,
                                         headers={"X-API-Key": secured.admin_key})["consumers"]]
    assert g in names and gb in names
    assert [x["producer"] for x in call(api, "GET", "/admin/producers", status=200, headers=admin)["producers"]] == [p]
    assert call(api, "POST", f"/admin/consumers/{g}/pause", "/admin/consumers/{consumer}/pause", 200,
                headers=admin) == {"consumer": g, "paused": True}
    assert fetch(api, consumer_h, consumer=g, topic=topic)["status"] == "paused"
    call(api, "POST", f"/admin/consumers/{g}/resume", "/admin/consumers/{consumer}/resume", 200, headers=admin)

    # revoking a key: it stops working at once, and is gone
    revoked = call(api, "DELETE", f"/admin/keys/{other_rec['id']}", "/admin/keys/{key_id}", 200, headers=admin)
    assert revoked == {**{k: v for k, v in other_rec.items() if k != "key"}, "revoked": True}
    call(api, "GET", "/message", status=401, code="invalid_api_key", params={"consumer": other, "topic": topic},
         headers=other_h)
    call(api, "GET", f"/consumers/{other}/queues", "/consumers/{consumer}/queues", 401, "invalid_api_key", headers=other_h)
    call(api, "GET", f"/admin/keys/{other_rec['id']}", "/admin/keys/{key_id}", 404, "unknown_key", headers=admin)
    call(api, "DELETE", f"/admin/keys/{other_rec['id']}", "/admin/keys/{key_id}", 404, "unknown_key", headers=admin)
    call(api, "DELETE", f"/admin/keys/{admin2_rec['id']}", "/admin/keys/{key_id}", 200, headers=admin)
    call(api, "GET", "/admin/keys", status=401, code="invalid_api_key", headers=admin2_h)
    done()


# (name, method, path, path template, request kwargs, status, error code); {topic} is an
# existing topic, {missing} one that does not exist.
ERROR_CASES: list[Any] = [
    ("message-missing-topic", "GET", "/message", "/message", {"params": {"consumer": "g"}}, 400, "missing_topic"),
    ("message-missing-consumer", "GET", "/message", "/message", {"params": {"topic": "{topic}"}}, 400, "missing_consumer"),
    ("message-unknown-topic", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{missing}"}}, 404, "unknown_topic"),
    ("message-invalid-topic", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "a b"}}, 400, "invalid_topic"),
    ("message-invalid-consumer", "GET", "/message", "/message", {"params": {"consumer": "a:b", "topic": "{topic}"}}, 400, "invalid_consumer"),
    ("message-invalid-client", "GET", "/message", "/message", {"params": {"consumer": "g", "clientId": "c{1}", "topic": "{topic}"}}, 400, "invalid_client_id"),
    ("message-max-0", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max": "0"}}, 400, "invalid_max"),
    ("message-max-1001", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max": "1001"}}, 400, "invalid_max"),
    ("message-max-text", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max": "ten"}}, 400, "invalid_max"),
    ("message-max-bytes-0", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max_bytes": "0"}}, 400, "invalid_max_bytes"),
    ("message-wait-negative", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "wait_ms": "-1"}}, 400, "invalid_wait_ms"),
    ("message-wait-too-long", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "wait_ms": "30001"}}, 400, "invalid_wait_ms"),
    ("message-encoding", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "encoding": "latin1"}}, 400, "invalid_encoding"),
    ("message-garbage-request-id", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "requestId": "garbage"}}, 400, "invalid_request_id"),
    ("post-message-json", "POST", "/message", "/message", {"content": b"{nope", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("post-message-body", "POST", "/message", "/message", {"json": ["consumer"]}, 400, "invalid_body"),
    ("post-message-max-float", "POST", "/message", "/message", {"json": {"consumer": "g", "topic": "{topic}", "max": 2.5}}, 400, "invalid_max"),
    ("post-message-max-bool", "POST", "/message", "/message", {"json": {"consumer": "g", "topic": "{topic}", "max": True}}, 400, "invalid_max"),
    ("post-message-request-id-type", "POST", "/message", "/message", {"json": {"consumer": "g", "topic": "{topic}", "requestId": 42}}, 400, "invalid_request_id"),
    ("post-message-unknown-topic", "POST", "/message", "/message", {"json": {"consumer": "g", "topic": "{missing}"}}, 404, "unknown_topic"),
    ("produce-missing-topic", "POST", "/produce", "/produce", {"json": {"value": "x"}}, 400, "missing_topic"),
    ("produce-invalid-topic", "POST", "/produce", "/produce", {"json": {"topic": "a/b", "value": "x"}}, 400, "invalid_topic"),
    ("produce-unknown-topic", "POST", "/produce", "/produce", {"json": {"topic": "{missing}", "value": "x"}}, 404, "unknown_topic"),
    ("produce-missing-value", "POST", "/produce", "/produce", {"json": {"topic": "{topic}"}}, 400, "missing_value"),
    ("produce-empty-batch", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "messages": []}}, 400, "invalid_messages"),
    ("produce-unknown-field", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "bogus": 1}}, 400, "unknown_field"),
    ("produce-message-unknown-field", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "messages": [{"value": "x", "bogus": 1}]}}, 400, "unknown_field"),
    ("produce-message-not-object", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "messages": [1]}}, 400, "invalid_message"),
    ("produce-value-type", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": 5}}, 400, "invalid_value"),
    ("produce-key-type", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "key": 1}}, 400, "invalid_key"),
    ("produce-headers", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "headers": [["a"]]}}, 400, "invalid_headers"),
    ("produce-bad-base64", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "!!not base64", "encoding": "base64"}}, 400, "invalid_base64"),
    ("produce-encoding", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "encoding": "latin1"}}, 400, "invalid_encoding"),
    ("produce-partition", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "partition": -1}}, 400, "invalid_partition"),
    ("produce-timestamp", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "timestamp": "now"}}, 400, "invalid_timestamp"),
    ("produce-json", "POST", "/produce", "/produce", {"content": b"[1,", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("produce-body", "POST", "/produce", "/produce", {"json": ["x"]}, 400, "invalid_body"),
    ("produce-too-many-messages", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "messages": [{"value": ""}] * 10_001}}, 413, "too_many_messages"),
    ("produce-too-many-headers", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "value": "x", "headers": [["h", "v"]] * 65}}, 413, "too_many_headers"),
    ("ack-missing", "POST", "/ack", "/ack", {"json": {}}, 400, "missing_request_id"),
    ("ack-empty-body", "POST", "/ack", "/ack", {}, 400, "missing_request_id"),
    ("ack-garbage", "POST", "/ack", "/ack", {"json": {"requestId": "garbage"}}, 400, "invalid_request_id"),
    ("ack-type", "POST", "/ack", "/ack", {"json": {"requestId": 123}}, 400, "invalid_request_id"),
    ("ack-json", "POST", "/ack", "/ack", {"content": b"{", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("ack-body", "POST", "/ack", "/ack", {"json": "requestId"}, 400, "invalid_body"),
    ("ack-query-garbage", "POST", "/ack", "/ack", {"params": {"requestId": "garbage"}}, 400, "invalid_request_id"),
    ("extend-missing", "POST", "/extend", "/extend", {"json": {}}, 400, "missing_request_id"),
    ("extend-garbage", "POST", "/extend", "/extend", {"json": {"requestId": "AAAA"}}, 400, "invalid_request_id"),
    ("unlock-missing", "POST", "/unlock", "/unlock", {"json": {}}, 400, "missing_request_id"),
    ("unlock-garbage", "POST", "/unlock", "/unlock", {"json": {"requestId": "AAAA"}}, 400, "invalid_request_id"),
    ("produce-producer-name", "POST", "/produce", "/produce", {"json": {"topic": "{topic}", "producer": "a:b", "value": "x"}}, 400, "invalid_producer"),
    ("consumer-get-unknown", "GET", "/admin/consumers/{missing}", "/admin/consumers/{consumer}", {}, 404, "unknown_consumer"),
    ("consumer-get-group", "GET", "/admin/consumers/a:b", "/admin/consumers/{consumer}", {}, 400, "invalid_consumer"),
    ("consumer-put-group", "PUT", "/admin/consumers/a:b", "/admin/consumers/{consumer}", {"json": {"topics": ["t"]}}, 400, "invalid_consumer"),
    ("consumer-patch-group", "PATCH", "/admin/consumers/a%7Bb%7D", "/admin/consumers/{consumer}", {"json": {}}, 400, "invalid_consumer"),
    ("consumer-delete-group", "DELETE", "/admin/consumers/a:b", "/admin/consumers/{consumer}", {}, 400, "invalid_consumer"),
    ("consumer-put-missing-topics", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"start": "earliest"}}, 400, "missing_topics"),
    ("consumer-put-topics-empty", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": []}}, 400, "invalid_topics"),
    ("consumer-put-topics-type", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": "t"}}, 400, "invalid_topics"),
    ("consumer-put-topic-name", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": ["a b"]}}, 400, "invalid_topic"),
    ("consumer-put-topic-empty", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": [""]}}, 400, "missing_topic"),
    ("consumer-put-mode", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": ["t"], "mode": "fanout"}}, 400, "invalid_mode"),
    ("consumer-put-unknown-field", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": ["t"], "group": "g"}}, 400, "unknown_field"),
    ("consumer-put-body", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": ["t"]}, 400, "invalid_body"),
    ("consumer-put-json", "PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"content": b"{", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("consumer-patch-unknown-field", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"timeout": 5}}, 400, "unknown_field"),
    ("consumer-patch-start", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"start": "middle"}}, 400, "invalid_start"),
    ("consumer-patch-timeout-low", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"consumeTimeoutMs": 50}}, 400, "invalid_consume_timeout_ms"),
    ("consumer-patch-timeout-high", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"consumeTimeoutMs": 86_400_001}}, 400, "invalid_consume_timeout_ms"),
    ("consumer-patch-timeout-text", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"consumeTimeoutMs": "soon"}}, 400, "invalid_consume_timeout_ms"),
    ("consumer-patch-timeout-empty", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"consumeTimeoutMs": ""}}, 400, "invalid_consume_timeout_ms"),
    ("consumer-patch-max-batch", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"maxBatch": 0}}, 400, "invalid_max_batch"),
    ("consumer-patch-paused", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"paused": "yes"}}, 400, "invalid_paused"),
    ("consumer-patch-mode", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"mode": 1}}, 400, "invalid_mode"),
    ("consumer-patch-rate-type", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"rateLimit": 5}}, 400, "invalid_rate_limit"),
    ("consumer-patch-rate-low", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"rateLimit": {"messagesPerSecond": 0}}}, 400, "invalid_rate_limit"),
    ("consumer-patch-rate-missing", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"rateLimit": {"burst": 5}}}, 400, "invalid_rate_limit"),
    ("consumer-patch-burst", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"rateLimit": {"messagesPerSecond": 1, "burst": 0}}}, 400, "invalid_rate_limit"),
    ("consumer-patch-rate-field", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"rateLimit": {"messagesPerSecond": 1, "per": "s"}}}, 400, "unknown_field"),
    ("consumer-patch-retry-type", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"retry": []}}, 400, "invalid_retry"),
    ("consumer-patch-retry-attempts", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"retry": {"maxAttempts": 0}}}, 400, "invalid_retry"),
    ("consumer-patch-retry-multiplier", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"retry": {"multiplier": 0.5}}}, 400, "invalid_retry"),
    ("consumer-patch-retry-field", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"retry": {"attempts": 3}}}, 400, "unknown_field"),
    ("consumer-patch-dead-letter", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"retry": {"deadLetterTopic": "a b"}}}, 400, "invalid_topic"),
    ("consumer-patch-alerts-type", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"alerts": "high"}}, 400, "invalid_alerts"),
    ("consumer-patch-alerts", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"alerts": {"backlogMessages": 0}}}, 400, "invalid_alerts"),
    ("consumer-patch-alerts-field", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"alerts": {"lag": 1}}}, 400, "unknown_field"),
    ("consumer-patch-body", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": [1]}, 400, "invalid_body"),
    ("consumer-patch-json", "PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"content": b"nope", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("consumer-delete-flag", "DELETE", "/admin/consumers/g", "/admin/consumers/{consumer}", {"params": {"deleteOffsets": "maybe"}}, 400, "invalid_delete_offsets"),
    ("consumer-put-topics-null", "PUT", "/admin/consumers/{missing}", "/admin/consumers/{consumer}", {"json": {"topics": None}}, 400, "invalid_topics"),
    ("pause-group", "POST", "/admin/consumers/a:b/pause", "/admin/consumers/{consumer}/pause", {}, 400, "invalid_consumer"),
    ("resume-group", "POST", "/admin/consumers/a:b/resume", "/admin/consumers/{consumer}/resume", {}, 400, "invalid_consumer"),
    ("reset-group", "POST", "/admin/consumers/a:b/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "earliest"}}, 400, "invalid_consumer"),
    ("reset-missing-topic", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"to": "earliest"}}, 400, "missing_topic"),
    ("reset-unknown-topic", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{missing}", "to": "earliest"}}, 404, "unknown_topic"),
    ("reset-to", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "soon"}}, 400, "invalid_to"),
    ("reset-unknown-field", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "earliest", "when": 1}}, 400, "unknown_field"),
    ("reset-queue-type", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "earliest", "queue": [0]}}, 400, "invalid_queue"),
    ("reset-unknown-queue", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "earliest", "queue": "7"}}, 404, "unknown_queue"),
    ("reset-queue-required", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "offset", "offset": 0}}, 400, "queue_required"),
    ("reset-offset-type", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "offset", "queue": "0", "offset": "0"}}, 400, "invalid_offset"),
    ("reset-offset-range", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "offset", "queue": 0, "offset": 10**12}}, 400, "offset_out_of_range"),
    ("reset-timestamp", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "timestamp", "timestamp": -1}}, 400, "invalid_timestamp"),
    ("reset-client", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": {"topic": "{topic}", "to": "earliest", "clientId": "a:b"}}, 400, "invalid_client_id"),
    ("reset-body", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": []}, 400, "invalid_body"),
    ("reset-json", "POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"content": b"{", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("producer-get-unknown", "GET", "/admin/producers/{missing}", "/admin/producers/{name}", {}, 404, "unknown_producer"),
    ("producer-delete-unknown", "DELETE", "/admin/producers/{missing}", "/admin/producers/{name}", {}, 404, "unknown_producer"),
    ("producer-get-name", "GET", "/admin/producers/a:b", "/admin/producers/{name}", {}, 400, "invalid_producer"),
    ("producer-delete-name", "DELETE", "/admin/producers/a:b", "/admin/producers/{name}", {}, 400, "invalid_producer"),
    ("producer-put-name", "PUT", "/admin/producers/a:b", "/admin/producers/{name}", {"json": {"topics": ["t"]}}, 400, "invalid_producer"),
    ("producer-put-missing-topics", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": {}}, 400, "missing_topics"),
    ("producer-put-topics", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": {"topics": "t"}}, 400, "invalid_topics"),
    ("producer-put-topic", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": {"topics": ["t", None]}}, 400, "missing_topic"),
    ("producer-put-topic-name", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": {"topics": ["t/u"]}}, 400, "invalid_topic"),
    ("producer-put-unknown-field", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": {"topics": ["t"], "mode": "x"}}, 400, "unknown_field"),
    ("producer-put-body", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": "t"}, 400, "invalid_body"),
    ("producer-put-json", "PUT", "/admin/producers/p", "/admin/producers/{name}", {"content": b"[", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("key-missing-name", "POST", "/admin/keys", "/admin/keys", {"json": {"admin": True}}, 400, "missing_name"),
    ("key-name", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "a b", "admin": True}}, 400, "invalid_name"),
    ("key-admin", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "admin": "yes"}}, 400, "invalid_admin"),
    ("key-producers", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "producers": "p"}}, 400, "invalid_producers"),
    ("key-consumers", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "consumers": {"g": 1}}}, 400, "invalid_consumers"),
    ("key-producer-missing", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "producers": [None]}}, 400, "missing_producer"),
    ("key-producer-name", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "producers": ["a:b"]}}, 400, "invalid_producer"),
    ("key-consumer-missing", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "consumers": [""]}}, 400, "missing_consumer"),
    ("key-consumer-name", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "consumers": ["{x}"]}}, 400, "invalid_consumer"),
    ("key-empty-grant", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "admin": False, "consumers": []}}, 400, "empty_grant"),
    ("key-unknown-field", "POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "admin": True, "topics": ["t"]}}, 400, "unknown_field"),
    ("key-body", "POST", "/admin/keys", "/admin/keys", {"json": ["k"]}, 400, "invalid_body"),
    ("key-json", "POST", "/admin/keys", "/admin/keys", {"content": b"{", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("key-get-unknown", "GET", "/admin/keys/0123456789abcdef", "/admin/keys/{key_id}", {}, 404, "unknown_key"),
    ("key-delete-unknown", "DELETE", "/admin/keys/{missing}", "/admin/keys/{key_id}", {}, 404, "unknown_key"),
    ("queues-group", "GET", "/consumers/a%7Bb%7D/queues", "/consumers/{consumer}/queues", {}, 400, "invalid_consumer"),
    ("clients-group", "GET", "/consumers/a:b/clients", "/consumers/{consumer}/clients", {}, 400, "invalid_consumer"),
    ("client-queues-client", "GET", "/consumers/g/clients/a:b/queues", "/consumers/{consumer}/clients/{client_id}/queues", {}, 400, "invalid_client_id"),
    ("client-queues-group", "GET", "/consumers/a:b/clients/c/queues", "/consumers/{consumer}/clients/{client_id}/queues", {}, 400, "invalid_consumer"),
]


def _fill(v: Any, subst: dict[str, str]) -> Any:
    if isinstance(v, str):
        return subst.get(v, v)
    if isinstance(v, dict):
        return {k: _fill(x, subst) for k, x in v.items()}
    if isinstance(v, list):
        return [_fill(x, subst) for x in v]
    return v


@pytest.mark.parametrize("name,method,path,template,kw,status,code",
                         [c if hasattr(c, "marks") else pytest.param(*c, id=c[0]) for c in ERROR_CASES])
def test_error_responses(api: Api, shared_topic: str, name: str, method: str, path: str, template: str,
                         kw: dict[str, Any], status: int, code: str) -> None:
    subst = {"{topic}": shared_topic, "{missing}": f"missing-{uuid.uuid4().hex[:10]}"}
    kw = _fill(kw, subst)
    path = path.replace("{missing}", subst["{missing}"])
    body = call(api, method, path, template, status, code, **kw)
    assert body["error"]["message"]
    if "between" in body["error"]["message"]:
        assert {"min", "max"} <= set(body["error"]["details"]), body
    if code in ("too_many_messages", "too_many_headers"):
        assert "limit" in body["error"]["details"]


@pytest.mark.timeout(120)
def test_fuzzed_requests_match_spec(node_factory: Callable[..., Node], shared_topic: str,
                                    done: Callable[[], None]) -> None:
    """Random bodies: whatever the gateway answers must be a documented status and shape.

    On a node of its own (open mode, auth off, its own key prefix), as the admin calls among
    them may register the consumer and producer ``fz`` in any way and create keys."""
    import random
    import string

    node = node_factory(key_prefix=unique("oafz"))
    api = Api([node.url])
    rnd = random.Random(20241122)
    alphabet = string.ascii_letters + string.digits + "._-:{} /\u00e9\x00"

    def junk(depth: int = 0) -> Any:
        kind = rnd.randrange(7 if depth < 2 else 4)
        if kind == 0:
            return "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(12)))
        if kind == 1:
            return rnd.choice([0, 1, -1, 2, 1000, 1001, 10**12, True, False])
        if kind == 2:
            return None
        if kind == 3:
            return rnd.choice([1.5, 2.0, "5", "", "utf8", "base64", "earliest", "aGk=", "fz", "broadcast",
                               shared_topic, [shared_topic]])
        if kind == 4:
            return [junk(depth + 1) for _ in range(rnd.randrange(3))]
        if kind == 5:
            return {rnd.choice(["value", "key", "headers", "x", "messagesPerSecond", "burst",
                                "maxAttempts", "backlogMessages"]): junk(depth + 1)}
        return [[junk(depth + 1), junk(depth + 1)]]

    fields = ["topic", "consumer", "clientId", "max", "requestId", "encoding", "value", "key",
              "headers", "partition", "messages", "timestamp", "start", "consumeTimeoutMs", "producer",
              "topics", "mode", "maxBatch", "paused", "rateLimit", "retry", "alerts", "name", "admin",
              "producers", "consumers", "to", "queue", "offset"]
    own_fields = {
        "/admin/consumers/{consumer}": {"topics", "mode", "consumeTimeoutMs", "maxBatch", "start", "paused",
                                     "rateLimit", "retry", "alerts"},
        "/admin/producers/{name}": {"topics"},
        "/admin/keys": {"name", "admin", "producers", "consumers"},
        "/admin/consumers/{consumer}/reset": {"topic", "to", "timestamp", "offset", "queue", "clientId"},
    }
    targets = [("POST", "/produce", "/produce"), ("POST", "/message", "/message"),
               ("POST", "/ack", "/ack"), ("POST", "/unlock", "/unlock"),
               ("PUT", "/admin/consumers/fz", "/admin/consumers/{consumer}"),
               ("PATCH", "/admin/consumers/fz", "/admin/consumers/{consumer}"),
               ("PUT", "/admin/producers/fz", "/admin/producers/{name}"),
               ("POST", "/admin/keys", "/admin/keys"),
               ("POST", "/admin/consumers/fz/reset", "/admin/consumers/{consumer}/reset")]
    statuses: set[int] = set()
    try:
        for _ in range(120):
            body = {f: junk() for f in rnd.sample(fields, rnd.randrange(1, 5))}
            if rnd.random() < 0.6:
                body["topic"] = shared_topic
            if rnd.random() < 0.4:
                body["consumer"] = "fz"
            for method, path, template in targets:
                sent = body
                if template in own_fields and rnd.random() < 0.7:
                    sent = {k: v for k, v in body.items() if k in own_fields[template]}
                r = api.http.request(method, api.url(path), json=sent)
                check(r, template)
                statuses.add(r.status_code)
            r = api.http.get(api.url("/message"), params={k: v for k, v in body.items() if isinstance(v, str)})
            check(r, "/message")
        assert 400 in statuses and 200 in statuses
        done()
    finally:
        api.http.close()


@pytest.mark.parametrize("method,path", [("GET", "/nope"), ("GET", "/consumers/g/x"), ("POST", "/consumers/g/queues/x"),
                                         ("GET", "/consumers/g/config"), ("PUT", "/consumers/g/config"),
                                         ("GET", "/admin/consumers/g/queues")])
def test_unknown_route_is_404_error_body(api: Api, method: str, path: str) -> None:
    assert not any(re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path) for p in SPEC["paths"])
    r = api.http.request(method, api.url(path))
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert_valid(r.json(), "/components/schemas/Error", f"{method} {path}")
    assert r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("method,path", [("GET", "/produce"), ("DELETE", "/message"), ("PUT", "/ack"),
                                         ("POST", "/healthz"), ("DELETE", "/consumers/g/queues"),
                                         ("POST", "/admin/consumers"), ("POST", "/admin/consumers/g"),
                                         ("GET", "/admin/consumers/g/pause"), ("PATCH", "/admin/producers/p"),
                                         ("DELETE", "/admin/keys"), ("PUT", "/admin/keys/0123456789abcdef"),
                                         ("GET", "/consumers/g"), ("PUT", "/topics/t"),
                                         ("DELETE", "/topics/t/partitions/0"), ("POST", "/brokers")])
def test_undocumented_method_is_405_error_body(api: Api, method: str, path: str) -> None:
    """In the gateway's error shape, or under a path only the REST v2 API has, in its shape
    (``{"error_code", "message"}``, as every other answer there)."""
    template = next(p for p in SPEC["paths"] if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path))
    assert method.lower() not in SPEC["paths"][template]
    r = api.http.request(method, api.url(path))
    assert r.status_code == 405
    if path.startswith(("/topics", "/brokers", "/consumers/g")) and "/queues" not in path:
        assert r.headers["content-type"] == "application/vnd.kafka.v2+json"
        assert_valid(r.json(), "/components/schemas/V2Error", f"{method} {path}")
        assert r.json()["error_code"] == 405 and r.json()["code"] == "method_not_allowed"
        return
    assert_valid(r.json(), "/components/schemas/Error", f"{method} {path}")
    assert r.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.timeout(120)
def test_body_too_large(node_factory: Callable[..., Node], shared_topic: str, done: Callable[[], None]) -> None:
    node = node_factory(max_body_bytes=512)
    api = Api([node.url])
    try:
        big = {"topic": shared_topic, "value": "x" * 1000}
        cases = [("POST", "/produce", "/produce"), ("POST", "/message", "/message"), ("POST", "/ack", "/ack"),
                 ("POST", "/nack", "/nack"), ("POST", "/extend", "/extend"), ("POST", "/unlock", "/unlock"),
                 ("POST", "/admin/consumers/g/dead-letters/redrive",
                  "/admin/consumers/{consumer}/dead-letters/redrive"), ("PUT", "/admin/consumers/g", "/admin/consumers/{consumer}"),
                 ("PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}"),
                 ("POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset"),
                 ("PUT", "/admin/producers/p", "/admin/producers/{name}"), ("POST", "/admin/keys", "/admin/keys"),
                 ("POST", "/admin/topics", "/admin/topics")]
        i = "/consumers/{group}/instances/{instance}"
        v2 = [("POST", f"/topics/{shared_topic}", "/topics/{topic}"),
              ("POST", f"/topics/{shared_topic}/partitions/0", "/topics/{topic}/partitions/{partition}"),
              ("POST", "/consumers/g", "/consumers/{group}"),
              ("POST", "/consumers/g/instances/i/subscription", i + "/subscription"),
              ("POST", "/consumers/g/instances/i/offsets", i + "/offsets"),
              ("GET", "/consumers/g/instances/i/offsets", i + "/offsets"),
              ("POST", "/consumers/g/instances/i/positions", i + "/positions"),
              ("POST", "/consumers/g/instances/i/positions/", i + "/positions/"),
              ("POST", "/consumers/g/instances/i/positions/beginning", i + "/positions/beginning"),
              ("POST", "/consumers/g/instances/i/positions/end", i + "/positions/end")]
        documented = {(p, m) for p, m, op in operations() if "requestBody" in op}
        assert {(t, m.lower()) for m, _, t in cases + v2} == documented, \
            "every operation with a body is covered"
        for method, path, template in cases + v2:
            ctype = "application/vnd.kafka.json.v2+json" if (method, template) in \
                {(m, t) for m, _, t in v2} else "application/json"
            body = call(api, method, path, template, 413, "body_too_large",  # declared length
                        content=orjson.dumps(big), headers={"content-type": ctype})
            assert body.get("error", body).get("details", {"limit": 512}) == {"limit": 512}
            chunks = iter([b'{"topic": "', b"x" * 400, b"x" * 400, b'"}'])  # chunked: no length given
            call(api, method, path, template, 413, "body_too_large", content=chunks,
                 headers={"content-type": ctype})
        # within the limit it works
        produce(api, {"topic": shared_topic, "value": "small"})
        done()
    finally:
        api.http.close()


@contextlib.contextmanager
def lone_node(redis_url: str, bootstrap: str, tmp: Path) -> Iterator[Api]:
    """One node of its own (e.g. pointed at a dead Redis or broker), stopped afterwards."""
    node = start_node(redis_url, bootstrap, tmp)
    api = Api([node.url])
    try:
        yield api
    finally:
        api.http.close()
        node.stop()


def dependency_errors(api: Api, dependency: str) -> float:
    text = call(api, "GET", "/metrics", status=200)
    m = re.search(rf'^mqgw_dependency_errors_total\{{dependency="{dependency}"\}} (\S+)$', text, re.M)
    assert m, f"mqgw_dependency_errors_total{{dependency={dependency!r}}} is missing"
    return float(m.group(1))


@pytest.mark.timeout(120)
def test_dependency_unavailable(bootstrap: str, tmp_path: Path, shared_topic: str,
                                done: Callable[[], None]) -> None:
    dead = f"redis://127.0.0.1:{devstack.free_port()}/0"  # nothing listens there
    with lone_node(dead, bootstrap, tmp_path) as api:
        ready = call(api, "GET", "/readyz", status=503)
        reasons = ready.pop("reasons")
        assert ready == {"status": "unavailable", "checks": {"redis": False, "broker": True}}
        assert set(reasons) == {"redis"} and reasons["redis"], reasons  # what is wrong, said
        assert call(api, "GET", "/healthz", status=200) == {"status": "ok"}
        rid = RequestIdCodec(HMAC_KEY).encode(BatchRef("kafka", "g", "", shared_topic, "0", 0, 1, 1))
        reset = {"topic": shared_topic, "to": "earliest"}
        cases = [
            ("GET", "/message", "/message", {"params": {"consumer": "g", "topic": shared_topic}}),
            ("POST", "/message", "/message", {"json": {"consumer": "g", "topic": shared_topic}}),
            ("POST", "/ack", "/ack", {"json": {"requestId": rid}}),
            ("POST", "/nack", "/nack", {"json": {"requestId": rid}}),
            ("POST", "/extend", "/extend", {"json": {"requestId": rid}}),
            ("POST", "/unlock", "/unlock", {"json": {"requestId": rid}}),
            ("POST", "/produce", "/produce", {"json": {"topic": shared_topic, "producer": "p", "value": "x"}}),
            ("DELETE", f"/delayed/{DelayIds(HMAC_KEY).new(2 ** 42, shared_topic)}?producer=p",
             "/delayed/{delay_id}", {}),
            ("GET", "/consumers/g/queues", "/consumers/{consumer}/queues", {}),
            ("GET", "/consumers/g/clients", "/consumers/{consumer}/clients", {}),
            ("GET", "/consumers/g/clients/c/queues", "/consumers/{consumer}/clients/{client_id}/queues", {}),
            ("GET", "/admin/consumers", "/admin/consumers", {}),
            ("GET", "/admin/consumers/g", "/admin/consumers/{consumer}", {}),
            ("PUT", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"topics": [shared_topic]}}),
            ("PATCH", "/admin/consumers/g", "/admin/consumers/{consumer}", {"json": {"start": "earliest"}}),
            ("DELETE", "/admin/consumers/g", "/admin/consumers/{consumer}", {}),
            ("POST", "/admin/consumers/g/pause", "/admin/consumers/{consumer}/pause", {}),
            ("POST", "/admin/consumers/g/resume", "/admin/consumers/{consumer}/resume", {}),
            ("POST", "/admin/consumers/g/reset", "/admin/consumers/{consumer}/reset", {"json": reset}),
            ("GET", "/admin/consumers/g/dead-letters", "/admin/consumers/{consumer}/dead-letters", {}),
            ("POST", "/admin/consumers/g/dead-letters/redrive",
             "/admin/consumers/{consumer}/dead-letters/redrive", {}),
            ("GET", "/admin/producers", "/admin/producers", {}),
            ("GET", "/admin/producers/p", "/admin/producers/{name}", {}),
            ("PUT", "/admin/producers/p", "/admin/producers/{name}", {"json": {"topics": [shared_topic]}}),
            ("DELETE", "/admin/producers/p", "/admin/producers/{name}", {}),
            ("GET", "/admin/keys", "/admin/keys", {}),
            ("POST", "/admin/keys", "/admin/keys", {"json": {"name": "k", "admin": True}}),
            ("GET", "/admin/keys/0123456789abcdef", "/admin/keys/{key_id}", {}),
            ("DELETE", "/admin/keys/0123456789abcdef", "/admin/keys/{key_id}", {}),
            ("GET", "/admin/backlog", "/admin/backlog", {}),
            ("GET", "/admin/alerts", "/admin/alerts", {}),
            ("POST", "/admin/alerts/evaluate", "/admin/alerts/evaluate", {}),
            ("POST", f"/topics/{shared_topic}?producer=p", "/topics/{topic}",
             {"content": b'{"records": [{"value": 1}]}', "headers": V2_JSON}),
            ("POST", f"/topics/{shared_topic}/partitions/0?producer=p",
             "/topics/{topic}/partitions/{partition}",
             {"content": b'{"records": [{"value": 1}]}', "headers": V2_JSON}),
            ("POST", "/consumers/g", "/consumers/{group}", {"json": {"name": "i"}}),
            ("DELETE", "/consumers/g/instances/i", V2_I, {}),
            ("GET", "/consumers/g/instances/i/subscription", V2_I + "/subscription", {}),
            ("POST", "/consumers/g/instances/i/subscription", V2_I + "/subscription",
             {"json": {"topics": [shared_topic]}}),
            ("DELETE", "/consumers/g/instances/i/subscription", V2_I + "/subscription", {}),
            ("GET", "/consumers/g/instances/i/records", V2_I + "/records", {}),
            ("POST", "/consumers/g/instances/i/offsets", V2_I + "/offsets", {}),
            ("GET", "/consumers/g/instances/i/offsets", V2_I + "/offsets",
             {"json": {"partitions": [{"topic": shared_topic, "partition": 0}]}}),
            *[("POST", f"/consumers/g/instances/i/positions{p}", V2_I + f"/positions{p}",
               {"json": {"partitions": [{"topic": shared_topic, "partition": 0}]}})
              for p in ("/beginning", "/end")],
            *[("POST", f"/consumers/g/instances/i/positions{p}", V2_I + f"/positions{p}",
               {"json": {"offsets": [{"topic": shared_topic, "partition": 0, "offset": 0}]}})
              for p in ("", "/")],
            ("GET", "/consumers/g/instances/i/assignments", V2_I + "/assignments", {}),
            ("POST", "/consumers/g/instances/i/assignments", V2_I + "/assignments", {}),
        ]
        before = dependency_errors(api, "redis")
        for method, path, template, kw in cases:
            call(api, method, path, template, 503, "unavailable", **kw)
        assert dependency_errors(api, "redis") - before == len(cases)  # every 503, once
        # every operation that reads or writes Redis is covered: all but the open ones, and the
        # topic operations, which (with auth off) ask the broker only
        covered = {(t, m.lower()) for m, _, t, _ in cases}
        assert covered == {(p, m) for p, m, _ in operations()
                           if (p, m) not in OPEN_OPERATIONS | BROKER_ONLY_OPERATIONS}
        call(api, "GET", f"/admin/topics/{shared_topic}", "/admin/topics/{topic}", 200)
        # producing needs no Redis (in open mode, naming no producer), nor do the metrics
        produce(api, {"topic": shared_topic, "value": "still works"})
        assert "mqgw_requests_total" in call(api, "GET", "/metrics", status=200)
        done()


@pytest.mark.slow  # waits out the broker's metadata timeouts (~13 s)
@pytest.mark.timeout(120)
def test_broker_unavailable(redis_url: str, tmp_path: Path) -> None:
    """Kafka unreachable: readiness fails, and producing or fetching answers 503 (after the
    metadata timeout), never a 500 or a hang; the metric counts it."""
    dead = f"127.0.0.1:{devstack.free_port()}"  # nothing listens there
    with lone_node(redis_url, dead, tmp_path) as api:
        ready = call(api, "GET", "/readyz", status=503)
        reasons = ready.pop("reasons")
        assert ready == {"status": "unavailable", "checks": {"redis": True, "broker": False}}
        assert set(reasons) == {"broker"} and reasons["broker"], reasons
        # Each answer comes after the metadata timeout (~13 s each on an idle machine, 39 s for
        # both once on a loaded CI machine): a hang is what the client's own timeout (60 s a
        # request) and the test's catch, not a wall-clock bound that load can break.
        call(api, "POST", "/produce", "/produce", 503, "unavailable", json={"topic": "t", "value": "x"})
        call(api, "GET", "/message", "/message", 503, "unavailable",
             params={"consumer": unique(), "topic": "t"})
        assert dependency_errors(api, "broker") == 2


def test_zz_every_operation_was_exercised() -> None:
    """Runs last: every documented operation got at least one live response validated."""
    drivers = {name for name, obj in globals().items() if name.startswith("test_") and callable(obj)
               and "done" in obj.__code__.co_varnames[:obj.__code__.co_argcount]}
    if not drivers <= DRIVERS_DONE:
        pytest.skip(f"only meaningful after the whole module ran (missing: {sorted(drivers - DRIVERS_DONE)})")
    exercised_ops = {(p, m) for p, m, _ in EXERCISED}
    missing = {(p, m) for p, m, _ in operations()} - exercised_ops
    assert not missing, f"operations never exercised: {sorted(missing)}"
