"""Signed, opaque ``requestId`` tokens that let any node ack a batch fetched on another.

A requestId names everything the ack needs (broker, consumer, queue, batch
offsets, the lock token and the high watermark the fetch saw), so nodes need no
memory of what they handed out.
The HMAC makes it unforgeable: an altered id could otherwise commit offsets
for someone else's group.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from .errors import bad_request

_VERSION = "1"
_FIELDS = 10
_SEP = "\x1f"  # never valid in a group, clientId, topic or queue name
_SIG_BYTES = 16


@dataclass(frozen=True, slots=True)
class BatchRef:
    broker: str
    group: str
    client_id: str  # "" in cluster mode
    topic: str
    queue: str
    offset: int  # committed offset the batch starts at
    next_offset: int  # committed offset after a successful ack
    token: int  # lock token of the fetch that produced the batch
    high_watermark: int = -1  # learned from the fetch; the ack raises the stored max offset to it


class RequestIdCodec:
    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_SIG_BYTES]

    def encode(self, ref: BatchRef) -> str:
        payload = _SEP.join(
            (_VERSION, ref.broker, ref.group, ref.client_id, ref.topic, ref.queue,
             str(ref.offset), str(ref.next_offset), str(ref.token), str(ref.high_watermark))
        ).encode()
        raw = payload + self._sign(payload)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def decode(self, text: str) -> BatchRef:
        """Verify and unpack; any tampering or garbage gives a 400 ``invalid_request_id``."""
        if not isinstance(text, str) or not text or len(text) > 2048:
            raise bad_request("invalid_request_id", "requestId is missing or malformed")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (ValueError, TypeError):
            raise bad_request("invalid_request_id", "requestId is not valid base64url") from None
        payload, sig = raw[:-_SIG_BYTES], raw[-_SIG_BYTES:]
        if len(raw) <= _SIG_BYTES or not hmac.compare_digest(sig, self._sign(payload)):
            raise bad_request("invalid_request_id", "requestId signature does not match")
        parts = payload.decode("utf-8", "replace").split(_SEP)
        if len(parts) != _FIELDS or parts[0] != _VERSION:
            raise bad_request("invalid_request_id", "requestId version is not supported")
        _, broker, group, client_id, topic, queue, off, nxt, tok, hw = parts
        try:
            nums = [int(x) for x in (off, nxt, tok, hw)]
        except ValueError:  # signed with our key, yet not made by us: a leaked key, or a bug
            raise bad_request("invalid_request_id", "requestId is malformed") from None
        return BatchRef(broker, group, client_id, topic, queue, *nums)
