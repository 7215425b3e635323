"""RocketMQ's remoting frames (gateway/broker/rocketmq/remoting.py): what the broker sends and
reads, byte for byte, and a connection that multiplexes calls over one socket."""

from __future__ import annotations

import asyncio
import struct

import orjson
import pytest

from gateway.broker.rocketmq.remoting import (
    Command,
    Connection,
    RemotingError,
    decode,
    encode,
    loads_lenient,
    request,
)


def test_a_json_frame_round_trips() -> None:
    req = request(310, {"a": "g", "b": "t"}, b"body")
    frame = encode(req)
    (total, mark) = struct.unpack_from(">ii", frame)
    assert total == len(frame) - 4 and mark >> 24 == 0  # serialize type JSON
    header = orjson.loads(frame[8:8 + (mark & 0xFFFFFF)])
    assert header["code"] == 310 and header["language"] == "PYTHON" and header["version"] >= 401
    assert header["extFields"] == {"a": "g", "b": "t"}
    back = decode(frame[4:])
    assert (back.code, back.ext, back.body, back.opaque) == (310, req.ext, b"body", req.opaque)


def test_the_binary_header_is_decoded() -> None:
    """``RocketMQSerializable``: the broker answers in it when asked in it."""
    ext = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
                   for k, v in ((b"queueOffset", b"7"), (b"msgId", b"AB")))
    head = struct.pack(">hBhii", 0, 0, 401, 42, 1) + struct.pack(">i", 2) + b"ok" + \
        struct.pack(">i", len(ext)) + ext
    frame = struct.pack(">i", (1 << 24) | len(head)) + head + b"xyz"
    cmd = decode(frame)
    assert (cmd.code, cmd.opaque, cmd.remark, cmd.body, cmd.is_response) == (0, 42, "ok", b"xyz", True)
    assert cmd.ext == {"queueOffset": "7", "msgId": "AB"}


def test_bare_integer_keys_of_the_name_server_are_read() -> None:
    body = b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"}}}}'
    assert loads_lenient(body)["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {
        "0": "127.0.0.1:10911", "1": "127.0.0.1:10921"}


def test_answers_out_of_order_reach_their_callers_and_a_lost_connection_fails_them() -> None:
    async def body() -> None:
        held: list[Command] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while len(held) < 2:
                (n,) = struct.unpack(">i", await reader.readexactly(4))
                held.append(decode(await reader.readexactly(n)))
            for cmd in reversed(held):  # the second request answered first
                writer.write(encode(Command(0, {"echo": str(cmd.code)}, opaque=cmd.opaque, flag=1)))
            (n,) = struct.unpack(">i", await reader.readexactly(4))  # a third: never answered
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = Connection(f"127.0.0.1:{port}")
        try:
            a, b = await asyncio.gather(conn.call(request(30), 5), conn.call(request(31), 5))
            assert (a.ext["echo"], b.ext["echo"]) == ("30", "31")
            with pytest.raises(RemotingError):
                await conn.call(request(11), 5)
        finally:
            await conn.close()
            server.close()
            await server.wait_closed()
    asyncio.run(body())


def test_nothing_listening_is_a_remoting_error() -> None:
    async def body() -> None:
        conn = Connection("127.0.0.1:1", connect_timeout=1)
        with pytest.raises(RemotingError):
            await conn.call(request(30), 1)
    asyncio.run(body())
