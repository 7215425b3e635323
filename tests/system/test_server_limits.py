"""Bounded request heads and bounded pipelining (issue 20), against nodes started as `mqgw serve`
starts them, over raw sockets.

Before: nothing bounded a request head. httptools joins the pieces of a header by copying, so
10 connections streaming an endless header took a node from 478 to 999 MB and stalled /produce
for 6.9 s; and uvicorn parsed every pipelined request of a read ahead, thousands per read. The
rules are in gateway/api/server.py. The assertions are on outcomes (status, closed), with
generous bounds only as timeouts.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.api import server
from gateway.api.server import MAX_PIPELINED, GatewayHttpProtocol

from ..support import TLS, Node

CAP = 8192  # max_head_bytes of these nodes


def _port(node: Node) -> int:
    return int(node.url.rsplit(":", 1)[1])


def _dropped(node: Node, reason: str) -> float:
    text = httpx.get(f"{node.url}/metrics", verify=TLS).text
    m = re.search(rf'mqgw_connections_dropped_total\{{reason="{reason}"\}} (\S+)', text)
    return float(m.group(1)) if m else 0.0


async def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` at once and read until the server ends the connection (a reset after its
    answer counts as the end)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    chunks = []
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 20):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return b"".join(chunks)


def _get(path: str, headers: list[tuple[str, str]]) -> bytes:
    lines = "".join(f"{n}: {v}\r\n" for n, v in headers)
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n".encode()


async def _stream_head(port: int, start: bytes, piece: bytes, give_up_bytes: int) -> tuple[bytes, int]:
    """Send ``start``, then ``piece`` after ``piece`` (a head that never ends), reading at the same
    time; return what the server answered once it ended the connection, and how many bytes had
    been sent by then."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0

    async def stream() -> None:
        nonlocal sent
        writer.write(start)
        try:
            while sent < give_up_bytes:
                writer.write(piece)
                sent += len(piece)
                await writer.drain()
                await asyncio.sleep(0.002)  # separate reads, as a trickling client makes
        except ConnectionError:
            pass

    task = asyncio.ensure_future(stream())
    chunks = []
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 30):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    finally:
        at_end = sent
        task.cancel()
        writer.close()
    return b"".join(chunks), at_end


def test_an_endless_header_gets_431_and_a_close_once_past_the_cap(node_factory: Callable[..., Node]) -> None:
    node = node_factory(workers=1, max_head_bytes=CAP)
    answer, sent = asyncio.run(_stream_head(_port(node), b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ",
                                            b"a" * 512, 100 * CAP))
    # Before, this head went on until the head timeout (5 s; 408), the client long done sending.
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"connection: close" in answer and b'"headers_too_large"' in answer
    assert CAP <= sent < 100 * CAP  # cut past the cap, long before the client gave up
    assert _dropped(node, "head_too_large") >= 1
    assert httpx.get(f"{node.url}/healthz", verify=TLS).status_code == 200


def test_heads_are_measured_whole_and_bodies_are_not_counted(node_factory: Callable[..., Node],
                                                             make_topic: Callable[..., str]) -> None:
    node = node_factory(workers=1, max_head_bytes=CAP)
    port = _port(node)
    over = asyncio.run(_exchange(port, _get("/healthz", [("X-Big", "b" * (CAP + 100))])))
    assert over.startswith(b"HTTP/1.1 431 "), over[:300]
    under = asyncio.run(_exchange(port, _get("/healthz", [(f"X-H{i}", "h" * 700) for i in range(10)])))
    assert under.startswith(b"HTTP/1.1 200 "), under[:300]
    # a normal large request: a head of a few KB and a 4 MB body, sent with it in one go
    topic = make_topic(1)
    body = b'{"topic": "%s", "messages": [%s]}' % (
        topic.encode(), b",".join(b'{"value": "%s"}' % (b"v" * 1000) for _ in range(4000)))
    head = (b"POST /produce HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"".join(b"X-Trace-%d: %s\r\n" % (i, b"t" * 200) for i in range(20))
            + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
    answer = asyncio.run(_exchange(port, head + body))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:500]
    assert b'"failed":0' in answer.replace(b" ", b"")


def test_too_many_header_fields_get_431(node_factory: Callable[..., Node]) -> None:
    node = node_factory(workers=1, max_headers=20)
    port = _port(node)
    # Host and Connection are fields too: 18 more make 20
    ok = asyncio.run(_exchange(port, _get("/healthz", [(f"X-{i}", "v") for i in range(18)])))
    assert ok.startswith(b"HTTP/1.1 200 "), ok[:300]
    refused = asyncio.run(_exchange(port, _get("/healthz", [(f"X-{i}", "v") for i in range(19)])))
    assert refused.startswith(b"HTTP/1.1 431 "), refused[:300]
    assert b"header fields" in refused
    # ... and a head of small fields that never ends, well under the byte cap
    answer, _ = asyncio.run(_stream_head(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-a: b\r\n",
                                         100_000))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]


def test_pipelined_requests_are_bounded(node_factory: Callable[..., Node]) -> None:
    node = node_factory(workers=1)
    port = _port(node)
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

    async def within_bound() -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(one * 10)
            got = b""
            while got.count(b"HTTP/1.1 200 ") < 10:
                got += await asyncio.wait_for(reader.read(65536), 20)
            writer.write(one)  # the connection is still open and serves on
            more = await asyncio.wait_for(reader.read(65536), 20)
            return got, more
        finally:
            writer.close()

    got, more = asyncio.run(within_bound())
    assert got.count(b"HTTP/1.1 200 ") == 10 and more.startswith(b"HTTP/1.1 200 "), (got, more)
    # 200 requests in one write: one is answered at once, MAX_PIPELINED wait, the rest are not
    # parsed; the connection ends after the last queued answer (the client retries the rest)
    answer = asyncio.run(_exchange(port, one * 200))
    assert answer.count(b"HTTP/1.1 200 ") == MAX_PIPELINED + 1, answer.count(b"HTTP/1.1 ")
    assert answer.count(b"HTTP/1.1 ") == MAX_PIPELINED + 1
    assert _dropped(node, "pipeline_full") >= 1


# -- the same rules in one process: the protocol on a fake transport -----------------------------
# Exact cases a socket cannot pin down: where reads split, what the kernel buffers hold.

class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = self.aborted = self.eof = self.paused = False
        self.unsent = 0  # what get_write_buffer_size answers
        self.protocol: Any = None

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol
        self._data_received = protocol.data_received  # kept, as uvloop keeps it

    def receive(self, data: bytes) -> None:
        """Bytes from the client, to the protocol the transport has now."""
        if not self.paused:
            self._data_received(data)

    def write(self, data: bytes) -> None:
        self.data += data

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)


async def _echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with the size of the request body it read."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _protocol(max_head: int = 1000, max_headers: int = 100,
              cap: int = 100) -> tuple[GatewayHttpProtocol, FakeTransport]:
    """A connection of the server's protocol (call inside a running loop)."""
    config = Config(app=_echo_app, log_config=None, access_log=False)
    config.load()
    p = GatewayHttpProtocol(config=config, server_state=ServerState(), app_state={},
                            _loop=asyncio.get_running_loop())
    p._max_head, p._max_headers, p._cap = max_head, max_headers, cap
    t = FakeTransport()
    t.set_protocol(p)
    p.connection_made(t)  # type: ignore[arg-type]
    return p, t


async def _settle() -> None:
    for _ in range(20):  # the request tasks run, the corked writes go out
        await asyncio.sleep(0)


def _head(size: int) -> bytes:
    """A GET head of exactly ``size`` bytes."""
    start = b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: "
    return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("piece", [0, 7, 100])  # whole, or trickled in pieces of this size
def test_a_head_of_the_cap_passes_and_one_byte_more_does_not(piece: int) -> None:
    async def main(size: int) -> bytes:
        _, t = _protocol(max_head=1000)
        data = _head(size)
        for i in range(0, len(data), piece or len(data)):
            t.receive(data[i:i + (piece or len(data))])
            await _settle()
            if t.closed or t.eof:
                break
        await _settle()
        return bytes(t.data)

    assert asyncio.run(main(1000)).startswith(b"HTTP/1.1 200 ")
    assert asyncio.run(main(1001)).startswith(b"HTTP/1.1 431 ")


def test_a_large_body_does_not_count_against_the_head_behind_it() -> None:
    """A request ending in the same read as a large body began: the head behind it is counted
    from the next read on, never with the body's bytes."""
    async def main() -> bytes:
        _, t = _protocol(max_head=1000)
        body = b"b" * 100_000
        t.receive(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                        + b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 900)
        await _settle()
        t.receive(b"\r\n\r\n")
        await _settle()
        return bytes(t.data)

    answers = asyncio.run(main())
    assert answers.count(b"HTTP/1.1 200 ") == 2 and b"100000" in answers, answers


def test_an_unfinished_head_of_many_fields_is_refused_by_count() -> None:
    async def main() -> FakeTransport:
        _, t = _protocol(max_head=1_000_000, max_headers=10)
        t.receive(b"GET /x HTTP/1.1\r\nHost: x\r\n")
        for i in range(20):
            t.receive(b"X-%d: v\r\n" % i)
        await _settle()
        return t

    t = asyncio.run(main())
    assert t.data.startswith(b"HTTP/1.1 431 ") and b"header fields" in t.data and t.eof


def test_after_a_431_nothing_more_is_parsed() -> None:
    """What follows a refused head is discarded by the transport's new protocol (uvloop calls the
    data_received it was handed at the start, so a swapped method would still parse)."""
    async def main() -> tuple[bytes, bytes, FakeTransport]:
        p, t = _protocol(max_head=1000)
        t.receive(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Endless: " + b"a" * 2000)
        await _settle()
        answer = bytes(t.data)
        for _ in range(20):
            t.receive(b"a" * 65536 + b"\r\n\r\nGET /x HTTP/1.1\r\n\r\n")
        await _settle()
        assert p.url == b"" and p.headers == []  # what was parsed of the head is let go
        return answer, bytes(t.data), t

    answer, after, t = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 431 ") and t.eof
    assert after == answer  # no 400, no answer to what followed: nothing was parsed


def test_a_refused_connection_discards_what_it_is_sent() -> None:
    async def main() -> FakeTransport:
        _, t = _protocol(cap=0)  # refused at connection_made
        t.receive(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3)  # raised here before
        await _settle()
        return t

    t = asyncio.run(main())
    assert t.data.startswith(b"HTTP/1.1 503 ") and t.data.count(b"HTTP/1.1") == 1 and t.eof


def test_the_write_timeout_counts_only_time_without_progress() -> None:
    async def main() -> None:
        p, t = _protocol()
        now = asyncio.get_running_loop().time()
        t.unsent = 200_000
        p.pause_writing()  # over the high-water mark
        assert p in server._stalled
        t.unsent = 150_000  # the client took some meanwhile: it may go on
        p._write_due_passed(now)
        assert p in server._stalled and not t.aborted
        p._write_due_passed(now)  # nothing more taken in a whole timeout
        assert t.aborted and p not in server._stalled

        p, t = _protocol()
        t.unsent = 200_000
        p.pause_writing()
        p.resume_writing()  # drained below the low-water mark
        assert p not in server._stalled

        p, t = _protocol()
        t.unsent = 10_000  # under the high-water mark, but a close waits for it
        p.timeout_keep_alive_handler()
        assert t.closed and p in server._stalled
        p._write_due_passed(now)
        assert t.aborted

        p, t = _protocol()
        p.timeout_keep_alive_handler()  # nothing unsent: a close completes on its own
        assert t.closed and p not in server._stalled

    asyncio.run(main())
