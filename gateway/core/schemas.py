"""Records with schemas from the user's Schema Registry (REST v2's ``avro``, ``protobuf`` and
``jsonschema`` formats): JSON values in, Confluent's wire format on the broker, JSON out.

A produce names a schema by its text (registered under the topic's subject ``<topic>-value``
or ``<topic>-key``, Confluent's default TopicNameStrategy, and kept there by the registry's
compatibility rule) or by its id. A fetch reads each record's id from its bytes and decodes
with that schema, whoever wrote it (a gateway, or a Confluent serializer). Compiled schemas are
kept by id in each process: an id's schema never changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..schemas import (
    Codec,
    ConversionError,
    Kind,
    NotFramed,
    RegistryClient,
    RegistryUnavailable,
    SchemaIncompatible,
    SchemaInvalid,
    SchemaNotFound,
    SchemaRejected,
    compile_schema,
    frame,
    unframe,
)
from .errors import Busy, Conflict, DomainError, invalid

#: Compiled schemas a process keeps at most.
CODECS_MAX = 10_000


@dataclass(frozen=True, slots=True)
class SchemaSpec:
    """A produce's schema for its keys or its values: the text, or a registered id."""

    text: str | None = None
    id: int | None = None


#: The kinds by the names the APIs use for them (REST v2's formats, /produce's and /message's
#: ``encoding``).
KINDS = {"avro": Kind.AVRO, "protobuf": Kind.PROTOBUF, "jsonschema": Kind.JSON}

#: A record's key and value decoded: (schema id, JSON value) each, (None, None) for a null.
Decoded = tuple[tuple[int | None, Any], tuple[int | None, Any]]


def schema_spec(text: Any, schema_id: Any, text_name: str, id_name: str) -> SchemaSpec | None:
    """A schema a request names by its text (``text_name``) or its registry id (``id_name``),
    None for neither: the one rule of both APIs (REST v2's ``value_schema``/``value_schema_id``,
    /produce's ``valueSchema``/``valueSchemaId``)."""
    if text is not None and schema_id is not None:
        raise invalid("invalid_schema", f"give {text_name} or {id_name}, not both")
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise invalid("invalid_schema", f"{text_name} must be the schema's text (a string)")
        return SchemaSpec(text=text)
    if schema_id is not None:
        if type(schema_id) is float and schema_id.is_integer():
            schema_id = int(schema_id)
        if type(schema_id) is not int or not 0 <= schema_id < 2**31:
            raise invalid("invalid_schema", f"{id_name} must be a schema id (an integer)")
        return SchemaSpec(id=schema_id)
    return None


def no_registry(kind: Kind) -> DomainError:
    """A schema format asked of a gateway without a registry."""
    name = next(n for n, k in KINDS.items() if k is kind)
    return invalid("no_schema_registry", f"{name} records need a schema registry, and this "
                   "gateway has none (set schema_registry_url: MQGW_SCHEMA_REGISTRY_URL)")


class Encoded(NamedTuple):
    key_id: int | None
    value_id: int | None
    keys: list[bytes | None]
    values: list[bytes | None]


class SchemaService:
    def __init__(self, client: RegistryClient) -> None:
        self.client = client
        self._codecs: dict[tuple[int, Kind], Codec] = {}

    async def close(self) -> None:
        await self.client.close()

    async def encode(self, topic: str, kind: Kind, key: SchemaSpec | None,
                     value: SchemaSpec | None, keys: Sequence[Any],
                     values: Sequence[Any]) -> Encoded:
        """The records' keys and values (JSON values; None stays a null) in the wire format."""
        key_id, out_keys = await self._side(topic, kind, "key", key, keys)
        value_id, out_values = await self._side(topic, kind, "value", value, values)
        return Encoded(key_id, value_id, out_keys, out_values)

    async def _side(self, topic: str, kind: Kind, side: str, spec: SchemaSpec | None,
                    items: Sequence[Any]) -> tuple[int | None, list[bytes | None]]:
        if spec is None:
            bad = next((i for i, v in enumerate(items) if v is not None), None)
            if bad is not None:
                raise invalid(f"{side}_schema_missing", f"records[{bad}] has a {side}: name its "
                              f"schema ({side}_schema or {side}_schema_id)", index=bad)
            return None, [None] * len(items)
        schema_id, codec = await self._codec_of(topic, kind, side, spec)
        out: list[bytes | None] = []
        for i, v in enumerate(items):
            if v is None:
                out.append(None)
                continue
            try:
                out.append(frame(schema_id, codec.encode(v)))
            except ConversionError as e:
                raise invalid("json_conversion", f"records[{i}].{side} {e}", index=i) from None
        return schema_id, out

    async def _codec_of(self, topic: str, kind: Kind, side: str,
                        spec: SchemaSpec) -> tuple[int, Codec]:
        if spec.text is not None:
            try:  # parsed here first: a clear answer without a registry round trip
                codec = await compile_schema(kind, spec.text)
            except SchemaInvalid as e:
                raise invalid("invalid_schema", f"{side}_schema: {e}") from None
            schema_id = await self._registry(self.client.register(f"{topic}-{side}", kind,
                                                                  spec.text))
            self._keep(schema_id, kind, codec)
            return schema_id, codec
        assert spec.id is not None
        return spec.id, await self.codec(spec.id, kind)

    async def codec(self, schema_id: int, kind: Kind) -> Codec:
        """The compiled schema of an id, read from the registry once per process."""
        codec = self._codecs.get((schema_id, kind))
        if codec is None:
            s = await self._registry(self.client.schema(schema_id))
            if s.kind is not None and s.kind is not kind:
                raise invalid("schema_kind_mismatch", f"schema {schema_id} is "
                              f"{s.kind.value}, not {kind.value}")
            try:
                codec = await compile_schema(kind, s.text)
            except SchemaInvalid as e:
                raise invalid("schema_kind_mismatch", f"schema {schema_id} is not "
                              f"{kind.value}: {e}") from None
            self._keep(schema_id, kind, codec)
        return codec

    def _keep(self, schema_id: int, kind: Kind, codec: Codec) -> None:
        if len(self._codecs) >= CODECS_MAX:
            self._codecs.clear()
        self._codecs[(schema_id, kind)] = codec

    async def decode_all(self, kind: Kind, records: Sequence[tuple[bytes | None, bytes | None]],
                         ) -> list[Decoded | str]:
        """Each (key, value) decoded, or why it could not be (the native API's per-record
        answer: such a record travels as base64 with the reason beside it, nothing is held
        back)."""
        out: list[Decoded | str] = []
        for key, value in records:
            try:
                out.append((await self.decode(kind, key), await self.decode(kind, value)))
            except DomainError as e:
                out.append(e.message)
        return out

    async def decode(self, kind: Kind, data: bytes | None) -> tuple[int | None, Any]:
        """(schema id, JSON value) of a record's key or value in the wire format; ``invalid
        json_conversion`` if it is not one, ``Busy`` if the registry is away."""
        if data is None:
            return None, None
        try:
            schema_id, payload = unframe(data)
        except NotFramed as e:
            raise invalid("json_conversion", str(e)) from None
        try:
            codec = await self.codec(schema_id, kind)
            return schema_id, codec.decode(payload)
        except ConversionError as e:
            raise invalid("json_conversion", f"schema {schema_id}: {e}") from None
        except DomainError as e:
            if e.code in ("unknown_schema", "schema_kind_mismatch"):
                raise invalid("json_conversion", e.message) from None
            raise

    async def _registry(self, call: Any) -> Any:
        """A registry call, its refusals as domain errors."""
        try:
            return await call
        except SchemaNotFound as e:
            raise invalid("unknown_schema", f"the schema registry has no such schema: "
                          f"{e.message}") from None
        except SchemaIncompatible as e:
            raise Conflict("incompatible_schema", f"the schema registry refused the schema: "
                           f"{e.message}") from None
        except SchemaRejected as e:
            raise invalid("invalid_schema", f"the schema registry refused the schema: "
                          f"{e.message}") from None
        except RegistryUnavailable as e:
            raise Busy("schema_registry_unavailable", e.message) from None
