"""The registry client's own rules (gateway/schemas/registry.py): what it sends (basic auth,
Confluent's media type, the subject quoted), what it keeps, and how each refusal of the
registry's is told apart. The registry's behaviour itself is tested against a real one
(tests/system/test_schema_registry.py); this records the requests a real one would get."""

from __future__ import annotations

import base64

import httpx
import orjson
import pytest

from gateway.schemas import (
    Kind,
    RegistryClient,
    RegistryUnavailable,
    SchemaIncompatible,
    SchemaNotFound,
    SchemaRejected,
)

pytestmark = pytest.mark.anyio


async def test_requests_and_caches() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(200, json={"id": 7})
        return httpx.Response(200, json={"schema": "syntax", "schemaType": "PROTOBUF"})

    client = RegistryClient("http://reg/apis/ccompat/v6/", "ann:s3cret",
                            transport=httpx.MockTransport(answer))
    assert await client.register("a/b-value", Kind.PROTOBUF, "syntax") == 7
    assert await client.register("a/b-value", Kind.PROTOBUF, "syntax") == 7  # cached
    got = await client.schema(7)  # known from the registration: no request
    assert (got.text, got.kind) == ("syntax", Kind.PROTOBUF)
    assert (await client.schema(8)).kind is Kind.PROTOBUF
    assert len(seen) == 2
    post = seen[0]
    assert str(post.url) == "http://reg/apis/ccompat/v6/subjects/a%2Fb-value/versions"
    assert post.headers["authorization"] == "Basic " + base64.b64encode(b"ann:s3cret").decode()
    assert post.headers["content-type"] == "application/vnd.schemaregistry.v1+json"
    assert orjson.loads(post.content) == {"schema": "syntax", "schemaType": "PROTOBUF"}
    await client.close()


@pytest.mark.parametrize(("status", "body", "error"), [
    (404, {"error_code": 40403, "message": "no such schema"}, SchemaNotFound),
    (409, {"error_code": 409, "message": "incompatible"}, SchemaIncompatible),
    (422, {"error_code": 42201, "message": "invalid"}, SchemaRejected),
    (401, {"error_code": 401, "message": "who are you"}, RegistryUnavailable),
    (500, b"oops", RegistryUnavailable),
])
async def test_refusals_are_told_apart(status: int, body: object, error: type) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body if isinstance(body, bytes) else orjson.dumps(body))
    client = RegistryClient("http://reg", transport=httpx.MockTransport(answer))
    with pytest.raises(error):
        await client.schema(1)
    with pytest.raises(error):
        await client.register("s", Kind.AVRO, '"int"')
    await client.close()


async def test_a_registry_that_does_not_answer() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")
    client = RegistryClient("http://reg", transport=httpx.MockTransport(answer))
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        await client.schema(1)
    await client.close()
