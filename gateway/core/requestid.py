"""Signed, opaque ``requestId`` tokens that let any node ack a batch fetched on another.

A requestId names everything the ack needs (broker, consumer, queue, batch
offsets, the lock token and the high watermark the fetch saw), so nodes need no
memory of what they handed out.
The HMAC makes it unforgeable: an altered id could otherwise commit offsets
for another consumer.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from . import b64url
from .errors import Invalid, invalid

_VERSION = "3"
#: Fields per version: "1" (before fetch times) is still read, so a batch fetched before an
#: upgrade can be acked after it.
_FIELDS = {"1": 10, "2": 11, "3": 12}
_SEP = "\x1f"  # never valid in a consumer, clientId, topic or queue name
_SIG_BYTES = 16


@dataclass(frozen=True, slots=True)
class BatchRef:
    broker: str
    consumer: str
    client_id: str  # "" in cluster mode
    topic: str
    queue: str
    offset: int  # committed offset the batch starts at
    next_offset: int  # committed offset after a successful ack
    token: int  # lock token of the fetch that produced the batch
    high_watermark: int = -1  # learned from the fetch; the ack raises the stored max offset to it
    fetched_ms: int = 0  # when the batch was handed out (0: unknown); a nack keeps the first one
    #: The fetch's tag filter (``A||B``; "" for none): a nack reads the batch again with it.
    tags: str = ""


_INT = re.compile(r"-?[0-9]{1,19}")
#: Offsets and lock tokens are 64-bit integers: a wider number was not made by a gateway.
_INT64 = (-(2**63), 2**63 - 1)


def _malformed(why: str) -> Invalid:
    return invalid("invalid_request_id", f"requestId is malformed: {why}")


class RequestIdCodec:
    def __init__(self, key: str) -> None:
        self._key = key.encode()

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()[:_SIG_BYTES]

    def encode(self, ref: BatchRef) -> str:
        payload = _SEP.join(
            (_VERSION, ref.broker, ref.consumer, ref.client_id, ref.topic, ref.queue,
             str(ref.offset), str(ref.next_offset), str(ref.token), str(ref.high_watermark),
             str(ref.fetched_ms), ref.tags)
        ).encode()
        raw = payload + self._sign(payload)
        return b64url.encode(raw)

    def decode(self, text: str) -> BatchRef:
        """Verify and unpack; any tampering or garbage gives a 400 ``invalid_request_id``."""
        try:  # one spelling per requestId: no padding, no stray bits (core/b64url.py)
            raw = b64url.decode(text, 2048)
        except ValueError as e:
            raise _malformed(str(e)) from None
        payload, sig = raw[:-_SIG_BYTES], raw[-_SIG_BYTES:]
        parts = payload.decode("utf-8", "replace").split(_SEP)
        # the layout is public; the key is not
        if len(raw) <= _SIG_BYTES or len(parts) != _FIELDS.get(parts[0], 11):
            raise _malformed("not one that /message handed out")
        if not hmac.compare_digest(sig, self._sign(payload)):
            raise invalid("invalid_request_id", "requestId signature does not match: it was "
                          "altered, or signed with another gateway's key")
        if parts[0] not in _FIELDS:
            raise invalid("invalid_request_id", "requestId version is not supported")
        _, broker, consumer, client_id, topic, queue, *texts = parts
        tags = texts.pop() if parts[0] == "3" else ""
        numbers = [int(x) for x in texts if _INT.fullmatch(x)]
        if len(numbers) != len(texts) or not all(_INT64[0] <= n <= _INT64[1] for n in numbers):
            # signed with our key, yet not made by us: a leaked key, or a bug
            raise _malformed("its numbers are not 64-bit integers")
        offset, next_offset, token, high_watermark, *rest = numbers
        return BatchRef(broker, consumer, client_id, topic, queue, offset, next_offset, token,
                        high_watermark, rest[0] if rest else 0, tags)
