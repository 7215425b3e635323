"""REST v2's ``avro``, ``protobuf`` and ``jsonschema`` formats against a real Schema Registry
(Apicurio Registry in its Confluent mode: tests/support/schema_registry.py), two gateway nodes
taking turns, and the real broker:

- produce with a schema's text (registered under ``<topic>-value``/``-key``) or its id, answered
  with the ids; instances of the format read the records decoded, whichever node serves them;
- the registry's refusals and bad values answered in the v2 shape (an incompatible schema's 409,
  an invalid schema's 42205, a value that does not fit 42203, a key without a schema 42201);
- the native API's option: ``/produce`` with ``"encoding": "avro"`` and a schema, ``/message``
  with ``encoding=avro`` answering decoded values and their ids (a record that does not decode
  comes as base64 with ``schemaError``);
- Confluent's own serializers (confluent-kafka's Schema Registry client) read what the gateway
  wrote and write what the gateway reads (Apache Kafka only: they are Kafka clients).
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from ..support import ON_ROCKETMQ, Node, start_node, unique
from ..support import schema_registry as sr

pytestmark = [
    pytest.mark.slow,  # a JVM registry
    pytest.mark.skipif(shutil.which("java") is None or shutil.which("mvn") is None,
                       reason="the registry runs from its Maven Central jars"),
]

V2 = "application/vnd.kafka.v2+json"
AVRO_V2 = "application/vnd.kafka.avro.v2+json"
PROTOBUF_V2 = "application/vnd.kafka.protobuf.v2+json"
JSONSCHEMA_V2 = "application/vnd.kafka.jsonschema.v2+json"
USER = orjson.dumps({"type": "record", "name": "User", "namespace": "mqgw.test", "fields": [
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None}]}).decode()
PROTO = 'syntax = "proto3";\npackage mqgw.test;\nmessage Order { string id = 1; int64 cents = 2; ' \
    'repeated string tags = 3; }\n'


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sr.Registry]:
    reg = sr.start(tmp_path_factory.mktemp("registry"))
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture
def nodes(registry: sr.Registry, redis_url: str, bootstrap: str,
          tmp_path: Path) -> Iterator[list[str]]:
    started: list[Node] = []
    try:
        for _ in range(2):
            started.append(start_node(redis_url, bootstrap, tmp_path, instance_wait_ms=200,
                                      schema_registry_url=registry.url))
        yield [n.url for n in started]
    finally:
        for n in started:
            n.stop()


class Turns:
    """Each call to the next node: no request finds the node of the one before."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self.i = urls, 0
        self.http = httpx.Client(timeout=30)

    def __call__(self, method: str, path: str, body: Any = None, ctype: str = V2,
                 accept: str = V2, **kw: Any) -> httpx.Response:
        self.i += 1
        return self.http.request(method, self.urls[self.i % len(self.urls)] + path,
                                 content=orjson.dumps(body) if body is not None else None,
                                 headers={"content-type": ctype, "accept": accept}, **kw)


def error(r: httpx.Response) -> tuple[int, int, str]:
    b = r.json()
    return r.status_code, b["error_code"], b.get("code", "")


def read_all(call: Turns, group: str, topic: str, fmt: str, accept: str,
             count: int) -> list[dict[str, Any]]:
    """An instance of ``fmt`` made on one node, read through both until ``count`` records."""
    r = call("POST", f"/consumers/{group}", {"name": "i", "format": fmt,
                                             "auto.offset.reset": "earliest"})
    assert r.status_code == 200, r.text
    path = f"/consumers/{group}/instances/i"
    assert call("POST", path + "/subscription", {"topics": [topic]}).status_code == 204
    got: list[dict[str, Any]] = []
    for _ in range(200):
        r = call("GET", path + "/records", accept=accept, params={"timeout": 300})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == accept
        got += r.json()
        if len(got) >= count:
            break
    assert call("DELETE", path).status_code == 204
    return got


def by_offset(got: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(g["key"], g["value"]) for g in sorted(got, key=lambda g: (str(g["partition"]),
                                                                      g["offset"]))]


@pytest.mark.rocketmq
def test_avro_through_two_nodes_and_the_registry(
        nodes: list[str], registry: sr.Registry, make_topic: Callable[..., str]) -> None:
    call = Turns(nodes)
    topic = make_topic(1)
    # RocketMQ's keys are text that may not hold the bytes 1 and 2, which a schema id's 4 bytes
    # do (docs/rest-v2.md): keys with schemas are Kafka's only
    keyed = not ON_ROCKETMQ
    records = [{"key": {"string": f"k{i}"} if i % 2 and keyed else None,
                "value": {"name": f"user{i}", "email": {"string": f"u{i}@x"} if i % 3 else None}}
               for i in range(6)]
    # a key schema too: a union, so that a null key and a string key both fit
    r = call("POST", f"/topics/{topic}", {"value_schema": USER, "key_schema": '["null","string"]',
                                          "records": records}, AVRO_V2)
    assert r.status_code == 200, r.text
    body = r.json()
    value_id, key_id = body["value_schema_id"], body["key_schema_id"]
    assert isinstance(value_id, int) and isinstance(key_id, int) and value_id != key_id
    assert all(o["error_code"] is None for o in body["offsets"]), body
    # the registry holds them under the topic's subjects
    subjects = httpx.get(registry.url + "/subjects").json()
    assert {f"{topic}-value", f"{topic}-key"} <= set(subjects)
    # by id, on the other node
    more = [{"value": {"name": "by-id", "email": None}}]
    r = call("POST", f"/topics/{topic}", {"value_schema_id": value_id, "records": more}, AVRO_V2)
    assert r.status_code == 200 and r.json()["value_schema_id"] == value_id, r.text

    got = read_all(call, unique("g"), topic, "avro", AVRO_V2, 7)
    assert by_offset(got) == [(r.get("key"), r["value"]) for r in records + more]

    # refusals, in the v2 shape
    assert error(call("POST", f"/topics/{topic}", {"value_schema_id": value_id, "records": [
        {"value": {"name": 3}}]}, AVRO_V2))[:2] == (422, 42203)
    assert error(call("POST", f"/topics/{topic}", {"value_schema": '{"type":"recrd"}',
                                                   "records": [{"value": 1}]}, AVRO_V2)) == \
        (422, 42205, "invalid_schema")
    assert error(call("POST", f"/topics/{topic}", {"value_schema_id": 2**30,
                                                   "records": [{"value": 1}]}, AVRO_V2)) == \
        (422, 42205, "unknown_schema")
    assert error(call("POST", f"/topics/{topic}", {"records": [{"value": {"name": "x"}}]},
                      AVRO_V2)) == (422, 42202, "value_schema_missing")
    assert error(call("POST", f"/topics/{topic}", {"value_schema_id": value_id, "records": [
        {"key": "k", "value": {"name": "x", "email": None}}]}, AVRO_V2)) == \
        (422, 42201, "key_schema_missing")
    # the subject's compatibility rule: a new required field without a default breaks BACKWARD
    r = httpx.put(f"{registry.url}/config/{topic}-value", json={"compatibility": "BACKWARD"},
                  headers={"content-type": "application/vnd.schemaregistry.v1+json"})
    assert r.status_code == 200, r.text
    breaking = orjson.loads(USER)
    breaking["fields"].append({"name": "age", "type": "int"})
    r = call("POST", f"/topics/{topic}", {"value_schema": orjson.dumps(breaking).decode(),
                                          "records": [{"value": {"name": "x", "email": None,
                                                                 "age": 1}}]}, AVRO_V2)
    assert error(r) == (409, 409, "incompatible_schema"), r.text
    # an instance asked for another format's records
    r = call("POST", f"/consumers/{unique('g')}", {"name": "j", "format": "avro"})
    base = r.json()["base_uri"].split("/consumers/", 1)[1]
    call("POST", f"/consumers/{base}/subscription", {"topics": [topic]})
    assert error(call("GET", f"/consumers/{base}/records",
                      accept="application/vnd.kafka.json.v2+json"))[:2] == (406, 40601)
    call("DELETE", f"/consumers/{base}")


@pytest.mark.rocketmq
def test_protobuf_and_json_schema_through_two_nodes(
        nodes: list[str], make_topic: Callable[..., str]) -> None:
    call = Turns(nodes)
    topic = make_topic(1)
    orders = [{"value": {"id": f"o{i}", "cents": str(100 * i), "tags": ["a", "b"][: i % 3]}}
              for i in range(1, 5)]
    r = call("POST", f"/topics/{topic}", {"value_schema": PROTO, "records": orders}, PROTOBUF_V2)
    assert r.status_code == 200, r.text
    got = read_all(call, unique("g"), topic, "protobuf", PROTOBUF_V2, len(orders))
    # Protobuf's JSON mapping: int64 as a string, empty repeated fields left out
    assert [v for _, v in by_offset(got)] == [
        {k: v for k, v in o["value"].items() if v != []} for o in orders]
    assert error(call("POST", f"/topics/{topic}", {"value_schema": "message {",
                                                   "records": [{"value": {}}]}, PROTOBUF_V2)) == \
        (422, 42205, "invalid_schema")
    assert error(call("POST", f"/topics/{topic}", {"value_schema": PROTO, "records": [
        {"value": {"idd": "x"}}]}, PROTOBUF_V2))[:2] == (422, 42203)

    topic = make_topic(1)
    schema = orjson.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                           "required": ["n"]}).decode()
    r = call("POST", f"/topics/{topic}", {"value_schema": schema,
                                          "records": [{"value": {"n": i}} for i in range(3)]},
             JSONSCHEMA_V2)
    assert r.status_code == 200, r.text
    got = read_all(call, unique("g"), topic, "jsonschema", JSONSCHEMA_V2, 3)
    assert [v for _, v in by_offset(got)] == [{"n": i} for i in range(3)]
    assert error(call("POST", f"/topics/{topic}", {"value_schema": schema, "records": [
        {"value": {"n": "one"}}]}, JSONSCHEMA_V2))[:2] == (422, 42203)


@pytest.mark.rocketmq
def test_the_native_api_produces_and_fetches_with_schemas(
        nodes: list[str], make_topic: Callable[..., str]) -> None:
    topic, group = make_topic(1), unique("g")
    with httpx.Client(timeout=30) as http:
        r = http.put(f"{nodes[0]}/admin/consumers/{group}", json={"topics": [topic],
                                                                  "start": "earliest"})
        assert r.status_code == 201, r.text
        r = http.post(nodes[0] + "/produce", json={
            "topic": topic, "encoding": "avro", "valueSchema": USER,
            "messages": [{"value": {"name": "n0", "email": None}, "headers": {"h": "x"}},
                         {"value": {"name": "n1", "email": {"string": "e"}}}]})
        assert r.status_code == 200, r.text
        value_id = r.json()["valueSchemaId"]
        assert isinstance(value_id, int) and r.json()["keySchemaId"] is None
        # by id, one message; then a plain record that is no Avro at all
        r = http.post(nodes[1] + "/produce", json={"topic": topic, "encoding": "avro",
                                                   "valueSchemaId": value_id,
                                                   "value": {"name": "n2", "email": None}})
        assert r.status_code == 200, r.text
        assert http.post(nodes[0] + "/produce", json={"topic": topic, "value": "plain"}
                         ).status_code == 200
        r = http.post(nodes[1] + "/produce", json={"topic": topic, "encoding": "avro",
                                                   "valueSchemaId": value_id,
                                                   "value": {"name": 1}})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "json_conversion")
        got: list[dict[str, Any]] = []
        for i in range(40):
            r = http.get(nodes[i % 2] + "/message", params={
                "consumer": group, "topic": topic, "encoding": "avro", "max": 10,
                "wait_ms": 300, "requestId": r.json().get("requestId", "") if got else ""})
            assert r.status_code == 200, r.text
            got += r.json()["messages"]
            if len(got) >= 4:
                break
    assert [(m["encoding"], m["value"], m.get("valueSchemaId")) for m in got[:3]] == [
        ("avro", {"name": "n0", "email": None}, value_id),
        ("avro", {"name": "n1", "email": {"string": "e"}}, value_id),
        ("avro", {"name": "n2", "email": None}, value_id)]
    assert got[0]["headers"] == [["h", "x"]]
    plain = got[3]
    assert (plain["encoding"], base64.b64decode(plain["value"])) == ("base64", b"plain")
    assert "wire format" in plain["schemaError"]


@pytest.mark.skipif(ON_ROCKETMQ, reason="Confluent's serializers are Kafka clients")
def test_confluents_serializers_read_and_write_beside_the_gateway(
        nodes: list[str], registry: sr.Registry, make_topic: Callable[..., str],
        bootstrap: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    call = Turns(nodes)
    topic = make_topic(1)
    client = SchemaRegistryClient({"url": registry.url})
    # what the gateway wrote, read by Confluent's deserializer
    values = [{"name": f"g{i}", "email": None} for i in range(3)]
    r = call("POST", f"/topics/{topic}", {"value_schema": USER,
                                          "records": [{"value": {**v, "email": None}}
                                                      for v in values]}, AVRO_V2)
    assert r.status_code == 200, r.text
    deserialize = AvroDeserializer(client)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("cg"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        read: list[Any] = []
        for _ in range(60):
            m = consumer.poll(1.0)
            if m is None or m.error():
                continue
            read.append(deserialize(m.value(), SerializationContext(topic, MessageField.VALUE)))
            if len(read) == len(values):
                break
    finally:
        consumer.close()
    assert read == values

    # what Confluent's serializer wrote (a schema of its own registering), read through the gateway
    serialize = AvroSerializer(client, USER.replace('"User"', '"Person"'))
    producer = Producer({"bootstrap.servers": bootstrap})
    theirs = [{"name": f"c{i}", "email": f"c{i}@x"} for i in range(3)]
    for v in theirs:
        producer.produce(topic, serialize(v, SerializationContext(topic, MessageField.VALUE)))
    assert producer.flush(30) == 0
    got = read_all(call, unique("g"), topic, "avro", AVRO_V2, len(values) + len(theirs))
    assert [v for _, v in by_offset(got)][len(values):] == [
        {"name": v["name"], "email": {"string": v["email"]}} for v in theirs]


@pytest.mark.skipif(ON_ROCKETMQ, reason="Confluent's serializers are Kafka clients")
def test_confluents_protobuf_serializers_read_and_write_beside_the_gateway(
        nodes: list[str], registry: sr.Registry, make_topic: Callable[..., str],
        bootstrap: str, tmp_path: Path) -> None:
    """Confluent's Python ProtobufSerializer registers its schema as a base64 descriptor (which
    this registry serves back as such): the gateway decodes its records, and Confluent's
    ProtobufDeserializer decodes the gateway's."""
    import importlib
    import subprocess
    import sys

    from confluent_kafka import Consumer, Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    (tmp_path / "order.proto").write_text(PROTO)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}",
                    f"--python_out={tmp_path}", "order.proto"], check=True, timeout=60)
    sys.path.insert(0, str(tmp_path))
    try:
        order = importlib.import_module("order_pb2").Order
    finally:
        sys.path.remove(str(tmp_path))
    call = Turns(nodes)
    client = SchemaRegistryClient({"url": registry.url})
    ctx = lambda topic: SerializationContext(topic, MessageField.VALUE)  # noqa: E731
    # theirs, through the gateway
    topic = make_topic(1)
    serialize = ProtobufSerializer(order, client, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce(topic, serialize(order(id=f"c{i}", cents=i), ctx(topic)))
    assert producer.flush(30) == 0
    got = read_all(call, unique("g"), topic, "protobuf", PROTOBUF_V2, 3)
    assert [v for _, v in by_offset(got)] == [{"id": "c0"}, {"id": "c1", "cents": "1"},
                                             {"id": "c2", "cents": "2"}]
    # the gateway's, through Confluent's deserializer
    topic = make_topic(1)
    r = call("POST", f"/topics/{topic}", {"value_schema": PROTO, "records": [
        {"value": {"id": f"g{i}", "tags": ["x"]}} for i in range(2)]}, PROTOBUF_V2)
    assert r.status_code == 200, r.text
    deserialize = ProtobufDeserializer(order, {"use.deprecated.format": False})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("cg"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    read: list[Any] = []
    try:
        consumer.subscribe([topic])
        for _ in range(60):
            m = consumer.poll(1.0)
            if m is None or m.error():
                continue
            read.append(deserialize(m.value(), ctx(topic)))
            if len(read) == 2:
                break
    finally:
        consumer.close()
    assert [(o.id, list(o.tags)) for o in read] == [("g0", ["x"]), ("g1", ["x"])]
