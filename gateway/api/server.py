"""The HTTP server's connection rules: uvicorn's httptools protocol with the limits a public
long-poll server needs, which uvicorn itself does not have.

uvicorn (0.54) arms its keep-alive timer only after a response and cancels it at the first
byte of the next request, so a connection that sends nothing, or an unfinished request head and
then a byte every few seconds, is never timed out. 3 x 14,500 such connections filled both
workers' file limits and took a node offline for about 65 s. Its ``limit_concurrency`` answers
503 only once a whole request head has arrived, so it does not bound those connections either.

:class:`GatewayHttpProtocol` adds, per connection:

- **idle**: a new connection must start its first request within ``header_timeout_ms``, and a
  connection with no request in progress between requests is closed after
  ``keep_alive_timeout_ms`` (75 s: above the idle expiry of common clients and balancers, see
  config.py). A deadline that passes while the client's bytes already wait unread (the event
  loop was busy) is looked at again after they are read: closing then would reset the
  connection under a request sent in time;
- **head**: a request head must arrive whole within ``header_timeout_ms`` of its first byte;
- **body**: a request body must arrive whole within ``body_timeout_ms`` of its head;
- **cap**: beyond ``max_connections_per_worker`` open connections a new one gets a ``503`` with
  ``Connection: close`` at once, so the process keeps descriptors for the ones it serves;
- **early answers close**: a response sent before its request's body was read whole (an early
  ``413``) says ``Connection: close`` and closes, since the unread rest of the body would
  otherwise be parsed as the next request (a pipelined request after it got no answer);
- **head size**: a request head larger than ``max_head_bytes`` (32 KiB), or with more than
  ``max_headers`` fields (100), is answered ``431`` and the connection closed; an unfinished head
  as soon as a read takes it past the limit. Nothing bounded heads before: httptools joins the
  pieces of a header by copying (quadratic in its length) and uvicorn the URL's, so 10
  connections streaming an endless header took a node from 478 to 999 MB and stalled it for
  seconds. The bytes are counted per read (two integers per read; see ``data_received``), the
  fields once per head; a head is measured exactly only when its reads could hold too much;
- **writes**: a connection whose client takes none of its unsent answers for
  ``write_timeout_ms`` is aborted, while more than the transport's high-water mark (64 KiB)
  waits or while a close waits to send the last bytes (such a close otherwise waits forever,
  and with it the descriptor and the buffer). Any progress restarts the time, as nginx's
  ``send_timeout`` does, so a large answer to a slow reader is not cut. Before, 500 clients
  that never read held 77 MB and their connections for as long as they liked;
- **pipelining**: at most ``MAX_PIPELINED`` requests wait behind the one being answered.
  uvicorn parses every request of a read ahead, each a request object in memory, and a 256 KiB
  read holds thousands of small ones; past the limit the connection ends after the answers to
  the requests already queued (a pipelining client retries the rest, RFC 9112 §9.3.2);
- **upgrade offers declined**: a request offering a protocol upgrade uvicorn does not perform
  (``Upgrade: h2c``, as Java's default ``HttpClient`` and ``curl --http2`` send on ``http://``)
  is served whole as HTTP/1.1. httptools tells llhttp that an upgrade request has no body, so
  uvicorn handed the application an empty body and dropped the body's bytes (a produce got
  ``400``). RFC 9110 §7.8 lets a server ignore ``Upgrade``: the request is parsed again without
  its upgrade offer, body included.

A timed-out head gets ``408`` and a close; a timed-out body only a close (the application may be
answering it). A refused head behind a request still being answered (pipelined) gets no ``431``
in the middle of that answer: the connection ends after it. Long polls are not affected: once a
request has arrived whole, it may take as long as the application takes (the write timeout only
counts while unsent data waits on the client).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import struct
import termios
import time
from functools import cache
from typing import Any, NamedTuple

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import Settings
from ..ops import metrics
from .drain import DRAIN
from .errors import REQUEST_TIMEOUT, TOO_MANY_CONNECTIONS, head_too_large

log = logging.getLogger("mqgw.server")

#: Descriptors kept for what is not a client connection (Redis pool, Kafka clients, logs, the
#: listening socket, the multiprocess metrics files) when the cap is derived from the file limit.
FD_RESERVE = 512
#: How long a refused connection stays open (reading and discarding) after its 503.
LINGER_S = 1.0
#: How often a process looks for heads and bodies past their deadline. A deadline is a float on
#: the connection, set and cleared per request phase; one sweeper per process replaces a timer
#: armed and cancelled twice per request (loop.call_later and TimerHandle.cancel were ~4 % of a
#: no-op request's worker samples, bench/run.py --profile, 2026-11-24). Timeouts fire up to this
#: much late.
SWEEP_S = 0.1
#: Requests a connection may have waiting behind the one being answered (see the module docstring).
MAX_PIPELINED = 32

#: Connections with a head or body deadline, per process (one event loop per worker).
_armed: set[GatewayHttpProtocol] = set()
#: Connections with unsent response data past the high-water mark, or closing with some unsent.
_stalled: set[GatewayHttpProtocol] = set()
_sweeper: asyncio.Task[None] | None = None


async def _sweep() -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(SWEEP_S)
        now = loop.time()
        for p in [p for p in _armed if p._due <= now and not p._unread_waiting()]:
            on_due = p._on_due
            p._disarm()
            if on_due is not None:
                on_due()
        if _stalled:
            for p in [p for p in _stalled if p._write_due <= now]:
                p._write_due_passed(now)


class _Refused(Exception):
    """Raised from a parser callback to stop the parse: the connection was answered and ends.
    httptools re-raises it as the ``__context__`` of an ``HttpParserCallbackError``."""


class Limits(NamedTuple):
    header_s: float
    body_s: float
    cap: int  # open connections per process
    head_bytes: int
    headers: int
    write_s: float


@cache
def limits() -> Limits:
    """This process's connection limits, from the settings."""
    s = Settings.load()
    cap = s.max_connections_per_worker
    if cap <= 0:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = max(64, soft - FD_RESERVE) if soft != resource.RLIM_INFINITY else 100_000
    return Limits(s.header_timeout_ms / 1000, s.body_timeout_ms / 1000, cap, s.max_head_bytes,
                  s.max_headers, s.write_timeout_ms / 1000)


class _Corked:
    """The connection's transport as a response sees it: what it writes in one turn of the event
    loop goes out in one system call. uvicorn writes a response's head and its body with a call
    each; on a no-op request the two ``send`` calls were a third of the worker's CPU (py-spy,
    2026-11-25). Closing writes what is pending first, then calls ``on_close``."""

    __slots__ = ("_loop", "_on_close", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 on_close: Any = None) -> None:
        self._transport = transport
        self._loop = loop
        self._on_close = on_close
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()
        if self._on_close is not None:
            self._on_close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head/body timeouts, an idle timeout from the first
    moment, bounded heads, a write timeout, bounded pipelining and a per-process connection cap
    (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lim = limits()
        self._header_s, self._body_s, self._cap = lim.header_s, lim.body_s, lim.cap
        self._max_head, self._max_headers, self._write_s = lim.head_bytes, lim.headers, lim.write_s
        # Head accounting, in positions of the bytes received on this connection (see
        # data_received): the current read's first and past-the-last byte, where counting the
        # head being received started (-1: no head in progress), and the read (its _start) in
        # which the last request ended.
        self._start = self._end = 0
        self._head_from = -1
        self._done_at = -1
        # While in _stalled: the unsent bytes when last looked at, and when to look again.
        self._write_left = 0
        self._write_due = 0.0
        self._due = 0.0  # loop time the current head or body must have arrived by (if armed)
        self._on_due: Any = None
        self._declined: bytes | None = None  # the head to parse again, its upgrade offer removed

    # -- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        global _sweeper
        if _sweeper is None or _sweeper.done():
            _sweeper = self.loop.create_task(_sweep())
        if len(self.connections) >= self._cap:
            _refused_one(self._cap)
            # Answer, then close after a moment rather than at once: closing with the client's
            # request unread makes the kernel reset the connection, and a reset can destroy the
            # answer before the client reads it. What arrives meanwhile is discarded.
            self.transport = transport
            self.parser = None  # type: ignore[assignment]  # nothing more is parsed
            transport.set_protocol(_Discarding(self))
            transport.write(TOO_MANY_CONNECTIONS)
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
            return
        super().connection_made(transport)
        self._corked = _Corked(transport, self.loop, self._closing)
        # uvicorn arms the idle timer only after a response: a silent new connection would stay
        # open. It gets the head's time to start its first request, not the long idle time
        # between requests (nginx's client_header_timeout does the same).
        self.timeout_keep_alive_task = self.loop.call_later(
            min(self.timeout_keep_alive, self._header_s), self.timeout_keep_alive_handler)

    def shutdown(self) -> None:
        """A graceful stop: a response completed this very turn still goes out before the close;
        the process's drain begins (api/drain.py: waiting long polls answered at once)."""
        DRAIN.begin()
        corked = getattr(self, "_corked", None)
        if corked is not None:
            corked.flush()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        _stalled.discard(self)
        if self.parser is None and self not in self.connections:
            return  # refused at connection_made: uvicorn never saw it
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but a declined upgrade offer is parsed again without the offer, followed by
        the bytes after the head (its body and any pipelined requests). A copy rather than a
        wrapper: uvicorn catches the parser's upgrade signal inside its own, and a wrapper would
        cost every read a Python call.

        Heads are measured by position, not per header: ``_start``/``_end`` place this read
        among the connection's bytes, a head records where it began (``on_message_begin``), and
        a head still unfinished after a read holds every byte since then. The one place not
        known is where a head begins behind another request ended in the same read: its
        counting starts with the next read (at most one read uncounted, never a byte too many).
        """
        self._unset_keepalive_if_required()
        start = self._start = self._end
        self._end = start + len(data)
        while True:
            try:
                self.parser.feed_data(data)
                break
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _Refused):
                    return  # a limit stopped the parse; the connection is answered and ends
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
            except httptools.HttpParserUpgrade as exc:
                head, self._declined = self._declined, None
                if head is None:  # a websocket, or CONNECT: as uvicorn does
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                    else:
                        self._unsupported_upgrade_warning()
                    return
                # Ends: the head parsed again has no Upgrade header, so it is no upgrade.
                data = head + data[exc.args[0]:]
        if self._head_from >= 0:  # a head unfinished at the end of this read (rare)
            problem = self._head_problem(self._end - self._head_from)
            if problem is not None:
                self._refuse_head(problem)

    # -- request phases -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self._header_s, self._head_timed_out)
        start = self._start
        # From this read's first byte; but behind a request that ended in this read the head's
        # place in it is unknown, and counting starts with the next read.
        self._head_from = start if self._done_at != start else self._end

    def on_headers_complete(self) -> None:
        # The head lies within [_head_from, _end): only when that could hold too much (or too many
        # fields arrived) is it measured exactly.
        if self._end - self._head_from > self._max_head or len(self.headers) > self._max_headers:
            problem = self._head_problem(_head_size(self.parser.get_method(), self.url, self.headers))
            if problem is not None:
                self._refuse_head(problem)
                raise _Refused
        self._head_from = -1
        parser = self.parser
        if parser.should_upgrade() and parser.get_method() != b"CONNECT" \
                and not self._should_upgrade():
            # An upgrade offer (h2c, or a websocket without a websocket library): llhttp now
            # skips the body and stops at the head's end; data_received parses it again.
            self._declined = _plain_head(parser.get_method(), self.url, parser.get_http_version(),
                                         self.headers)
            return
        super().on_headers_complete()
        if len(self.pipeline) > MAX_PIPELINED:
            self._pipeline_full()
        cycle = self.cycle
        if cycle is not None:
            cycle.transport = self._corked  # type: ignore[assignment]
        if cycle is not None and cycle.more_body and _has_body(self.headers):
            self._arm(self._body_s, self._body_timed_out)
            send = cycle.send

            early = [False]

            async def send_closing_if_early(message: Any) -> None:
                # An answer before the body was read whole: the rest of the body must not be
                # taken for the next request, so this connection ends with this response.
                if message["type"] == "http.response.start" and cycle.more_body:
                    cycle.keep_alive = False  # uvicorn then says `Connection: close`
                    early[0] = True
                if early[0] and message["type"] == "http.response.body" \
                        and not message.get("more_body", False):
                    # ... and closes, but only after a lingering moment (uvicorn would close at
                    # once: with the body's rest unread the kernel resets the connection, and
                    # the reset destroyed the 413 before the client read it, now and then).
                    cycle.keep_alive = True
                    cycle.on_response = lambda: None
                    await send(message)
                    self._close_lingering()
                    return
                await send(message)

            cycle.send = send_closing_if_early  # type: ignore[method-assign]
        else:
            self._disarm()

    def on_message_complete(self) -> None:
        self._disarm()
        if self._declined is None:  # else: the declined parse's end; no request was started
            self._done_at = self._start
            super().on_message_complete()

    # -- limits ---------------------------------------------------------------------------------
    def _head_problem(self, size: int) -> str | None:
        """Why a head of ``size`` bytes (so far) with the fields parsed so far is refused."""
        if size > self._max_head:
            return f"the request head is larger than {self._max_head} bytes"
        if len(self.headers) > self._max_headers:
            return f"the request has more than {self._max_headers} header fields"
        return None

    def _refuse_head(self, problem: str) -> None:
        """``431`` and a close; behind a request still being answered, a close after its answer."""
        metrics.connection_dropped("head_too_large")
        log.debug("%s: 431 and connection closed", problem)
        self.headers.clear()  # what was parsed of it; nothing else refers to this head's fields
        self.url = b""
        self._head_from = -1
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._end_after(cycle)
            return
        self._corked.write(head_too_large(problem))
        self._close_lingering()

    def _pipeline_full(self) -> None:
        """More than MAX_PIPELINED requests wait: this one is dropped unanswered, and the
        connection ends after the answer to the last one queued."""
        metrics.connection_dropped("pipeline_full")
        log.debug("more than %d pipelined requests: connection closed after those", MAX_PIPELINED)
        self.pipeline.popleft()  # this request's, never started
        self.cycle = last = self.pipeline[0][0]
        self._end_after(last)
        raise _Refused

    def _end_after(self, cycle: Any) -> None:
        """Parse no more: the connection ends (lingering) once ``cycle`` is answered."""
        self.transport.set_protocol(_Discarding(self))
        self._disarm()
        cycle.on_response = self._close_lingering

    def _close_lingering(self) -> None:
        """End the connection after LINGER_S, discarding what still arrives meanwhile."""
        self.transport.set_protocol(_Discarding(self))
        self._disarm()
        self._corked.flush()  # the answer, before the end of the stream
        if self.transport.is_closing():
            return
        self.transport.resume_reading()  # flow control may have paused it: drain, do not reset
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self._close)

    def _close(self) -> None:
        self.transport.close()
        self._closing()

    def _closing(self) -> None:
        """After a close: a transport that still holds unsent data stays open until it is sent,
        which a client that does not read never lets happen; it gets ``write_timeout_ms``."""
        if self.transport.get_write_buffer_size():
            self._stall()

    def timeout_keep_alive_handler(self) -> None:
        if self._unread_waiting():  # a request came in time: this very turn reads it
            self.timeout_keep_alive_task = self.loop.call_later(
                self._header_s, self.timeout_keep_alive_handler)
            return
        super().timeout_keep_alive_handler()
        self._closing()

    def _unread_waiting(self) -> bool:
        """Whether bytes the client sent wait in the socket, not yet read by the event loop.

        A deadline that passes while the loop was busy must not be blamed on the client. uvloop
        runs due timers at the start of a turn, before it polls the sockets, so a request that
        arrived during a long turn (a herd of 300 first polls on a loaded 2-core machine) was
        still unread when its connection's idle or head timer fired: the close then found the
        request in the receive buffer, the kernel answered it with a reset, and the client got
        ``ReadError`` for a request sent well in time (3 CI runs and 1 in 4 local runs of
        tests/system/test_checkpoint.py's herd test; reproduced in tests/system/test_busy_loop.py).
        The deadline is looked at again after that turn's reads. Not while reading is paused (the
        bytes then wait on the application, not on the loop) nor once closing. One ``ioctl``,
        only when a deadline passes."""
        flow = self.flow
        if (flow is not None and flow.read_paused) or self.transport.is_closing():
            return False  # a closing transport reads no more: its bytes wait on nothing
        return _unread_bytes(self.transport) > 0

    def send_400_response(self, msg: str) -> None:
        super().send_400_response(msg)
        self._closing()

    def pause_writing(self) -> None:
        """The transport holds more unsent data than its high-water mark: the client is not
        reading fast enough. It must drain it within ``write_timeout_ms``."""
        if self.flow is not None:  # None: refused at connection_made
            super().pause_writing()
        self._stall()

    def resume_writing(self) -> None:
        _stalled.discard(self)
        if self.flow is not None:
            super().resume_writing()

    def _stall(self) -> None:
        if self not in _stalled:
            self._write_left = self.transport.get_write_buffer_size()
            self._write_due = self.loop.time() + self._write_s
            _stalled.add(self)

    def _write_due_passed(self, now: float) -> None:
        """No more is written while stalled, so less unsent data means the client took some."""
        left = self.transport.get_write_buffer_size()
        if 0 < left < self._write_left:  # a slow reader: it gets another write_timeout
            self._write_left, self._write_due = left, now + self._write_s
            return
        _stalled.discard(self)
        if left:
            metrics.connection_dropped("write_timeout")
            log.debug("no unsent response data taken for %.1f s: connection aborted", self._write_s)
            self.transport.abort()  # a close would wait for the data to be sent

    # -- timers ---------------------------------------------------------------------------------
    def _arm(self, seconds: float, fn: Any) -> None:
        self._due = self.loop.time() + seconds
        self._on_due = fn
        _armed.add(self)

    def _disarm(self) -> None:
        if self._on_due is not None:
            self._on_due = None
            _armed.discard(self)

    def _head_timed_out(self) -> None:
        if not self.transport.is_closing():
            metrics.connection_dropped("head_timeout")
            log.debug("request head not received within %.1f s: connection closed", self._header_s)
            self.transport.write(REQUEST_TIMEOUT)
            self._close()

    def _body_timed_out(self) -> None:
        if not self.transport.is_closing():
            metrics.connection_dropped("body_timeout")
            log.debug("request body not received within %.1f s: connection closed", self._body_s)
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self._close()


def _unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes in the connection's receive buffer (``FIONREAD``); 0 once it is closed."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])
    except (OSError, ValueError):
        return 0


class _Discarding(asyncio.Protocol):
    """The transport's protocol once a connection is only waiting to close (refused, or
    lingering after its last answer): what arrives is discarded, the rest goes to the
    connection's own protocol.

    Swapped in with ``transport.set_protocol``, so the connections being served pay no check per
    read. Replacing ``data_received`` on the protocol instead did nothing under uvloop, which
    calls the bound method it was handed when the connection opened: a refused connection's
    next read went to a parser that was gone ("Fatal error on transport", a traceback, and a
    close at once instead of the linger), and a lingering one kept on parsing. An endless header
    answered 431 so went on growing in the parser: 10 such connections still held a worker's
    /healthz for up to 1.4-2.3 s; discarded, a few hundred ms (BENCHMARKS.md, issue 20)."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: GatewayHttpProtocol) -> None:
        self._protocol = protocol

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return self._protocol.eof_received()  # type: ignore[func-returns-value]

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request has a body to wait for (uvicorn's header names are lower case). A
    request without one (GET /message, /healthz) needs no body deadline and no early-answer
    check: both cost a no-op request about 5 % of its CPU (bench/run.py --workers 1)."""
    return any(name in _BODY_HEADERS for name, _ in headers)


_BODY_HEADERS = frozenset({b"content-length", b"transfer-encoding"})


def _head_size(method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """A head's size as parsed: request line and ``name: value`` lines (whitespace around values,
    which the parser drops, is not counted)."""
    return len(method) + len(url) + 14 + sum(len(n) + len(v) + 4 for n, v in headers)


def _plain_head(method: bytes, url: bytes, version: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request head without its upgrade offer: no ``Upgrade`` or ``HTTP2-Settings`` header,
    no ``upgrade`` or ``http2-settings`` token in ``Connection`` (dropped when nothing is left).
    Framing (``Content-Length``, ``Transfer-Encoding``) and every other header stay as sent."""
    lines = [method + b" " + url + b" HTTP/" + version.encode() + b"\r\n"]
    for name, value in headers:
        if name in _OFFER_HEADERS:
            continue
        if name == b"connection":
            tokens = [t.strip() for t in value.split(b",")]
            value = b", ".join(t for t in tokens if t and t.lower() not in _OFFER_HEADERS)
            if not value:
                continue
        lines.append(name + b": " + value + b"\r\n")
    return b"".join(lines) + b"\r\n"


#: What an upgrade offer adds to a request (RFC 9110 §7.8; RFC 7540 §3.2 for h2c).
_OFFER_HEADERS = frozenset({b"upgrade", b"http2-settings"})


_last_refusal_log = 0.0


def _refused_one(cap: int) -> None:
    """Count a refused connection; log it at most every 10 s (an attack would flood the log)."""
    global _last_refusal_log
    metrics.connection_dropped("over_limit")
    now = time.monotonic()
    if now - _last_refusal_log >= 10:
        _last_refusal_log = now
        log.warning("connection limit reached (%d per worker): new connections are refused with "
                    "503 (mqgw_connections_dropped_total{reason=\"over_limit\"})", cap)
