"""A response's head and body leave in one write (gateway/api/server.py, ``_Corked``).

uvicorn writes them with a ``transport.write`` each, a system call each; joined, a no-op request
served 15-25 % more per second (BENCHMARKS.md, issue 11). These check the joining and that
nothing is lost or reordered: what is written before a close goes out before it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.api.server import _Corked


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


def test_writes_of_one_turn_leave_together_in_order() -> None:
    async def main() -> None:
        t = FakeTransport()
        c = _Corked(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        c.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        c.write(b"ok")
        assert t.writes == []  # not yet: the turn is not over
        await asyncio.sleep(0)
        assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
        c.write(b"next")
        await asyncio.sleep(0)
        assert t.writes[-1] == b"next" and len(t.writes) == 2
        assert c.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's
    asyncio.run(main())


def test_close_sends_what_is_pending_first() -> None:
    async def main() -> None:
        t = FakeTransport()
        c = _Corked(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        c.write(b"head")
        c.write(b"body")
        c.close()
        assert t.writes == [b"headbody"] and t.closed and c.is_closing()
        await asyncio.sleep(0)  # the scheduled flush finds nothing left
        assert t.writes == [b"headbody"]
    asyncio.run(main())


def test_nothing_is_written_to_a_closed_connection() -> None:
    async def main() -> None:
        t = FakeTransport()
        c = _Corked(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        c.write(b"late")
        t.closed = True  # the client went away meanwhile
        await asyncio.sleep(0)
        assert t.writes == []
    asyncio.run(main())
