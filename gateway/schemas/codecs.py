"""Avro, Protobuf and JSON Schema values in Confluent's wire format, with well-kept libraries
(fastavro, protobuf and protoc from grpcio-tools, jsonschema): no codec of our own.

The wire format (Confluent's, which their serializers, Apicurio's in its Confluent mode and
Karapace's write): byte 0 is ``0`` (the magic byte), bytes 1-4 the schema id (big endian), then
the payload. A Protobuf payload starts with the message indexes (which message of the schema,
nested ones by path) as zig-zag varints: ``0`` alone for the first message, else their count
and each index.

JSON forms are those of the Confluent REST Proxy: Avro's JSON encoding (a union's value is
``{"type": value}``, bytes are strings of code points 0-255), Protobuf's JSON mapping with the
fields' own names, and JSON Schema's JSON as it is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import subprocess
import sys
import tempfile
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import fastavro
import fastavro.validation
import jsonschema
import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

MAGIC = 0
#: How long protoc may take to compile one schema (a schema is compiled once per node).
PROTOC_TIMEOUT_S = 30.0


class Kind(str, Enum):
    """A schema's type as the registry names it (``schemaType``; none means Avro)."""

    AVRO = "AVRO"
    PROTOBUF = "PROTOBUF"
    JSON = "JSON"


class SchemaInvalid(ValueError):
    """The schema text does not parse as its kind."""


class ConversionError(ValueError):
    """A value that does not fit its schema, or a payload that does not decode with it."""


class NotFramed(ValueError):
    """Bytes that are not in the wire format (no magic byte, or too short)."""


class Codec(Protocol):
    def encode(self, value: Any) -> bytes:
        """A JSON value as the payload after the 5-byte header."""

    def decode(self, payload: bytes) -> Any:
        """The payload after the 5-byte header as a JSON value."""


def frame(schema_id: int, payload: bytes) -> bytes:
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big") + payload


def unframe(data: bytes) -> tuple[int, bytes]:
    """(schema id, payload) of bytes in the wire format."""
    if len(data) < 5 or data[0] != MAGIC:
        raise NotFramed("not in the schema registry's wire format (magic byte 0, a 4-byte id)")
    return int.from_bytes(data[1:5], "big"), data[5:]


async def compile_schema(kind: Kind, text: str) -> Codec:
    """A codec for the schema ``text`` of ``kind``; SchemaInvalid if it does not parse."""
    if kind is Kind.AVRO:
        return AvroCodec(text)
    if kind is Kind.JSON:
        return JsonSchemaCodec(text)
    described = _descriptor(text)
    return ProtobufCodec(described if described is not None else await _protoc(text))


def _descriptor(text: str) -> descriptor_pb2.FileDescriptorSet | None:
    """A Protobuf schema given as a base64 ``FileDescriptorProto`` instead of ``.proto`` text:
    what confluent-kafka's Python ``ProtobufSerializer`` registers, and what a registry that
    keeps it so (Apicurio 2.0) serves back. None for anything else (then it is .proto text)."""
    t = text.strip()
    if not t or any(c.isspace() or c in ';{}"' for c in t):
        return None  # .proto text has blanks, braces and semicolons; base64 has none
    try:
        fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(t, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        return None
    if not fd.name or not fd.message_type:
        return None
    return descriptor_pb2.FileDescriptorSet(file=[fd])


# -- Avro -----------------------------------------------------------------------------------------
class AvroCodec:
    def __init__(self, text: str) -> None:
        try:
            self.schema = fastavro.parse_schema(orjson.loads(text))
        except (orjson.JSONDecodeError, fastavro.schema.SchemaParseException,
                fastavro.schema.UnknownType, ValueError, TypeError, KeyError) as e:
            raise SchemaInvalid(f"not an Avro schema: {e}") from None

    def encode(self, value: Any) -> bytes:
        try:  # Avro's JSON encoding read by Avro's own rules (unions named, bytes as text)
            datum = next(iter(fastavro.json_reader(io.StringIO(orjson.dumps(value).decode()),
                                                   self.schema)))
            fastavro.validation.validate(datum, self.schema, raise_errors=True)
            out = io.BytesIO()
            fastavro.schemaless_writer(out, self.schema, datum)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, StopIteration,
                fastavro.validation.ValidationError) as e:
            raise ConversionError(f"does not fit the Avro schema: {e}") from None
        return out.getvalue()

    def decode(self, payload: bytes) -> Any:
        try:
            datum = fastavro.schemaless_reader(io.BytesIO(payload), self.schema, None)
            out = io.StringIO()
            fastavro.json_writer(out, self.schema, [datum])
        except (ValueError, TypeError, KeyError, IndexError, EOFError, OverflowError,
                UnicodeDecodeError) as e:
            raise ConversionError(f"does not decode with its Avro schema: {e!r}") from None
        return orjson.loads(out.getvalue())


# -- JSON Schema ----------------------------------------------------------------------------------
class JsonSchemaCodec:
    def __init__(self, text: str) -> None:
        try:
            schema = orjson.loads(text)
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
        except (orjson.JSONDecodeError, jsonschema.SchemaError) as e:
            raise SchemaInvalid(f"not a JSON Schema: {getattr(e, 'message', e)}") from None
        self.validator = cls(schema)

    def encode(self, value: Any) -> bytes:
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the value"
            raise ConversionError(f"does not fit the JSON Schema at {where}: {error.message}")
        return orjson.dumps(value)

    def decode(self, payload: bytes) -> Any:
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as e:
            raise ConversionError(f"not JSON: {e}") from None


# -- Protobuf -------------------------------------------------------------------------------------
async def _protoc(text: str) -> descriptor_pb2.FileDescriptorSet:
    """The schema compiled by protoc (grpcio-tools' own copy) in a process of its own, waited
    for by a thread: its errors arrive as text, and the event loop waits for nothing. Once per
    schema and process (~0.3 s)."""
    return await asyncio.to_thread(_protoc_now, text)


def _protoc_now(text: str) -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory(prefix="mqgw-proto-") as d:
        Path(d, "schema.proto").write_text(text)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"-I{d}", "--include_imports",
                 f"--descriptor_set_out={d}/out.pb", "schema.proto"],
                capture_output=True, cwd=d, timeout=PROTOC_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise SchemaInvalid("protoc did not finish compiling the schema") from None
        if proc.returncode != 0:
            raise SchemaInvalid("not a Protobuf schema: " + proc.stderr.decode(errors="replace")
                                .strip().replace("schema.proto:", "line "))
        return descriptor_pb2.FileDescriptorSet.FromString(Path(d, "out.pb").read_bytes())


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _read_zigzag(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ConversionError("the Protobuf message indexes are cut short")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos


class ProtobufCodec:
    """The schema's first message (as the Confluent REST Proxy writes) on the way in; on the
    way out, the message the payload's indexes name."""

    def __init__(self, files: descriptor_pb2.FileDescriptorSet) -> None:
        pool = descriptor_pool.DescriptorPool()
        try:
            for f in files.file:
                pool.Add(f)
            self.file = pool.FindFileByName(files.file[-1].name)
        except (TypeError, KeyError) as e:
            raise SchemaInvalid(f"not a Protobuf schema: {e}") from None
        if not self.file.message_types_by_name:
            raise SchemaInvalid("the Protobuf schema defines no message")
        self._classes: dict[tuple[int, ...], type[Message]] = {}

    def _message(self, indexes: tuple[int, ...]) -> type[Message]:
        cls = self._classes.get(indexes)
        if cls is None:
            types = list(self.file.message_types_by_name.values())
            d: Descriptor | None = None
            for i in indexes:
                if not 0 <= i < len(types):
                    raise ConversionError(f"the schema has no message at indexes {list(indexes)}")
                d = types[i]
                types = list(d.nested_types)
            assert d is not None
            cls = self._classes[indexes] = message_factory.GetMessageClass(d)
        return cls

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, dict):
            raise ConversionError("a Protobuf message is a JSON object")
        try:
            msg = json_format.ParseDict(value, self._message((0,))())
        except json_format.ParseError as e:
            raise ConversionError(f"does not fit the Protobuf schema: {e}") from None
        return _zigzag(0) + bytes(msg.SerializeToString())

    def decode(self, payload: bytes) -> Any:
        count, pos = _read_zigzag(payload, 0)
        indexes: tuple[int, ...] = (0,)
        if count:
            if not 0 < count <= 64:
                raise ConversionError(f"bad Protobuf message index count {count}")
            read = []
            for _ in range(count):
                i, pos = _read_zigzag(payload, pos)
                read.append(i)
            indexes = tuple(read)
        try:
            msg = self._message(indexes).FromString(payload[pos:])
        except DecodeError as e:
            raise ConversionError(f"does not decode with its Protobuf schema: {e}") from None
        return json_format.MessageToDict(msg, preserving_proto_field_name=True)
