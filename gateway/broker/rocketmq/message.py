"""RocketMQ's message format: stored records (pull answers), properties, message ids, names.

Stored record (``MessageDecoder.decode``, big-endian): ``i32 totalSize, i32 magic, i32 bodyCRC,
i32 queueId, i32 flag, i64 queueOffset, i64 physicalOffset, i32 sysFlag, i64 bornTimestamp,
bornHost (4 or 16 bytes) + i32 port, i64 storeTimestamp, storeHost + i32 port,
i32 reconsumeTimes, i64 preparedTransactionOffset, i32 length + body, topic length (i8 in V1,
i16 in V2) + topic, i16 length + properties``. Properties are ``name \\x01 value \\x02``...
"""

from __future__ import annotations

import calendar
import hashlib
import itertools
import os
import struct
import time
import zlib
from dataclasses import dataclass

MAGIC_V1 = -626843481
MAGIC_V2 = -626843477
# MessageSysFlag
COMPRESSED = 0x1
BORN_HOST_V6 = 0x10
STORE_HOST_V6 = 0x20
_COMPRESSION_SHIFT, _COMPRESSION_MASK = 8, 0x7
_LZ4, _ZSTD, _ZLIB = 1, 2, 3
NAME_VALUE_SEP, PROPERTY_SEP = "\x01", "\x02"

KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
WAIT = "WAIT"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
#: Set by the broker on a record its timer delivered: when the timer let it go.
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
#: ``MessageConst.STRING_HASH_SET`` (5.x): the broker's and the Java client's own properties.
#: They are not a record's headers, and a header may not take one of their names (the Java
#: client refuses them as user properties, ``Message.putUserProperty``).
SYSTEM_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
    "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY",
    "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE",
    "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
    "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC",
    "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#",
})
#: Properties under this prefix are the broker's, never stored (``PROPERTY_TRANSIENT_PREFIX``).
TRANSIENT_PREFIX = "__RMQ.TRANSIENT."
#: RocketMQ stores no empty body (the broker fails a send without one: a NullPointerException in
#: ``buildMsgContext``, 5.5.0), while Kafka records may have a null or an empty value: such a
#: record is stored with a one-byte body and this property, ``null`` or ``empty``.
VALUE_MARK = "mqgw-value"
PLACEHOLDER_BODY = b"\0"


@dataclass(slots=True)
class StoredMessage:
    queue_id: int
    queue_offset: int
    sys_flag: int
    born_timestamp: int
    store_timestamp: int
    body: bytes | None
    topic: str
    properties: dict[str, str]
    #: Why the body could not be read (a codec not installed); the body is then None.
    error: str | None = None

    @property
    def value(self) -> bytes | None:
        mark = self.properties.get(VALUE_MARK)
        if mark == "null":
            return None
        if mark == "empty":
            return b""
        return self.body

    @property
    def tag(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def key(self) -> bytes | None:
        keys = self.properties.get(KEYS)
        return keys.encode() if keys is not None else None

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return [(k, v.encode()) for k, v in self.properties.items()
                if k not in SYSTEM_PROPERTIES and k != VALUE_MARK and not k.startswith(TRANSIENT_PREFIX)]


class UndecodableBody(Exception):
    """A body compressed with a codec this process cannot decompress."""


_FIXED = struct.Struct(">iiiiiqqiq")  # size, magic, crc, queueId, flag, queueOffset, physical, sysFlag, born


def decode_messages(buf: bytes) -> list[StoredMessage]:
    """Every record of a pull answer's body."""
    out: list[StoredMessage] = []
    view = memoryview(buf)
    pos = 0
    n = len(buf)
    while pos + _FIXED.size <= n:
        size, magic, _crc, queue_id, _flag, queue_offset, _phys, sys_flag, born = \
            _FIXED.unpack_from(view, pos)
        if size <= 0 or pos + size > n:
            break
        p = pos + _FIXED.size
        p += (16 if sys_flag & BORN_HOST_V6 else 4) + 4
        (store_ts,) = struct.unpack_from(">q", view, p)
        p += 8 + (16 if sys_flag & STORE_HOST_V6 else 4) + 4
        p += 4 + 8  # reconsumeTimes, preparedTransactionOffset
        (blen,) = struct.unpack_from(">i", view, p)
        p += 4
        body = bytes(view[p:p + blen]) if blen > 0 else None
        p += max(blen, 0)
        if magic == MAGIC_V2:
            (tlen,) = struct.unpack_from(">h", view, p)
            p += 2
        else:
            tlen = view[p]
            p += 1
        topic = bytes(view[p:p + tlen]).decode()
        p += tlen
        (plen,) = struct.unpack_from(">h", view, p)
        p += 2
        props = parse_properties(bytes(view[p:p + plen]).decode()) if plen > 0 else {}
        error = None
        if body is not None and sys_flag & COMPRESSED:
            try:
                body = decompress(body, (sys_flag >> _COMPRESSION_SHIFT) & _COMPRESSION_MASK)
            except (UndecodableBody, zlib.error) as e:
                body, error = None, str(e)
        out.append(StoredMessage(queue_id, queue_offset, sys_flag, born, store_ts, body, topic,
                                 props, error))
        pos += size
    return out


def decompress(body: bytes, kind: int) -> bytes:
    """Compression types of ``MessageSysFlag``: the Java producer zlib-compresses bodies over
    4 KiB by default; LZ4 (frame) and ZSTD need their Python packages, when installed."""
    if kind in (_ZLIB, 0):  # 0: a 4.x producer, always zlib
        return zlib.decompress(body)
    try:
        if kind == _LZ4:
            import lz4.frame  # type: ignore[import-not-found]

            return bytes(lz4.frame.decompress(body))
        if kind == _ZSTD:
            import zstandard  # type: ignore[import-not-found]

            return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(body))
    except ImportError as e:
        raise UndecodableBody(f"body compressed with codec {kind}: install {e.name}") from e
    raise UndecodableBody(f"unknown compression type {kind}")


def parse_properties(s: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in s.split(PROPERTY_SEP):
        name, sep, value = item.partition(NAME_VALUE_SEP)
        if sep:
            out[name] = value
    return out


def format_properties(props: dict[str, str]) -> str:
    return "".join(f"{k}{NAME_VALUE_SEP}{v}{PROPERTY_SEP}" for k, v in props.items())


def property_problem(name: str, value: str) -> str | None:
    """Why a header cannot be a RocketMQ user property (None: it can)."""
    if name in SYSTEM_PROPERTIES or name == VALUE_MARK or name.startswith(TRANSIENT_PREFIX):
        return f"header {name!r} is a RocketMQ system property name"
    if not name or not value:
        return "RocketMQ properties need a non-empty name and value"
    if any(c in name or c in value for c in (NAME_VALUE_SEP, PROPERTY_SEP)):
        return "header names and values may not contain the characters \\x01 or \\x02"
    return None


# -- message ids ---------------------------------------------------------------------------
_counter = itertools.count(int.from_bytes(os.urandom(2), "big"))
_prefix = ""
_prefix_pid = -1


def _id_prefix() -> str:
    """``MessageClientIDSetter``'s fixed part: IPv4 (4 bytes), pid (2), a class-loader hash (4,
    here random per process). Recomputed after a fork (uvicorn workers)."""
    global _prefix, _prefix_pid
    if _prefix_pid != os.getpid():
        _prefix_pid = os.getpid()
        _prefix = (bytes([127, 0, 0, 1]) + (_prefix_pid & 0xFFFF).to_bytes(2, "big")
                   + os.urandom(4)).hex().upper()
    return _prefix


_month = (0.0, 0.0)  # (start of the current month, start of the next), epoch seconds, UTC


def _month_start(now: float) -> float:
    """Cached: ``gmtime`` + ``timegm`` for every record was 15 % of a worker's samples in the
    p100 bench phase (8.6 us a call)."""
    global _month
    start, end = _month
    if not start <= now < end:
        t = time.gmtime(now)
        start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
        ny, nm = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        _month = (start, calendar.timegm((ny, nm, 1, 0, 0, 0)))
    return start


def new_unique_key() -> str:
    """A message id (``UNIQ_KEY``) in the Java client's form: 32 hex digits, the prefix, ms
    since the start of the month (4 bytes), a counter (2). Tools and the broker's recall
    handles read it."""
    now = time.time()
    since = int((now - _month_start(now)) * 1000) & 0xFFFFFFFF
    return f"{_id_prefix()}{since:08X}{next(_counter) & 0xFFFF:04X}"


# -- names -------------------------------------------------------------------------------------
#: RocketMQ's limits (``TopicValidator``): ``^[%|a-zA-Z0-9_-]+$``, topics up to 127 characters,
#: groups up to 120.
TOPIC_MAX, GROUP_MAX = 127, 120


def to_broker_name(name: str) -> str:
    """A gateway name as RocketMQ spells it. Gateway names may contain '.', RocketMQ's may not,
    and '|' is the other way round, so '.' <-> '|' maps every name either side allows one to
    one, and RocketMQ names (no '.') to themselves."""
    return name.replace(".", "|")


def from_broker_name(name: str) -> str:
    return name.replace("|", ".")


def group_name(name: str) -> str:
    """A consumer group for ``name`` within RocketMQ's 120 characters: longer ones keep a prefix
    and end in a hash of the whole name."""
    g = to_broker_name(name)
    if len(g) <= GROUP_MAX:
        return g
    return f"{g[:GROUP_MAX - 17]}-{hashlib.sha256(g.encode()).hexdigest()[:16]}"
