"""A round-robin HTTP load balancer for tests: each request goes to the next upstream, as a
stateless load balancer in front of several nodes sends it (no stickiness), with the client's
``Host`` header kept (so URLs a node builds from it, such as a REST v2 ``base_uri``, point at the
balancer). A request whose upstream refuses the connection goes to the next one (nothing was
sent: nginx's ``proxy_next_upstream error``), and that upstream is skipped for a second.

Run as ``python -m tests.support.balancer PORT URL [URL ...]`` (loopback only); it prints
``ready`` once it listens. ``GET /_balancer`` answers which upstream served each request so far.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

import httpx
import uvicorn

_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade",
        b"proxy-connection", b"te", b"trailer"}
DOWN_S = 1.0


class Balancer:
    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = upstreams
        self.n = 0
        self.down: dict[str, float] = {}
        self.served: list[str] = []
        self.http = httpx.AsyncClient(timeout=120)

    def _order(self) -> list[str]:
        self.n += 1
        k = self.n % len(self.upstreams)
        order = self.upstreams[k:] + self.upstreams[:k]
        now = time.monotonic()
        up = [u for u in order if self.down.get(u, 0) <= now]
        return up + [u for u in order if u not in up]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await self.http.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        if scope["path"] == "/_balancer":
            await _answer(send, 200, [(b"content-type", b"text/plain")],
                          "\n".join(self.served).encode())
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        path = scope["raw_path"].decode() + (("?" + scope["query_string"].decode())
                                             if scope["query_string"] else "")
        for up in self._order():
            try:
                r = await self.http.request(scope["method"], up + path, headers=headers,
                                            content=b"".join(chunks))
            except httpx.ConnectError:
                self.down[up] = time.monotonic() + DOWN_S
                continue
            except httpx.HTTPError as e:  # the node died with the request in flight
                self.down[up] = time.monotonic() + DOWN_S
                await _answer(send, 502, [(b"content-type", b"text/plain")], str(e).encode())
                return
            self.served.append(up)
            out = [(k.encode(), v.encode()) for k, v in r.headers.items()
                   if k.lower().encode() not in _HOP]
            await _answer(send, r.status_code, out, r.content)
            return
        await _answer(send, 502, [(b"content-type", b"text/plain")], b"no upstream answered")


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    port, upstreams = int(sys.argv[1]), sys.argv[2:]
    server = uvicorn.Server(uvicorn.Config(Balancer(upstreams), log_level="warning", lifespan="on"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)  # connections wait in the backlog until the server accepts them
    print("ready", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
