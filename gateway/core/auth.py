"""API keys: ``mqgw_<id>_<secret>``, kept in Redis only as SHA-256 and compared in constant time.

A key binds identities, not topics: the producers it may produce as, the consumers it may
consume as, and whether it may use the admin API. What a producer may write and what a
consumer may read is the registry's business (``registry.py``), so changing a registration
changes what every key bound to it may do, at once.

The consume side is checked inside the choose/ack/unlock scripts: creating a key copies its
digest into ``P:{G}:auth`` of every consumer it names (the same Redis slot as that consumer's
offsets), so ``/message`` and ``/ack`` pay no extra round trip for auth. The slower paths
(admin calls, telling 401 from 403 after a refusal) read the key record itself.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import asdict, dataclass, field

from ..store import Credential, OffsetStore, now_ms
from .errors import DomainError, denied, unauthenticated

_KEY = re.compile(r"mqgw_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh (key id, key): 64 bits of id, 256 bits of secret."""
    key_id = secrets.token_hex(8)
    return key_id, f"mqgw_{key_id}_{secrets.token_urlsafe(32)}"


def credential_of(raw: str) -> Credential:
    """The credential of a key as the caller presented it; 401 if absent or malformed. (Where
    it is presented, a header, is the transport's business: see gateway.api.http.)"""
    if not raw:
        raise unauthenticated("missing_api_key", "this gateway requires an API key: "
                              "send 'Authorization: Bearer <key>'")
    m = _KEY.fullmatch(raw)
    if not m:
        raise unauthenticated("invalid_api_key", "the API key is not valid")
    return Credential(m.group(1), digest(raw))


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    name: str
    sha256: str
    admin: bool = False
    producers: list[str] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)
    created_ms: int = 0


class KeyStore:
    """Create, look up, verify and revoke keys (``P:{reg}:keys`` plus per-consumer grants)."""

    def __init__(self, store: OffsetStore) -> None:
        self.store = store
        self.records = store.registry

    async def create(self, name: str, *, admin: bool = False, producers: list[str] | None = None,
                     consumers: list[str] | None = None) -> tuple[str, KeyRecord]:
        key_id, key = new_key()
        rec = KeyRecord(key_id, name, digest(key), admin, sorted(set(producers or [])),
                        sorted(set(consumers or [])), now_ms())
        # Grants first, record last: a key is never usable for the admin API before its
        # record exists, and revoke() undoes in the opposite order.
        await self.records.grant(key_id, rec.sha256, rec.consumers)
        await self.records.put_key(key_id, asdict(rec))
        return key, rec

    async def get(self, key_id: str) -> KeyRecord | None:
        raw = await self.records.key(key_id)
        return KeyRecord(**raw) if raw else None

    async def all(self) -> list[KeyRecord]:
        return sorted((KeyRecord(**r) for r in await self.records.all_keys()),
                      key=lambda r: (r.created_ms, r.id))

    async def verify(self, cred: Credential) -> KeyRecord | None:
        rec = await self.get(cred.key_id)
        if rec is None or not hmac.compare_digest(rec.sha256, cred.sha256):
            return None
        return rec

    async def revoke(self, key_id: str) -> KeyRecord | None:
        rec = await self.get(key_id)
        if rec is None:
            return None
        # Grants first, the record last: if this stops half-way, the key is still listed and a
        # second DELETE finishes the job (the other order left grants no DELETE could reach).
        await self.records.revoke_grants(key_id, rec.consumers)
        await self.records.delete_key(key_id)
        return rec


class Authorizer:
    """Request-level checks for the paths that are not inside a consume script."""

    def __init__(self, enabled: bool, keys: KeyStore) -> None:
        self.enabled = enabled
        self.keys = keys

    async def caller(self, cred: Credential | None) -> KeyRecord | None:
        """The verified key record (None when auth is off); 401 for unknown or wrong keys."""
        if cred is None:
            return None
        rec = await self.keys.verify(cred)
        if rec is None:
            raise unauthenticated("invalid_api_key", "the API key is not valid")
        return rec

    async def require_admin(self, cred: Credential | None) -> None:
        rec = await self.caller(cred)
        if rec is not None and not rec.admin:
            raise denied("forbidden", "this API key may not use the admin API")

    async def is_admin(self, cred: Credential | None) -> bool:
        """Whether ``cred`` is a valid admin key (False without one; 401 for a bad one)."""
        rec = await self.caller(cred)
        return rec is not None and rec.admin

    async def require_consumer(self, cred: Credential | None, consumer: str) -> None:
        """For a consumer's own views: an admin key or a key bound to that consumer."""
        rec = await self.caller(cred)
        if rec is not None and not rec.admin and consumer not in rec.consumers:
            raise denied("forbidden", f"this API key may not act as consumer {consumer!r}")

    async def require_consume(self, cred: Credential | None, consumer: str) -> None:
        """The slow check, for error paths that run before a consume script has checked the key
        (an unknown topic must not answer 404 to a caller without a valid key)."""
        if cred is None:
            return
        rec = await self.keys.verify(cred)
        if rec is None:
            raise unauthenticated("invalid_api_key", "the API key is not valid")
        if consumer not in rec.consumers:
            raise denied("forbidden", f"this API key may not consume as {consumer!r}")

    async def consume_refused(self, cred: Credential | None, consumer: str) -> DomainError:
        """A consume script said ``unauthorized``: 401 for a bad key, 403 for a key of someone else."""
        if cred is None or await self.keys.verify(cred) is None:
            return unauthenticated("invalid_api_key", "the API key is not valid")
        return denied("forbidden", f"this API key may not consume as {consumer!r}")
