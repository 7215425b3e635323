"""RocketMQ's TCP remoting protocol: frames, and one multiplexed asyncio connection per address.

Why our own client: pull at an explicit offset, which the gateway needs, exists only in this
protocol (the Java ``DefaultMQPullConsumer``'s); the 5.x gRPC proxy answers UNIMPLEMENTED for
it, and the Python wheels either do not load or have no pull (issue 22, measured on 5.5.0).

A frame (``RemotingCommand.encode``/``decode``, big-endian): ``i32 length`` of all that follows,
``i32`` with the serialize type in its high byte and the header length in the low 24 bits, the
header, the body. We send JSON headers; the broker answers in the serialize type it was asked
in, but the binary ("ROCKETMQ") header is decoded too. Requests and answers are matched by
``opaque``: answers come in any order, so one connection carries many calls at once.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...aio import stop_task

#: Request version sent: 401 (V4_9_4) or later, or the name server writes route JSON with
#: non-string keys that no standard JSON parser reads (ClientRequestProcessor, measured).
VERSION = 401
FLAG_RESPONSE = 1
FLAG_ONEWAY = 2
_JSON, _ROCKETMQ = 0, 1
_HEAD = struct.Struct(">ii")
_opaques = itertools.count(1)


class RemotingError(Exception):
    """The connection failed or a call timed out: the broker's or name server's fault, retry."""


@dataclass(slots=True)
class Command:
    code: int
    ext: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None
    opaque: int = 0
    flag: int = 0
    version: int = VERSION

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)


def request(code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> Command:
    """A request with a fresh opaque. Every extField value is a string on the wire."""
    return Command(code, ext or {}, body, opaque=next(_opaques))


def encode(cmd: Command) -> bytes:
    header = orjson.dumps({"code": cmd.code, "language": "PYTHON", "version": cmd.version,
                           "opaque": cmd.opaque, "flag": cmd.flag, "remark": cmd.remark,
                           "extFields": cmd.ext})
    return _HEAD.pack(4 + len(header) + len(cmd.body), len(header)) + header + cmd.body


def decode(frame: bytes | memoryview) -> Command:
    """One frame without its leading length."""
    (mark,) = struct.unpack_from(">i", frame, 0)
    kind, hlen = (mark >> 24) & 0xFF, mark & 0xFFFFFF
    head = bytes(frame[4:4 + hlen])
    body = bytes(frame[4 + hlen:])
    if kind == _JSON:
        h: dict[str, Any] = orjson.loads(head)
        ext = {str(k): str(v) for k, v in (h.get("extFields") or {}).items()}
        return Command(int(h["code"]), ext, body, h.get("remark"), int(h.get("opaque", 0)),
                       int(h.get("flag", 0)), int(h.get("version", 0)))
    if kind == _ROCKETMQ:
        return _decode_binary(head, body)
    raise RemotingError(f"unknown serialize type {kind}")


def _decode_binary(h: bytes, body: bytes) -> Command:
    """``RocketMQSerializable.rocketMQProtocolDecode``: u16 code, u8 language, u16 version, i32
    opaque, i32 flag, i32 length + remark, i32 length + ext map of (u16 length + key, i32 length
    + value)."""
    code, _lang, version, opaque, flag, rlen = struct.unpack_from(">hBhiii", h, 0)
    pos = 17  # 2 + 1 + 2 + 4 + 4 + 4 (the remark's length)
    remark = h[pos:pos + rlen].decode() if rlen > 0 else None
    pos += max(rlen, 0)
    (elen,) = struct.unpack_from(">i", h, pos)
    pos += 4
    end = pos + max(elen, 0)
    ext: dict[str, str] = {}
    while pos < end:
        (klen,) = struct.unpack_from(">h", h, pos)
        key = h[pos + 2:pos + 2 + klen].decode()
        pos += 2 + klen
        (vlen,) = struct.unpack_from(">i", h, pos)
        ext[key] = h[pos + 4:pos + 4 + vlen].decode()
        pos += 4 + vlen
    return Command(code, ext, body, remark, opaque, flag, version)


_BARE_KEY = re.compile(rb'([{,])(-?\d+):')


def loads_lenient(body: bytes) -> Any:
    """JSON from the name server or broker, whose fastjson writes integer map keys bare
    (``{0:"127.0.0.1:10911"}``, GET_BROKER_CLUSTER_INFO): quoted before parsing. Only bodies of
    addresses and names go through here, so no string value holds such a pattern."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return orjson.loads(_BARE_KEY.sub(rb'\1"\2":', body))


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


def call_sync(addr: str, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
              timeout: float = 3.0) -> Command:
    """One blocking call on a connection of its own: for readiness probes and tools, never on
    the gateway's request path."""
    req = request(code, ext, body)
    with socket.create_connection(split_addr(addr), timeout=timeout) as s:
        s.sendall(encode(req))
        while True:
            (length,) = struct.unpack(">i", _recv_exact(s, 4))
            cmd = decode(_recv_exact(s, length))
            if cmd.opaque == req.opaque and cmd.is_response:
                return cmd


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise RemotingError("connection closed")
        buf += chunk
    return bytes(buf)


class Connection:
    """One TCP connection to a name server or broker, shared by every concurrent call: each
    call waits on a future keyed by its opaque, one reader task completes them."""

    def __init__(self, addr: str, connect_timeout: float = 3.0) -> None:
        self.addr = addr
        self._connect_timeout = connect_timeout
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Command]] = {}
        self._connecting: asyncio.Lock | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def _connect(self) -> asyncio.StreamWriter:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            host, port = split_addr(self.addr)
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), self._connect_timeout)
            except (OSError, TimeoutError) as e:
                raise RemotingError(f"cannot connect to {self.addr}: {e or type(e).__name__}") from e
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._writer = writer
            self._reader_task = asyncio.create_task(self._read(reader, writer))
            return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error: BaseException = RemotingError(f"connection to {self.addr} closed")
        try:
            while True:
                head = await reader.readexactly(4)
                (length,) = struct.unpack(">i", head)
                cmd = decode(await reader.readexactly(length))
                if not cmd.is_response:
                    continue  # the server's own requests: none come to a client without heartbeats
                fut = self._pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
        except (OSError, asyncio.IncompleteReadError, RemotingError, ValueError) as e:
            error = RemotingError(f"connection to {self.addr} lost: {e or type(e).__name__}")
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            pending, self._pending = self._pending, {}
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(error)

    async def call(self, req: Command, wait_s: float) -> Command:
        """Send ``req`` and wait for its answer; :class:`RemotingError` on a failed connection or
        after ``wait_s`` seconds."""
        writer = self._writer if self.connected else await self._connect()
        assert writer is not None
        fut: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._pending[req.opaque] = fut
        try:
            writer.write(encode(req))
            return await asyncio.wait_for(fut, wait_s)
        except TimeoutError as e:
            raise RemotingError(f"{self.addr} did not answer request {req.code} in {wait_s:g} s") from e
        finally:
            self._pending.pop(req.opaque, None)

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self._reader_task is not None:
            await stop_task(self._reader_task)
            self._reader_task = None
