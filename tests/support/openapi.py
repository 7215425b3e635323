"""openapi.yaml read as the tests check against it: the document, its JSON Schema dialect, and
:func:`check`, which asserts that a live response is documented for its operation and matches
the declared schema (and records it in :data:`EXERCISED`, which test_openapi.py's coverage test
reads at the end of the session)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import jsonschema
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "openapi.yaml"
SPEC: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text())
#: Base URI the document is registered under, so "#/components/..." refs resolve inside it.
SPEC_URI = "https://mq-gateway.invalid/openapi.yaml"
OAS31_DIALECT = "https://spec.openapis.org/oas/3.1/dialect/base"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
#: Operations that never need an API key (``/metrics`` only once the app has it).
OPEN_OPERATIONS = {("/healthz", "get"), ("/readyz", "get"), ("/openapi.yaml", "get"), ("/metrics", "get"),
                   ("/console", "get"), ("/console/{asset}", "get")}
#: Operations that need no Redis with auth off: topic metadata and creation ask the broker only.
BROKER_ONLY_OPERATIONS = {("/admin/topics", "get"), ("/admin/topics", "post"), ("/admin/topics/{topic}", "get"),
                          ("/brokers", "get"),
                          ("/topics", "get"), ("/topics/{topic}", "get"), ("/topics/{topic}/partitions", "get"),
                          ("/topics/{topic}/partitions/{partition}", "get"),
                          ("/topics/{topic}/partitions/{partition}/offsets", "get")}
#: A value for each path parameter, to call any operation without a request of its own.
SAMPLE_PATH_PARAMS = {"consumer": "g", "client_id": "c", "name": "p", "key_id": "0123456789abcdef", "topic": "t",
                      "delay_id": "x", "group": "g", "instance": "i", "partition": "0",
                      "asset": "console.js"}


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


def security_of(op: dict[str, Any]) -> list[dict[str, list[str]]]:
    """The operation's effective security requirements ([] means: open to anyone)."""
    return op.get("security", SPEC.get("security", []))


def sample_path(template: str) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: SAMPLE_PATH_PARAMS[m.group(1)], template)


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
    if not content:  # no content, as documented (204; the v2 commit's 200, as Confluent's)
        assert not resp.content, f"{method.upper()} {template} {st} has a body: {resp.text[:300]}"
        EXERCISED.add((template, method, st))
        return None
    ctype = resp.headers.get("content-type", "").split(";")[0].strip()
    assert ctype in content, f"{method.upper()} {template} {st}: content type {ctype!r} not in {sorted(content)}"
    body: Any = (resp.json() if ctype.endswith("json")
                 else yaml.safe_load(resp.text) if ctype.endswith("yaml") else resp.text)
    assert_valid(body, f"{ptr}/content/{esc(ctype)}/schema", f"{method.upper()} {template} {st} body")
    for name, header in (response.get("headers") or {}).items():
        header, hptr = deref(header, f"{ptr}/headers/{esc(name)}")
        if header.get("required") is False and name not in resp.headers:
            continue  # documented as optional (say so explicitly: the others must be there)
        assert name in resp.headers, f"{method.upper()} {template} {st}: header {name} missing"
        value: Any = resp.headers[name]
        if header["schema"].get("type") == "integer":
            value = int(value)
        assert_valid(value, f"{hptr}/schema", f"header {name}")
    if code is not None:  # the gateway's error shape, or the REST v2 one (its ``code``)
        assert (body["error"]["code"] if "error" in body else body["code"]) == code, body
    EXERCISED.add((template, method, st))
    return body


def check_request_body(body: Any, template: str, method: str) -> None:
    """A request body we send as a valid request must match the documented request schema."""
    _, ptr = deref(SPEC["paths"][template][method]["requestBody"],
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


def expect(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body: dict[str, Any] = r.json()
    if code is not None:
        assert body["error"]["code"] == code, r.text
    return body


def spec_allows(method: str, template: str, body: Any) -> bool:
    """Whether ``openapi.yaml`` allows ``body`` as the JSON request body of the operation."""
    _, ptr = deref(SPEC["paths"][template][method]["requestBody"],
                   f"/paths/{esc(template)}/{method}/requestBody")
    return bool(validator_at(f"{ptr}/content/application~1json/schema").is_valid(body))
