"""A request that arrives in time is answered even when the node's event loop is late reading it.

The node's connection timers (gateway/api/server.py) run on uvloop, which runs due timers at the
start of a turn, before it polls the sockets. A request that arrived during a long turn was
still unread when its connection's idle timer fired; the close found it in the receive buffer
and the kernel reset the connection: the client got ``ReadError`` for a request sent well in
time (tests/system/test_checkpoint.py's herd test: 2 CI runs on RocketMQ, and 1 local run in 4
on a loaded machine, 2026-11-28).

This runs the gateway's protocol in this process, on uvloop and real loopback sockets (no
node: the long turn must be made at a known moment, which a process can't be asked to do): a
second server on the same loop blocks the loop inside a read callback until the client's request
has been sent and the timer is past due, which is the turn in which the request used to be lost.
Nothing is asserted on durations: the blocking turn waits for events, then outlasts the timer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.api import server

TIMER_S = 0.3  # the connection's idle and first-request time, made short


async def _ok(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class _Blocker(asyncio.Protocol):
    """On any read, holds the loop (inside uvloop's poll phase) until ``release`` is set and
    the connection timers are past due."""

    def __init__(self, started: threading.Event, release: threading.Event) -> None:
        self._started, self._release = started, release

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        began = time.monotonic()
        self._started.set()
        assert self._release.wait(30), "the client never sent its request"
        time.sleep(max(0.0, began + 3 * TIMER_S - time.monotonic()))  # the timer is past due
        self._transport.close()


@pytest.fixture
def loop_and_ports(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, int, int, ServerState,
                                                                      threading.Event,
                                                                      threading.Event]]:
    monkeypatch.setattr(server, "limits", lambda: server.Limits(TIMER_S, 5.0, 1000, 32768, 100, 5.0))
    config = Config(app=_ok, loop="uvloop", http=server.GatewayHttpProtocol, lifespan="off",
                    timeout_keep_alive=TIMER_S, log_level="warning")
    config.load()
    state = ServerState()
    started, release = threading.Event(), threading.Event()
    loop = uvloop.new_event_loop()

    async def listen() -> tuple[int, int]:
        gw = await loop.create_server(lambda: server.GatewayHttpProtocol(
            config=config, server_state=state, app_state={}), "127.0.0.1", 0)
        blk = await loop.create_server(lambda: _Blocker(started, release), "127.0.0.1", 0)
        return gw.sockets[0].getsockname()[1], blk.sockets[0].getsockname()[1]

    gw_port, blk_port = loop.run_until_complete(listen())
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        yield loop, gw_port, blk_port, state, started, release
    finally:
        release.set()

        def stop() -> None:
            if server._sweeper is not None:
                server._sweeper.cancel()
            loop.stop()
        loop.call_soon_threadsafe(stop)
        runner.join(10)
        server._sweeper = None
        loop.close()


def _request(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock.recv(4096)


def _late_turn_then_request(gw: socket.socket, blk_port: int, started: threading.Event,
                            release: threading.Event) -> bytes:
    """Block the loop in a read callback, send the request meanwhile, return the answer."""
    with socket.create_connection(("127.0.0.1", blk_port), timeout=30) as blk:
        blk.sendall(b"x")
        assert started.wait(30)
        gw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        release.set()
        return gw.recv(4096)


def _wait_accepted(state: ServerState, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(state.connections) < count:
        assert time.monotonic() < deadline, "the server never accepted the connection"
        time.sleep(0.01)


def test_a_first_request_read_late_is_answered(loop_and_ports: Any) -> None:
    _loop, gw_port, blk_port, state, started, release = loop_and_ports
    with socket.create_connection(("127.0.0.1", gw_port), timeout=30) as gw:
        _wait_accepted(state, 1)  # its first-request timer runs from here
        answer = _late_turn_then_request(gw, blk_port, started, release)
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_next_request_read_late_is_answered(loop_and_ports: Any) -> None:
    _loop, gw_port, blk_port, _state, started, release = loop_and_ports
    with socket.create_connection(("127.0.0.1", gw_port), timeout=30) as gw:
        assert _request(gw).startswith(b"HTTP/1.1 200")  # its idle timer runs from here
        answer = _late_turn_then_request(gw, blk_port, started, release)
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_silent_connection_is_still_closed(loop_and_ports: Any) -> None:
    """What the timer is for stays: nothing sent, the connection ends."""
    _loop, gw_port, _blk_port, _state, _started, _release = loop_and_ports
    with socket.create_connection(("127.0.0.1", gw_port), timeout=30) as gw:
        assert gw.recv(4096) == b""


def test_the_rest_of_a_head_read_late_is_answered(loop_and_ports: Any) -> None:
    """The head deadline (checked by the per-process sweeper) waits for bytes already received."""
    _loop, gw_port, blk_port, _state, started, release = loop_and_ports
    with socket.create_connection(("127.0.0.1", gw_port), timeout=30) as gw:
        gw.sendall(b"GET /healthz HTTP/1.1\r\n")  # its head deadline runs from here
        with socket.create_connection(("127.0.0.1", blk_port), timeout=30) as blk:
            blk.sendall(b"x")
            assert started.wait(30)
            gw.sendall(b"Host: x\r\n\r\n")
            release.set()
            answer = gw.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer
