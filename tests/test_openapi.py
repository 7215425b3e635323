"""openapi.yaml describes the running gateway: every route, every status, every response body.

The document itself is checked (OpenAPI 3.1, every ``$ref`` resolves, every schema is a valid
JSON Schema of the OAS 3.1 dialect, every example matches its schema), its paths are compared
with ``gateway.http.routes`` both ways, and then real requests go through real gateway
processes (conftest's cluster: uvicorn + redis-server + the broker): each response's status
must be documented for its operation and its body must validate against the declared schema.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, unquote

import httpx
import jsonschema
import pytest
import redis
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from .conftest import HMAC_KEY, Api, Node, start_node, unique
from gateway import devstack
from gateway.config import Settings
from gateway.http import routes
from gateway.requestid import BatchRef, RequestIdCodec

ROOT = Path(__file__).resolve().parent.parent
SPEC_PATH = ROOT / "openapi.yaml"
SPEC: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text())
#: Base URI the document is registered under, so "#/components/..." refs resolve inside it.
SPEC_URI = "https://mq-gateway.invalid/openapi.yaml"
OAS31_DIALECT = "https://spec.openapis.org/oas/3.1/dialect/base"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

pytestmark = pytest.mark.timeout(60)


# -- the OpenAPI 3.1 schema dialect --------------------------------------------------------------
# The OAS 3.1 base dialect is JSON Schema 2020-12 plus the OAS vocabulary, whose keywords are
# annotations (example, xml, externalDocs) except ``discriminator``, which we check: the
# instance must name its variant and validate against the mapped schema.

def _annotation(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    return iter(())


def _discriminator(validator: Any, d: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    name = d["propertyName"]
    if name not in instance:
        yield ValidationError(f"discriminator property {name!r} is missing")
        return
    mapping = d.get("mapping")
    if mapping is None:
        return
    if instance[name] not in mapping:
        yield ValidationError(f"{name}={instance[name]!r} is not one of {sorted(mapping)}")
        return
    yield from validator.descend(instance, {"$ref": mapping[instance[name]]})


OAS31Validator = jsonschema.validators.extend(
    Draft202012Validator,
    {"discriminator": _discriminator, "example": _annotation, "xml": _annotation,
     "externalDocs": _annotation},
)
REGISTRY: Registry = Registry().with_resource(SPEC_URI, DRAFT202012.create_resource(SPEC))


def esc(segment: str) -> str:
    """One JSON pointer segment, escaped for a URI fragment."""
    return quote(segment.replace("~", "~0").replace("/", "~1"), safe="~")


def lookup(pointer: str) -> Any:
    node: Any = SPEC
    for seg in pointer.lstrip("/").split("/"):
        seg = unquote(seg).replace("~1", "/").replace("~0", "~")
        node = node[int(seg)] if isinstance(node, list) else node[seg]
    return node


def deref(obj: Any, pointer: str) -> tuple[Any, str]:
    """Follow OpenAPI-level ``$ref`` (responses, parameters, request bodies, headers)."""
    seen = set()
    while isinstance(obj, dict) and "$ref" in obj:
        ref = obj["$ref"]
        assert ref.startswith("#/"), f"only local refs are used: {ref}"
        assert ref not in seen, f"$ref loop at {ref}"
        seen.add(ref)
        pointer = ref[1:]
        obj = lookup(pointer)
    return obj, pointer


def validator_at(pointer: str) -> Any:
    return OAS31Validator({"$ref": f"{SPEC_URI}#{pointer}"}, registry=REGISTRY)


def assert_valid(instance: Any, pointer: str, what: str) -> None:
    error = best_match(validator_at(pointer).iter_errors(instance))
    if error is not None:
        raise AssertionError(
            f"{what} does not match the schema at #{pointer}: {error.message}\n"
            f"  at instance path {list(error.absolute_path)}, schema path {list(error.absolute_schema_path)}\n"
            f"  instance: {instance!r}"[:3000])


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in SPEC["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                yield path, method, item[method]


# -- checking live responses ----------------------------------------------------------------------

#: (path template, method, status) of every response validated in this session.
EXERCISED: set[tuple[str, str, str]] = set()
#: Names of the tests that drive requests and completed.
DRIVERS_DONE: set[str] = set()


def check(resp: httpx.Response, template: str, status: int | None = None,
          code: str | None = None) -> Any:
    """Assert the response is documented for its operation and matches the declared schema."""
    method = resp.request.method.lower()
    item = SPEC["paths"].get(template)
    assert item is not None and method in item, f"{method.upper()} {template} is not documented"
    op = item[method]
    st = str(resp.status_code)
    assert st in op["responses"], (
        f"{method.upper()} {template} answered {st}, which the spec does not document for it "
        f"(documented: {sorted(op['responses'])}): {resp.text[:500]}")
    if status is not None:
        assert resp.status_code == status, f"{method.upper()} {resp.request.url}: {resp.status_code} {resp.text[:500]}"
    response, ptr = deref(op["responses"][st], f"/paths/{esc(template)}/{method}/responses/{st}")
    content = response.get("content") or {}
    ctype = resp.headers.get("content-type", "").split(";")[0].strip()
    assert ctype in content, f"{method.upper()} {template} {st}: content type {ctype!r} not in {sorted(content)}"
    body: Any = resp.json() if ctype.endswith("json") else resp.text
    assert_valid(body, f"{ptr}/content/{esc(ctype)}/schema", f"{method.upper()} {template} {st} body")
    for name, header in (response.get("headers") or {}).items():
        header, hptr = deref(header, f"{ptr}/headers/{esc(name)}")
        assert name in resp.headers, f"{method.upper()} {template} {st}: header {name} missing"
        value: Any = resp.headers[name]
        if header["schema"].get("type") == "integer":
            value = int(value)
        assert_valid(value, f"{hptr}/schema", f"header {name}")
    if code is not None:
        assert body["error"]["code"] == code, body
    EXERCISED.add((template, method, st))
    return body


def check_request_body(body: Any, template: str, method: str) -> None:
    """A request body we send as a valid request must match the documented request schema."""
    rb, ptr = deref(SPEC["paths"][template][method]["requestBody"],
                    f"/paths/{esc(template)}/{method}/requestBody")
    assert_valid(body, f"{ptr}/content/application~1json/schema", f"{method.upper()} {template} request")


def check_query(params: dict[str, Any], template: str, method: str) -> None:
    """Query parameters of a valid request must be documented and match their schemas."""
    op = SPEC["paths"][template][method]
    declared = {}
    for i, p in enumerate(op.get("parameters", [])):
        p, pptr = deref(p, f"/paths/{esc(template)}/{method}/parameters/{i}")
        if p["in"] == "query":
            declared[p["name"]] = (p, pptr)
    for name, value in params.items():
        assert name in declared, f"query parameter {name} of {method.upper()} {template} is not documented"
        p, pptr = declared[name]
        if p["schema"].get("type") == "integer":
            value = int(value)
        assert_valid(value, f"{pptr}/schema", f"query parameter {name}")
    for name, (p, _) in declared.items():
        if p.get("required"):
            assert name in params, f"required query parameter {name} missing"


# -- small clients ------------------------------------------------------------------------------------

def call(api: Api, method: str, path: str, template: str | None = None, status: int | None = None,
         code: str | None = None, **kw: Any) -> Any:
    r = api.http.request(method, api.url(path), **kw)
    return check(r, template or path, status, code)


def put_config(api: Api, group: str, values: dict[str, Any]) -> dict[str, Any]:
    check_request_body(values, "/consumers/{group}/config", "put")
    body = call(api, "PUT", f"/consumers/{group}/config", "/consumers/{group}/config", 200, json=values)
    for k, v in values.items():
        assert body[k] == v
    return body


def produce(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    check_request_body(body, "/produce", "post")
    out = call(api, "POST", "/produce", status=200, json=body)
    assert out["failed"] == 0, out
    return out


def fetch(api: Api, headers: dict[str, str] | None = None, **params: Any) -> dict[str, Any]:
    check_query(params, "/message", "get")
    r = api.http.get(api.url("/message"), params=params, headers=headers)
    return check(r, "/message", 200)


def fetch_ok(api: Api, **params: Any) -> dict[str, Any]:
    params.setdefault("wait_ms", 5000)
    body = fetch(api, **params)
    assert body["status"] == "ok", body
    return body


def ack(api: Api, rid: str, status: int = 200) -> dict[str, Any]:
    check_request_body({"requestId": rid}, "/ack", "post")
    return call(api, "POST", "/ack", status=status, json={"requestId": rid})


def unlock(api: Api, rid: str, status: int = 200) -> dict[str, Any]:
    return call(api, "POST", "/unlock", status=status, json={"requestId": rid})


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def forge(rid: str) -> str:
    """The same requestId with one character in the middle changed."""
    i = len(rid) // 2
    return rid[:i] + ("A" if rid[i] != "A" else "B") + rid[i + 1:]


def route_pairs() -> set[tuple[str, str]]:
    out = set()
    for r in routes:
        path = re.sub(r"\{([^}:]+)(?::[^}]+)?\}", r"{\1}", r.path)  # drop starlette converters
        for m in r.methods or ():
            if m != "HEAD":  # starlette adds HEAD to every GET route by itself
                out.add((path, m.lower()))
    return out


# -- fixtures -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_topic(bootstrap: str) -> str:
    name = f"oa-{uuid.uuid4().hex[:10]}"
    devstack.create_topic(bootstrap, name, 2)
    return name


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
    for pointer, node in _walk(SPEC):
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
    text = call(api, "GET", "/openapi.yaml", status=200)
    assert yaml.safe_load(text) == SPEC, "the gateway serves another document than openapi.yaml"
    done()


def test_produce_fetch_ack_empty(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    assert call(api, "GET", f"/consumers/{g}/config", "/consumers/{group}/config", 200)["consumer"] == g
    put_config(api, g, {"start": "earliest"})

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
    view = call(api, "GET", f"/consumers/{g}/queues", "/consumers/{group}/queues", 200)
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


def test_post_message_and_base64(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    put_config(api, g, {"start": "earliest", "consumeTimeoutMs": 5000})
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
    put_config(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": f"m{i}"} for i in range(10)]})

    a = fetch_ok(api, consumer=g, topic=topic, max=2,
                 headers={"X-Forwarded-For": "203.0.113.7, 10.0.0.1"})
    assert fetch(api, consumer=g, topic=topic, max=2)["status"] == "empty"  # the only queue is locked
    (q,) = call(api, "GET", f"/consumers/{g}/queues", "/consumers/{group}/queues", 200)["queues"]
    assert q["locked"] is True and isinstance(q["lockAgeMs"], int) and q["lastClientAddress"] == "203.0.113.7"

    u = unlock(api, a["requestId"])
    assert u == {"result": "unlocked", "committedOffset": 0}
    assert unlock(api, a["requestId"]) == {"result": "not_locked", "committedOffset": 0}
    b = fetch_ok(api, consumer=g, topic=topic, max=2)  # handed back: delivered again at once
    assert b["offset"] == 0 and b["messages"] == a["messages"] and b["redelivered"] is False
    r = ack(api, a["requestId"], 409)  # b holds the queue now
    assert r["result"] == "lock_lost" and r["error"]["code"] == "lock_lost" and r["committedOffset"] == 0
    assert unlock(api, a["requestId"], 409)["result"] == "lock_lost"

    # a lock that times out is taken over: the batch is redelivered, the old holder's ack loses
    put_config(api, g, {"consumeTimeoutMs": 100})
    time.sleep(0.3)
    c = fetch_ok(api, consumer=g, topic=topic, max=2)
    assert c["offset"] == 0 and c["redelivered"] is True and c["lockTimeoutMs"] == 100
    assert ack(api, b["requestId"], 409)["result"] == "lock_lost"
    time.sleep(0.3)  # c's lock expires too, but nobody takes the queue: a late ack still counts
    r = ack(api, c["requestId"])
    assert (r["result"], r["lock"], r["committedOffset"]) == ("committed", "expired", c["nextOffset"])

    # an ack after an unlock still commits when nobody fetched in between
    put_config(api, g, {"consumeTimeoutMs": 60_000})
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
    put_config(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": f"v{i}", "partition": i % 2} for i in range(4)]})
    for client in ("c1", "c2"):
        seen = 0
        while seen < 4:  # every broadcast client sees every record
            b = fetch_ok(api, consumer=g, topic=topic, clientId=client, max=10)
            seen += len(b["messages"])
            assert ack(api, b["requestId"])["result"] == "committed"
        assert seen == 4
    clients = call(api, "GET", f"/consumers/{g}/clients", "/consumers/{group}/clients", 200)
    assert clients["consumer"] == g and clients["idleExpiryMs"] > 0
    assert sorted(c["clientId"] for c in clients["clients"]) == ["c1", "c2"]
    tmpl = "/consumers/{group}/clients/{client_id}/queues"
    view = call(api, "GET", f"/consumers/{g}/clients/c1/queues", tmpl, 200)
    assert view["clientId"] == "c1" and [q["queue"] for q in view["queues"]] == ["0", "1"]
    assert all(q["committedOffset"] == 2 and q["backlog"] == 0 for q in view["queues"])
    # cluster mode of the same consumer has read nothing
    view = call(api, "GET", f"/consumers/{g}/queues", "/consumers/{group}/queues", 200)
    assert view["clientId"] is None and view["queues"] == []
    assert call(api, "GET", f"/consumers/{g}/clients/nobody/queues", tmpl, 200)["queues"] == []
    done()


def test_admin_pause_resume_reset(api: Api, make_topic: Callable[..., str], done: Callable[[], None]) -> None:
    topic, g = make_topic(1), unique()
    put_config(api, g, {"start": "earliest"})
    produce(api, {"topic": topic, "messages": [{"value": "a"}, {"value": "b"}]})
    out = fetch_ok(api, consumer=g, topic=topic, max=1)
    tmpl = "/admin/consumers/{group}/"
    assert call(api, "POST", f"/admin/consumers/{g}/pause", tmpl + "pause", 200)["paused"] is True
    assert fetch(api, consumer=g, topic=topic)["status"] == "paused"
    assert call(api, "GET", f"/consumers/{g}/config", "/consumers/{group}/config", 200)["paused"] is True
    assert call(api, "POST", f"/admin/consumers/{g}/resume", tmpl + "resume", 200)["paused"] is False
    body = {"topic": topic, "to": "latest"}
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


# (name, method, path, path template, request kwargs, status, error code); {topic} is an
# existing topic, {missing} one that does not exist.
ERROR_CASES: list[tuple[str, str, str, str, dict[str, Any], int, str]] = [
    ("message-missing-topic", "GET", "/message", "/message", {"params": {"consumer": "g"}}, 400, "missing_topic"),
    ("message-missing-consumer", "GET", "/message", "/message", {"params": {"topic": "{topic}"}}, 400, "missing_consumer"),
    ("message-unknown-topic", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{missing}"}}, 404, "unknown_topic"),
    ("message-invalid-topic", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "a b"}}, 400, "invalid_topic"),
    ("message-invalid-consumer", "GET", "/message", "/message", {"params": {"consumer": "a:b", "topic": "{topic}"}}, 400, "invalid_consumer"),
    ("message-invalid-client", "GET", "/message", "/message", {"params": {"consumer": "g", "clientId": "c{1}", "topic": "{topic}"}}, 400, "invalid_client_id"),
    ("message-max-0", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max": "0"}}, 400, "invalid_max"),
    ("message-max-1001", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max": "1001"}}, 400, "invalid_max"),
    ("message-max-text", "GET", "/message", "/message", {"params": {"consumer": "g", "topic": "{topic}", "max": "ten"}}, 400, "invalid_max"),
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
    ("unlock-missing", "POST", "/unlock", "/unlock", {"json": {}}, 400, "missing_request_id"),
    ("unlock-garbage", "POST", "/unlock", "/unlock", {"json": {"requestId": "AAAA"}}, 400, "invalid_request_id"),
    ("config-unknown-field", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": {"timeout": 5}}, 400, "unknown_field"),
    ("config-start", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": {"start": "middle"}}, 400, "invalid_start"),
    ("config-timeout-low", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": {"consumeTimeoutMs": 50}}, 400, "invalid_consume_timeout_ms"),
    ("config-timeout-high", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": {"consumeTimeoutMs": 86_400_001}}, 400, "invalid_consume_timeout_ms"),
    ("config-timeout-text", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": {"consumeTimeoutMs": "soon"}}, 400, "invalid_consume_timeout_ms"),
    ("config-body", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": [1]}, 400, "invalid_body"),
    ("config-json", "PUT", "/consumers/g/config", "/consumers/{group}/config", {"content": b"nope", "headers": {"content-type": "application/json"}}, 400, "invalid_json"),
    ("config-put-group", "PUT", "/consumers/a:b/config", "/consumers/{group}/config", {"json": {}}, 400, "invalid_consumer"),
    ("config-get-group", "GET", "/consumers/a:b/config", "/consumers/{group}/config", {}, 400, "invalid_consumer"),
    ("queues-group", "GET", "/consumers/a%7Bb%7D/queues", "/consumers/{group}/queues", {}, 400, "invalid_consumer"),
    ("clients-group", "GET", "/consumers/a:b/clients", "/consumers/{group}/clients", {}, 400, "invalid_consumer"),
    ("client-queues-client", "GET", "/consumers/g/clients/a:b/queues", "/consumers/{group}/clients/{client_id}/queues", {}, 400, "invalid_client_id"),
    ("client-queues-group", "GET", "/consumers/a:b/clients/c/queues", "/consumers/{group}/clients/{client_id}/queues", {}, 400, "invalid_consumer"),
]


def _fill(v: Any, subst: dict[str, str]) -> Any:
    if isinstance(v, str):
        return subst.get(v, v)
    if isinstance(v, dict):
        return {k: _fill(x, subst) for k, x in v.items()}
    if isinstance(v, list):
        return [_fill(x, subst) for x in v]
    return v


@pytest.mark.parametrize("name,method,path,template,kw,status,code", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_responses(api: Api, shared_topic: str, name: str, method: str, path: str, template: str,
                         kw: dict[str, Any], status: int, code: str) -> None:
    kw = _fill(kw, {"{topic}": shared_topic, "{missing}": f"missing-{uuid.uuid4().hex[:10]}"})
    body = call(api, method, path, template, status, code, **kw)
    assert body["error"]["message"]
    if code in ("invalid_max", "invalid_wait_ms", "invalid_consume_timeout_ms") and "between" in body["error"]["message"]:
        assert set(body["error"]["details"]) == {"min", "max"}
    if code in ("too_many_messages", "too_many_headers"):
        assert "limit" in body["error"]["details"]


def test_fuzzed_requests_match_spec(api: Api, shared_topic: str, done: Callable[[], None]) -> None:
    """Random bodies: whatever the gateway answers must be a documented status and shape."""
    import random
    import string

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
            return rnd.choice([1.5, 2.0, "5", "", "utf8", "base64", "earliest", "aGk="])
        if kind == 4:
            return [junk(depth + 1) for _ in range(rnd.randrange(3))]
        if kind == 5:
            return {rnd.choice(["value", "key", "headers", "x"]): junk(depth + 1)}
        return [[junk(depth + 1), junk(depth + 1)]]

    fields = ["topic", "consumer", "clientId", "max", "requestId", "encoding", "value", "key",
              "headers", "partition", "messages", "timestamp", "start", "consumeTimeoutMs"]
    targets = [("POST", "/produce", "/produce"), ("POST", "/message", "/message"),
               ("POST", "/ack", "/ack"), ("POST", "/unlock", "/unlock"),
               ("PUT", "/consumers/fz/config", "/consumers/{group}/config")]
    statuses: set[int] = set()
    for _ in range(120):
        body = {f: junk() for f in rnd.sample(fields, rnd.randrange(1, 5))}
        if rnd.random() < 0.6:
            body["topic"] = shared_topic
        if rnd.random() < 0.4:
            body["consumer"] = "fz"
        for method, path, template in targets:
            if template == "/consumers/{group}/config":
                if rnd.random() < 0.5:
                    body = {k: v for k, v in body.items() if k in ("start", "consumeTimeoutMs")}
                if "consumeTimeoutMs" in body and body["consumeTimeoutMs"] in (None, ""):
                    # known bug: null / "" is accepted and stores a lock timeout of 0
                    body = {k: v for k, v in body.items() if k != "consumeTimeoutMs"}
            r = api.http.request(method, api.url(path), json=body)
            check(r, template)
            statuses.add(r.status_code)
    assert 400 in statuses and 200 in statuses
    done()


@pytest.mark.parametrize("method,path", [("GET", "/nope"), ("GET", "/consumers/g"), ("POST", "/consumers/g/queues/x")])
def test_unknown_route_is_404_error_body(api: Api, method: str, path: str) -> None:
    assert not any(re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path) for p in SPEC["paths"])
    r = api.http.request(method, api.url(path))
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
    assert_valid(r.json(), "/components/schemas/Error", f"{method} {path}")
    assert r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("method,path", [("GET", "/produce"), ("DELETE", "/message"), ("PUT", "/ack"),
                                         ("POST", "/healthz"), ("DELETE", "/consumers/g/config")])
def test_undocumented_method_is_405_error_body(api: Api, method: str, path: str) -> None:
    template = next(p for p in SPEC["paths"] if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path))
    assert method.lower() not in SPEC["paths"][template]
    r = api.http.request(method, api.url(path))
    assert r.status_code == 405
    assert_valid(r.json(), "/components/schemas/Error", f"{method} {path}")
    assert r.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.timeout(120)
def test_body_too_large(node_factory: Callable[..., Node], shared_topic: str, done: Callable[[], None]) -> None:
    node = node_factory(max_body_bytes=512)
    api = Api([node.url])
    try:
        big = {"topic": shared_topic, "value": "x" * 1000}
        cases = [("POST", "/produce", "/produce"), ("POST", "/message", "/message"), ("POST", "/ack", "/ack"),
                 ("POST", "/unlock", "/unlock"), ("PUT", "/consumers/g/config", "/consumers/{group}/config")]
        for method, path, template in cases:
            body = call(api, method, path, template, 413, "body_too_large", json=big)  # declared length
            assert body["error"]["details"] == {"limit": 512}
            chunks = iter([b'{"topic": "', b"x" * 400, b"x" * 400, b'"}'])  # chunked: no length given
            call(api, method, path, template, 413, "body_too_large", content=chunks,
                 headers={"content-type": "application/json"})
        # within the limit it works
        produce(api, {"topic": shared_topic, "value": "small"})
        done()
    finally:
        api.http.close()


@pytest.mark.timeout(120)
def test_dependency_unavailable(bootstrap: str, tmp_path: Path, shared_topic: str,
                                done: Callable[[], None]) -> None:
    dead = f"redis://127.0.0.1:{devstack.free_port()}/0"  # nothing listens there
    node = start_node(dead, bootstrap, tmp_path)
    api = Api([node.url])
    try:
        ready = call(api, "GET", "/readyz", status=503)
        assert ready == {"status": "unavailable", "checks": {"redis": False, "broker": True}}
        assert call(api, "GET", "/healthz", status=200) == {"status": "ok"}
        rid = RequestIdCodec(HMAC_KEY).encode(BatchRef("kafka", "g", "", shared_topic, "0", 0, 1, 1))
        for method, path, template, kw in [
            ("GET", "/message", "/message", {"params": {"consumer": "g", "topic": shared_topic}}),
            ("POST", "/message", "/message", {"json": {"consumer": "g", "topic": shared_topic}}),
            ("POST", "/ack", "/ack", {"json": {"requestId": rid}}),
            ("POST", "/unlock", "/unlock", {"json": {"requestId": rid}}),
            ("GET", "/consumers/g/queues", "/consumers/{group}/queues", {}),
            ("GET", "/consumers/g/clients", "/consumers/{group}/clients", {}),
            ("GET", "/consumers/g/clients/c/queues", "/consumers/{group}/clients/{client_id}/queues", {}),
            ("GET", "/consumers/g/config", "/consumers/{group}/config", {}),
            ("PUT", "/consumers/g/config", "/consumers/{group}/config", {"json": {"start": "earliest"}}),
        ]:
            call(api, method, path, template, 503, "unavailable", **kw)
        # producing needs no Redis
        produce(api, {"topic": shared_topic, "value": "still works"})
        done()
    finally:
        api.http.close()
        node.stop()


def test_zz_every_operation_was_exercised() -> None:
    """Runs last: every documented operation got at least one live response validated."""
    drivers = {name for name, obj in globals().items() if name.startswith("test_") and callable(obj)
               and "done" in getattr(obj, "__code__").co_varnames[:obj.__code__.co_argcount]}
    if not drivers <= DRIVERS_DONE:
        pytest.skip(f"only meaningful after the whole module ran (missing: {sorted(drivers - DRIVERS_DONE)})")
    exercised_ops = {(p, m) for p, m, _ in EXERCISED}
    missing = {(p, m) for p, m, _ in operations()} - exercised_ops
    assert not missing, f"operations never exercised: {sorted(missing)}"
