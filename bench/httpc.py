"""A minimal HTTP/1.1 keep-alive client for load generation: asyncio Protocol + httptools.

httpx costs ~100-200 us of Python per request, which on a 2-core machine would make
the load generator the bottleneck. Here a request is one pre-built ``bytes`` written
to the socket and the response is parsed by httptools (C, llhttp), so a request costs
a few microseconds of client CPU. One connection carries one request at a time (no
pipelining), like a normal keep-alive client.
"""

from __future__ import annotations

import asyncio

import httptools


class HttpError(Exception):
    pass


class Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future | None = None
        self._body: list[bytes] = []
        self._closed: asyncio.Future | None = None
        #: The server (or the network) closed the connection.
        self.lost = False

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(HttpError(f"bad response: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(HttpError(f"connection lost: {exc}"))

    def _fail(self, exc: Exception) -> None:
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)

    # -- httptools callbacks ------------------------------------------------------------
    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        w, self._waiter = self._waiter, None
        body = b"".join(self._body)
        self._body = []
        if w is not None and not w.done():
            w.set_result((self._parser.get_status_code(), body))

    # -- API ------------------------------------------------------------------------------
    def request(self, raw: bytes) -> asyncio.Future:
        """Send one complete request; the future resolves to (status, body bytes)."""
        assert self._waiter is None, "one request at a time per connection"
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def connect(host: str, port: int) -> Connection:
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(Connection, host, port)
    return proto


#: Header lines added to every request built here (``Authorization: ...\r\n`` for --secure runs).
EXTRA_HEADERS = ""


def get(path: str, host: str = "127.0.0.1", accept: str = "") -> bytes:
    more = f"Accept: {accept}\r\n" if accept else ""
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{more}{EXTRA_HEADERS}\r\n".encode()


def post(path: str, body: bytes, host: str = "127.0.0.1", method: str = "POST",
         content_type: str = "application/json") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{EXTRA_HEADERS}\r\n").encode()
    return head + body
