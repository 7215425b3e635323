"""The user's Schema Registry (Confluent's API: Confluent's own, Apicurio's ``ccompat``, Karapace)
and the formats whose schemas it holds: Avro, Protobuf and JSON Schema in Confluent's wire format.

An adapter beside the store and the broker: nodes keep no schema state of their own beyond a
cache of what the registry said (ids never change meaning), so any node serves any request.
"""

from .codecs import (
    Codec,
    ConversionError,
    Kind,
    NotFramed,
    SchemaInvalid,
    compile_schema,
    frame,
    unframe,
)
from .registry import (
    RegisteredSchema,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    SchemaIncompatible,
    SchemaNotFound,
    SchemaRejected,
)

__all__ = [
    "Codec", "ConversionError", "Kind", "NotFramed", "RegisteredSchema", "RegistryClient",
    "RegistryError", "RegistryUnavailable", "SchemaIncompatible", "SchemaInvalid",
    "SchemaNotFound", "SchemaRejected", "compile_schema", "frame", "unframe",
]
