"""Requests that offer an HTTP/2 upgrade (``Upgrade: h2c``) are served whole as HTTP/1.1.

Java's default ``HttpClient`` (HTTP_2 preferred) and ``curl --http2`` offer the upgrade on plain
``http://``. httptools tells llhttp that an upgrade request has no body, so uvicorn used to hand
the application an empty body (``400 missing_topic`` on a produce) and drop the body's bytes.
The gateway declines the offer (RFC 9110 §7.8: a server may ignore ``Upgrade``) and serves the
request as it came. The requests here are the clients' own bytes, captured on a loopback
listener (JDK 17.0.15, curl 7.88.1), sent over a raw socket to a real gateway node.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from ..support import Api, Node, unique

#: ``HttpClient.newHttpClient().send(POST ofString(body))`` of JDK 17.0.15; {host} and {length}
#: are filled in. The HTTP2-Settings value is the client's own SETTINGS frame (base64url).
JAVA_HEAD = (
    "POST /produce HTTP/1.1\r\n"
    "Connection: Upgrade, HTTP2-Settings\r\n"
    "Content-Length: {length}\r\n"
    "Host: {host}\r\n"
    "HTTP2-Settings: AAEAAEAAAAIAAAAAAAMAAAAAAAQBAAAAAAUAAEAAAAYABgAA\r\n"
    "Upgrade: h2c\r\n"
    "User-Agent: Java-http-client/17.0.15\r\n"
    "content-type: application/json\r\n"
    "\r\n")

#: ``curl --http2 -XPOST $GW/produce -H 'content-type: application/json' -d '…'`` (7.88.1).
CURL_HEAD = (
    "POST /produce HTTP/1.1\r\n"
    "Host: {host}\r\n"
    "User-Agent: curl/7.88.1\r\n"
    "Accept: */*\r\n"
    "Connection: Upgrade, HTTP2-Settings\r\n"
    "Upgrade: h2c\r\n"
    "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    "content-type: application/json\r\n"
    "Content-Length: {length}\r\n"
    "\r\n")


def _host(node: Node) -> str:
    return node.url.removeprefix("http://")


def _connect(node: Node) -> socket.socket:
    host, port = _host(node).split(":")
    s = socket.create_connection((host, int(port)), timeout=15)
    s.settimeout(15)
    return s


def _read_response(s: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (content-length framed, as the gateway answers) from ``s``;
    what follows it stays in ``buf`` for the next one."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before a response head: {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed inside a response body"
        rest += chunk
    buf[:] = rest[length:]
    return status, headers, rest[:length]


def _produce_body(topic: str, value: str) -> bytes:
    return json.dumps({"topic": topic, "key": "k", "value": value}).encode()


def _assert_produced(api: Api, topic: str, status: int, body: bytes, values: list[str]) -> None:
    """The produce answered 200, and a fetch from the start of the topic returns ``values``."""
    assert status == 200, body
    answer: dict[str, Any] = json.loads(body)
    assert answer["failed"] == 0, answer
    group = unique("h2c")
    api.config(group, start="earliest")
    r = api.message(consumer=group, topic=topic, max=100, wait_ms=5000)
    assert r.status_code == 200, r.text
    assert [m["value"] for m in r.json()["messages"]] == values


@pytest.fixture
def topic(make_topic: Callable[..., str]) -> str:
    return make_topic(1, "h2c")


@pytest.mark.parametrize("head", [JAVA_HEAD, CURL_HEAD], ids=["java-httpclient", "curl-http2"])
def test_upgrade_offer_with_body_is_served_whole(node: Node, api: Api, topic: str, head: str) -> None:
    body = _produce_body(topic, "over-h2c-offer")
    with _connect(node) as s:
        s.sendall(head.format(host=_host(node), length=len(body)).encode() + body)
        status, headers, answer = _read_response(s, bytearray())
    assert "upgrade" not in headers  # declined: no 101, the answer is HTTP/1.1
    _assert_produced(api, topic, status, answer, ["over-h2c-offer"])


def test_body_in_a_later_read_and_keep_alive(node: Node, api: Api, topic: str) -> None:
    """Java writes the head and the body separately: the body may come in a read of its own.
    The connection then goes on serving plain requests, pipelined ones included."""
    first, second = _produce_body(topic, "first"), _produce_body(topic, "second")
    with _connect(node) as s:
        s.sendall(JAVA_HEAD.format(host=_host(node), length=len(first)).encode())
        s.sendall(first)  # on loopback the two writes usually arrive as two reads
        buf = bytearray()
        status, _, answer = _read_response(s, buf)
        assert status == 200, answer
        plain = (f"POST /produce HTTP/1.1\r\nHost: {_host(node)}\r\n"
                 f"content-type: application/json\r\nContent-Length: {len(second)}\r\n\r\n")
        health = f"GET /healthz HTTP/1.1\r\nHost: {_host(node)}\r\n\r\n"
        s.sendall(plain.encode() + second + health.encode())
        status2, _, answer2 = _read_response(s, buf)
        status3, _, _ = _read_response(s, buf)
    assert status3 == 200
    _assert_produced(api, topic, status2, answer2, ["first", "second"])


def test_chunked_body_and_get_with_upgrade_offer(node: Node, api: Api, topic: str) -> None:
    """A chunked body behind an upgrade offer, then a bodiless GET offering one (as Java's
    client sends a GET), on one connection."""
    body = _produce_body(topic, "chunked")
    half = len(body) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:])) + b"0\r\n\r\n"
    offer = ("Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
             "HTTP2-Settings: AAEAAEAAAAIAAAAAAAMAAAAAAAQBAAAAAAUAAEAAAAYABgAA\r\n")
    with _connect(node) as s:
        s.sendall(f"POST /produce HTTP/1.1\r\nHost: {_host(node)}\r\n{offer}"
                  "content-type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + chunks)
        buf = bytearray()
        status, _, answer = _read_response(s, buf)
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {_host(node)}\r\n{offer}\r\n".encode())
        status2, _, _ = _read_response(s, buf)
    assert status2 == 200
    _assert_produced(api, topic, status, answer, ["chunked"])
