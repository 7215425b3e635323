"""A client of the user's Schema Registry, by Confluent's API (the Confluent Schema Registry,
Apicurio Registry's ``/apis/ccompat/v6``, Karapace): register a schema under a subject, read
one by id. Nodes keep what it said in memory only: an id's schema never changes, and a schema
registered once under a subject keeps its id, so a node that dies loses nothing.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from .codecs import Kind

_MEDIA = "application/vnd.schemaregistry.v1+json"
#: Cached schemas at most (by id, and by subject and text): beyond it the cache starts again.
CACHE_MAX = 10_000


class RegistryError(Exception):
    """The registry refused: ``message`` is its own words."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class RegistryUnavailable(RegistryError):
    """The registry did not answer, or answered 5xx (or refused this gateway's credentials)."""


class SchemaNotFound(RegistryError):
    """No schema has that id."""


class SchemaIncompatible(RegistryError):
    """The subject's compatibility rule refused the schema (the registry's 409)."""


class SchemaRejected(RegistryError):
    """The registry found the schema invalid (its 422)."""


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    id: int
    text: str
    #: The registry's ``schemaType``; None when it did not say (Confluent omits it for Avro,
    #: Apicurio 2.0 for every type).
    kind: Kind | None


class RegistryClient:
    """One pooled HTTP client per process."""

    def __init__(self, url: str, user_info: str = "", timeout_ms: int = 5_000,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Accept": _MEDIA, "Content-Type": _MEDIA}
        if user_info:
            headers["Authorization"] = "Basic " + base64.b64encode(user_info.encode()).decode()
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(headers=headers, timeout=timeout_ms / 1000,
                                      transport=transport)
        self._by_id: dict[int, RegisteredSchema] = {}
        self._ids: dict[tuple[str, Kind, str], int] = {}

    async def close(self) -> None:
        await self.http.aclose()

    async def register(self, subject: str, kind: Kind, text: str) -> int:
        """The id of ``text`` under ``subject``, registered there if it was not."""
        key = (subject, kind, text)
        found = self._ids.get(key)
        if found is not None:
            return found
        body: dict[str, Any] = {"schema": text}
        if kind is not Kind.AVRO:
            body["schemaType"] = kind.value
        got = await self._call("POST", f"/subjects/{quote(subject, safe='')}/versions", body)
        schema_id = int(got["id"])
        if len(self._ids) >= CACHE_MAX:
            self._ids.clear()
        self._ids[key] = schema_id
        self._keep(RegisteredSchema(schema_id, text, kind))
        return schema_id

    async def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema of an id (SchemaNotFound if none has it)."""
        found = self._by_id.get(schema_id)
        if found is not None:
            return found
        got = await self._call("GET", f"/schemas/ids/{schema_id}", None)
        kind = got.get("schemaType")
        s = RegisteredSchema(schema_id, str(got["schema"]),
                             Kind(kind) if kind in Kind.__members__ else None)
        self._keep(s)
        return s

    def _keep(self, s: RegisteredSchema) -> None:
        if len(self._by_id) >= CACHE_MAX:
            self._by_id.clear()
        self._by_id[s.id] = s

    async def _call(self, method: str, path: str, body: Any) -> dict[str, Any]:
        try:
            r = await self.http.request(method, self.url + path,
                                        content=orjson.dumps(body) if body is not None else None)
        except httpx.HTTPError as e:
            raise RegistryUnavailable(f"the schema registry at {self.url} did not answer: "
                                      f"{type(e).__name__}") from None
        try:
            got = orjson.loads(r.content) if r.content else {}
        except orjson.JSONDecodeError:
            got = {}
        if not isinstance(got, dict):
            got = {}
        message = str(got.get("message") or r.reason_phrase)
        if r.status_code < 300:
            return got
        if r.status_code == 404 and got.get("error_code") in (40403, 404):
            raise SchemaNotFound(message, 404)
        if r.status_code == 409:
            raise SchemaIncompatible(message, 409)
        if r.status_code == 422:
            raise SchemaRejected(message, 422)
        raise RegistryUnavailable(f"the schema registry answered {r.status_code}: {message}",
                                  r.status_code)

