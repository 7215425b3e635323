"""A TCP proxy on loopback that holds back every answer by a settable delay: a broker that is slow
but alive (issue 32). SIGSTOP makes a broker answer nothing, and each client call then fails at
its own timeout; production also sees the other fault, a broker (or network) so slow that every
call succeeds just inside its timeout and only their sum is too long.

Bytes from the client go on at once; bytes from the server are passed on ``delay_s`` after they
came (the delay in force when they came), in order. Threads, not asyncio: it runs beside a
test's synchronous code, and a handful of connections is all it carries.
"""

from __future__ import annotations

import queue
import socket
import threading
import time

from gateway.cli.devstack import free_port


class SlowProxy:
    def __init__(self, target_port: int, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.port = port or free_port()
        self.delay_s = 0.0
        self._listener = socket.create_server((host, self.port))
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="slow-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            held: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
            for target, args in ((self._pump, (client, server)), (self._hold, (server, held)),
                                 (self._release, (held, client))):
                threading.Thread(target=target, args=args, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Client to server: at once."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        self._close(src, dst)

    def _hold(self, src: socket.socket, held: queue.Queue[tuple[float, bytes] | None]) -> None:
        """Server to client: each chunk stamped with when it may go."""
        try:
            while data := src.recv(65536):
                held.put((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        held.put(None)

    def _release(self, held: queue.Queue[tuple[float, bytes] | None], dst: socket.socket) -> None:
        while (item := held.get()) is not None:
            at, data = item
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                dst.sendall(data)
            except OSError:
                break
        self._close(dst)

    def _close(self, *socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        self._close(*conns)
