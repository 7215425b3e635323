"""RocketMQ's stored records as the broker writes them, for the unit tests of the adapter's
decoding and offset rules (no broker needed)."""

from __future__ import annotations

import struct

from gateway.broker.rocketmq.message import MAGIC_V1, format_properties


def stored(offset: int, body: bytes, props: dict[str, str], topic: str = "t", sys_flag: int = 0,
           born: int = 1000, store: int = 2000) -> bytes:
    """One record as the commit log holds it (``MessageDecoder.decode``, V1, IPv4 hosts)."""
    p = format_properties(props).encode()
    t = topic.encode()
    rest = (struct.pack(">iiiqqiq", 0, 3, 0, offset, 12345, sys_flag, born)
            + bytes([127, 0, 0, 1]) + struct.pack(">i", 1) + struct.pack(">q", store)
            + bytes([127, 0, 0, 1]) + struct.pack(">i", 2) + struct.pack(">iq", 0, 0)
            + struct.pack(">i", len(body)) + body + bytes([len(t)]) + t
            + struct.pack(">h", len(p)) + p)
    return struct.pack(">ii", 8 + len(rest), MAGIC_V1) + rest
