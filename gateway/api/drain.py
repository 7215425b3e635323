"""A node's stop as its clients see it: no 500, no request left without an answer.

On SIGTERM (or SIGINT) the drain begins here, once per process, as uvicorn stops accepting
connections: from the signal itself (:meth:`Drain.follow_signals` chains uvicorn's handler; a
request whose client already hung up has no connection that uvicorn would tell), and from each
open connection being told to finish (``GatewayHttpProtocol.shutdown``):

1. the hooks run: waiting long polls are answered at once with their empty answer (the
   consume service's wait room), instead of being cut with no answer after uvicorn's grace;
2. requests still running after ``grace_s`` (a produce waiting for a broker that does not
   answer) are cancelled by the drain and answered ``503 shutting_down`` (``Retry-After: 1``;
   another node takes the retry) by :class:`~gateway.api.access.Front`, which knows the cancel
   is the drain's and not the client's.

uvicorn's own graceful timeout is set one second longer (``mqgw serve``), so it never cancels a
request itself: its cancel became a 500 with a traceback (552 answers and 82 ERROR tracebacks in
60 stops under load before). A cancelled request task holds no lock the store does not expire.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("mqgw.shutdown")

#: The cancel message of a request the drain cut.
CUT = "mqgw: the node is stopping"


class Drain:
    """The process's drain: requests in flight, what to do when the stop begins, the grace."""

    def __init__(self) -> None:
        self.grace_s = 4.0
        self.started = False
        #: The tasks of the HTTP requests in flight (Front adds and removes them).
        self.running: set[asyncio.Task[object]] = set()
        self._cut: set[asyncio.Task[object]] = set()
        self._hooks: list[Callable[[], None]] = []
        #: (signal, the handler before ours, ours): put back by :meth:`clear`.
        self._chained: list[tuple[int, Any, Any]] = []

    def follow_signals(self) -> None:
        """Begin the drain when SIGTERM or SIGINT arrives, before the handler already installed
        (uvicorn's, which it restores when it stops serving: the chain goes with it). Only the
        main thread can set signal handlers; elsewhere (tests' in-process servers) nothing."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            prev = signal.getsignal(sig)
            if not callable(prev):
                continue

            def handler(signum: int, frame: FrameType | None,
                        prev: Callable[[int, FrameType | None], Any] = prev) -> None:
                try:
                    loop.call_soon_threadsafe(self.begin)
                except RuntimeError:  # the loop is closed: nothing left to drain
                    pass
                prev(signum, frame)
            signal.signal(sig, handler)
            self._chained.append((sig, prev, handler))

    def on_begin(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def clear(self) -> None:
        """Forget the hooks (the services they reach are closed) and put back the signal
        handlers found (an app served again in the same process, as tests do, starts anew)."""
        self._hooks.clear()
        for sig, prev, ours in reversed(self._chained):
            if threading.current_thread() is threading.main_thread() and signal.getsignal(sig) is ours:
                signal.signal(sig, prev)
        self._chained.clear()
        self.started = False

    def begin(self) -> None:
        """The stop began: run the hooks, and cut what still runs after the grace."""
        if self.started:
            return
        self.started = True
        log.info("stopping: %d request(s) in flight; waiting long polls answered now, the rest "
                 "given %.1f s", len(self.running), self.grace_s)
        for hook in self._hooks:
            try:
                hook()
            except Exception:
                log.exception("a stop hook failed")
        asyncio.get_running_loop().call_later(self.grace_s, self._cut_running)

    def _cut_running(self) -> None:
        for task in list(self.running):
            if not task.done():
                self._cut.add(task)
                task.cancel(CUT)

    def was_cut(self, task: asyncio.Task[object]) -> bool:
        """Whether ``task``'s cancel is the drain's (then it is forgotten: asked once)."""
        if task in self._cut:
            self._cut.discard(task)
            return True
        return False


#: One per process (a uvicorn worker serves one app).
DRAIN = Drain()
