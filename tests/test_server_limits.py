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

import httpx

from gateway.api.server import MAX_PIPELINED

from .helpers import TLS, Node

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
