"""HTTP plumbing every route module uses: the JSON response, the process's services, the API key
of a request, JSON bodies with a size limit, and the query-string rules.

No route lives here and no wire name: what a field is called is the wire modules' business.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..broker import QUEUE_ID
from ..core.auth import credential_of
from ..core.errors import TooLarge, invalid, unauthenticated
from ..services import Services
from ..store import Credential
from .numbers import json_int, query_int


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def queue_json(queue: str) -> dict[str, Any]:
    """A queue id on the wire: ``partition``, a number, for Kafka's; ``queue``, a string, for
    ids that are not numbers (RocketMQ's ``<broker>.<n>``)."""
    return {"partition": int(queue)} if queue.isdigit() else {"queue": queue}


def queue_param(raw: Any, partition: str | None) -> str | None:
    """A ``queue`` parameter (RocketMQ's queue ids), or the ``partition`` given instead."""
    if raw is None:
        return partition
    if partition is not None:
        raise invalid("invalid_queue", "give 'partition' or 'queue', not both")
    if not isinstance(raw, str) or not QUEUE_ID.fullmatch(raw):
        raise invalid("invalid_queue", "queue must be a queue id as /message answers it "
                      "(1-64 characters of letters, digits, '.', '_', '-')")
    return raw


def services(request: Request) -> Services:
    """The process's services (``gateway.services``), set by the app's lifespan."""
    s: Services = request.app.state.services
    return s


def api_credential(request: Request) -> Credential | None:
    """The API key in ``Authorization: Bearer <key>`` (or ``X-API-Key``); None when auth is off.
    A missing or malformed key is a 401 (the key's format is the core's rule)."""
    if not services(request).auth.enabled:
        return None
    raw = request.headers.get("authorization", "")
    if raw:
        scheme, _, raw = raw.partition(" ")
        if scheme.lower() != "bearer":
            raise unauthenticated("invalid_api_key", "use 'Authorization: Bearer <key>'")
        raw = raw.strip()
    else:
        raw = request.headers.get("x-api-key", "").strip()
    return credential_of(raw)


async def admin_services(request: Request) -> Services:
    """The services, once the request's key was found to be an admin key (when auth is on)."""
    s = services(request)
    await s.auth.require_admin(api_credential(request))
    return s


# -- bodies ----------------------------------------------------------------------------------
async def read_json(request: Request, limit: int, required: bool = False) -> Any:
    """Read a JSON body, refusing more than ``limit`` bytes before buffering it all. An empty
    body is ``{}``, or a 400 where the spec requires a body (``required``)."""
    declared = request.headers.get("content-length")
    if declared is not None and (n := query_int(declared)) is not None and n > limit:
        raise TooLarge("body_too_large", f"request body exceeds {limit} bytes", limit=limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge("body_too_large", f"request body exceeds {limit} bytes", limit=limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        if required:
            raise invalid("missing_body", "this request needs a JSON body")
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid("invalid_json", "request body is not valid JSON") from None


async def object_body(request: Request, required: bool = True) -> dict[str, Any]:
    """A JSON object body of at most ``max_body_bytes``."""
    body = await read_json(request, services(request).settings.max_body_bytes, required)
    if not isinstance(body, dict):
        raise invalid("invalid_body", "request body must be a JSON object")
    return body


# -- query strings ---------------------------------------------------------------------------
#: Operations that take no query parameters refuse any: a typo like ``?topci=`` or
#: ``?dry_run=true`` must not pass silently while the call does something else.
NO_PARAMS: frozenset[str] = frozenset()


def check_query(request: Request, known: frozenset[str], lists: frozenset[str] = frozenset(),
                body: Iterable[str] = ()) -> None:
    """Refuse a query string (and the ``body`` field names given with it) that names a parameter
    the operation does not take (``unknown_parameter``), or that repeats one that is not a list
    (``repeated_parameter``). A typo must not silently change what a call does
    (``deleteOffset=true`` would keep the offsets), and of ``max=1&max=1000`` a proxy or a cache
    in front may take another value than the gateway would."""
    names = Counter(k for k, _ in request.query_params.multi_items())
    unknown = sorted((names.keys() | set(body)) - known)
    if unknown:
        raise invalid("unknown_parameter", f"unknown parameter(s): {', '.join(unknown)} "
                      f"(this endpoint takes {', '.join(sorted(known)) or 'none'})",
                      parameters=unknown)
    repeated = sorted(n for n, count in names.items() if count > 1 and n not in lists)
    if repeated:
        raise invalid("repeated_parameter", f"parameter(s) given more than once: "
                      f"{', '.join(repeated)}", parameters=repeated)


def flag(request: Request, name: str, default: bool = False) -> bool:
    """A boolean query parameter: ``true``, ``false``, ``1`` or ``0``."""
    raw = request.query_params.get(name, "true" if default else "false").lower()
    if raw not in ("true", "false", "1", "0"):
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        raise invalid(f"invalid_{code}", f"{name} must be true or false")
    return raw in ("true", "1")


def query_number(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    """An integer query parameter in [lo, hi], ``default`` when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    n = query_int(raw)
    if n is None or not lo <= n <= hi:
        raise invalid(f"invalid_{name}", f"{name} must be an integer from {lo} to {hi}",
                      parameter=name, min=lo, max=hi)
    return n


@dataclass(frozen=True, slots=True)
class Params:
    """The parameters of /message, /ack and /unlock: the query string overlaid with a JSON body
    (POST). A body field wins, and ``null`` in a body is the same as leaving the field out."""

    query: Mapping[str, str]
    body: Mapping[str, Any]

    def get(self, name: str) -> Any:
        v = self.body.get(name)
        return self.query.get(name) if v is None else v

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        """An integer in [lo, hi], else ``400 invalid_<name>``. Read by where it came from
        (gateway/api/numbers.py): a JSON number in a body, ASCII digits in a query string."""
        v = self.body.get(name)
        if v is not None:
            n = json_int(v)
        elif name in self.query:
            n = query_int(self.query[name])
        else:
            return default
        if n is None:
            raise invalid(f"invalid_{name}", f"{name} must be an integer", parameter=name)
        if not lo <= n <= hi:
            raise invalid(f"invalid_{name}", f"{name} must be between {lo} and {hi}",
                          parameter=name, min=lo, max=hi)
        return n


async def params(request: Request, known: frozenset[str],
                 query_known: frozenset[str] | None = None) -> Params:
    """Query parameters and, for POST, a JSON object body; names outside ``known`` are refused,
    and in the query string those outside ``query_known`` too (fields read from the body only:
    ``?delayMs=`` must not be ignored)."""
    body: dict[str, Any] = {}
    if request.method == "POST":
        body = await object_body(request, required=False)
    check_query(request, known, body=body)
    if query_known is not None:
        check_query(request, query_known)
    return Params(request.query_params, body)
