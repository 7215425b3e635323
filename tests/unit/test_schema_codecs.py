"""The Schema Registry formats' codecs (gateway/schemas/codecs.py): Confluent's wire format and
the JSON forms of the Confluent REST Proxy, by the formats' own libraries. The registry itself
is tested as a process (tests/system/test_schema_registry.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.schemas import ConversionError, Kind, NotFramed, SchemaInvalid, compile_schema, frame, unframe

AVRO = ('{"type":"record","name":"User","fields":[{"name":"name","type":"string"},'
        '{"name":"age","type":["null","int"],"default":null},{"name":"b","type":"bytes"}]}')
PROTO = '''syntax = "proto3";
message User { string name = 1; int32 age = 2; Inner inner = 3;
  message Inner { int64 n = 1; } }
message Other { bool ok = 1; }
'''


def codec(kind: Kind, text: str) -> Any:
    return asyncio.run(compile_schema(kind, text))


def test_frames_carry_the_magic_byte_and_the_id() -> None:
    assert frame(258, b"x") == b"\x00\x00\x00\x01\x02x"
    assert unframe(b"\x00\x00\x00\x01\x02x") == (258, b"x")
    for bad in (b"", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01x", b'{"a":1}'):
        with pytest.raises(NotFramed):
            unframe(bad)


def test_avro_in_its_json_encoding_round_trips() -> None:
    c = codec(Kind.AVRO, AVRO)
    value = {"name": "ann", "age": {"int": 7}, "b": "\u00ff\u0000"}
    payload = c.encode(value)
    assert payload == b"\x06ann\x02\x0e\x04\xff\x00"  # Avro's binary encoding, by hand
    assert c.decode(payload) == value
    assert c.decode(c.encode({"name": "bo", "age": None, "b": ""})) == \
        {"name": "bo", "age": None, "b": ""}
    for bad in ({"name": 1, "age": None, "b": ""}, {"age": None}, "text", [1]):
        with pytest.raises(ConversionError):
            c.encode(bad)
    with pytest.raises(ConversionError):
        c.decode(b"\x06a")  # cut short


def test_bad_schemas_are_refused_with_the_parsers_words() -> None:
    for kind, text in ((Kind.AVRO, '{"type":"recrd"}'), (Kind.AVRO, "{"),
                       (Kind.JSON, '{"type": 3}'), (Kind.PROTOBUF, "message { }"),
                       (Kind.PROTOBUF, 'syntax = "proto3";')):
        with pytest.raises(SchemaInvalid):
            codec(kind, text)


def test_protobuf_writes_the_first_message_and_reads_any_by_its_indexes() -> None:
    c = codec(Kind.PROTOBUF, PROTO)
    payload = c.encode({"name": "ann", "age": 7, "inner": {"n": "5"}})
    assert payload[:1] == b"\x00"  # message indexes [0]: one zero
    assert c.decode(payload) == {"name": "ann", "age": 7, "inner": {"n": "5"}}
    # the second top-level message: count 1 (zig-zag 2), index 1 (zig-zag 2)
    assert c.decode(b"\x02\x02" + b"\x08\x01") == {"ok": True}
    # User.Inner: count 2, indexes 0 and 0
    assert c.decode(b"\x04\x00\x00" + b"\x08\x05") == {"n": "5"}
    for bad in ({"nme": "x"}, {"age": "old"}, [1]):
        with pytest.raises(ConversionError):
            c.encode(bad)
    with pytest.raises(ConversionError):
        c.decode(b"\x02\x08")  # an index past the messages


def test_json_schema_validates_on_the_way_in() -> None:
    c = codec(Kind.JSON, '{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}')
    assert c.decode(c.encode({"n": 1})) == {"n": 1}
    with pytest.raises(ConversionError, match="n"):
        c.encode({"n": "x"})
    with pytest.raises(ConversionError):
        c.encode({})


def test_a_protobuf_schema_registered_as_a_base64_descriptor_decodes() -> None:
    """confluent-kafka's Python ProtobufSerializer registers the schema as a base64
    FileDescriptorProto, and Apicurio 2.0 serves it back so: the same codec comes of it."""
    import base64

    from gateway.schemas.codecs import _protoc

    files = asyncio.run(_protoc(PROTO))
    text = base64.b64encode(files.file[-1].SerializeToString()).decode()
    c, by_text = codec(Kind.PROTOBUF, text), codec(Kind.PROTOBUF, PROTO)
    payload = by_text.encode({"name": "ann", "age": 7})
    assert c.decode(payload) == {"name": "ann", "age": 7} and c.encode({"name": "ann", "age": 7}) == payload
    with pytest.raises(SchemaInvalid):
        codec(Kind.PROTOBUF, base64.b64encode(b"\xff\xff").decode())  # neither: protoc says no
