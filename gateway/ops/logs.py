"""Structured logs: one JSON object per line, tagged with the HTTP request's id.

A gateway node answers requests for any consumer, and a batch fetched on one node is often
acked on another, so logs are only useful when they can be joined across nodes: every line is
JSON (log shippers need no parsing rules) and carries the ``X-Request-Id`` of the request it
was written for, which the client can send (to join with its own logs) or read back from the
response.

The access middleware (``gateway.api.access.RequestContext``) is a pure ASGI middleware
(``BaseHTTPMiddleware`` adds a task and a stream per request); it also records the request
metrics, since it already times the request.

With the access log on, every request writes a line, so writing must be cheap. A write to
stderr per line is a system call that also hands the GIL to the broker client's poll thread;
measured, that cost more than the line itself (``make bench`` p1: 7,600 req/s with a write per
line, 8,600 without the access log). :class:`LoopBatchedHandler` therefore collects the lines
written on the event loop and writes them with one call 10 ms after the first: a line is held
back at most that long, and a killed process loses at most that much (a clean exit flushes).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import time
from contextvars import ContextVar
from typing import Any, TextIO

import orjson

__all__ = ["JsonFormatter", "LoopBatchedHandler", "configure", "log_access", "log_config",
           "new_request_id", "request_id"]

#: The id of the HTTP request being served by the current task (None outside a request).
request_id: ContextVar[str | None] = ContextVar("mqgw_request_id", default=None)

#: LogRecord attributes that are not ``extra=`` fields (``color_message`` is uvicorn's).
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message", "asctime", "taskName", "color_message"}
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")

access_log = logging.getLogger("mqgw.access")

#: Fresh request ids: 16 random hex digits per process, then a 16-digit counter; 32 hex digits,
#: the shape of a uuid4 hex and as unique across nodes and workers, without a urandom call and a
#: UUID object per request.
_ID_PREFIX = os.urandom(8).hex()
_id_counter = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


_ts_cache: tuple[int, str] = (-1, "")


def _timestamp(created: float) -> str:
    """ISO-8601 UTC with milliseconds; the seconds part is formatted once per second."""
    global _ts_cache
    secs = int(created)
    if _ts_cache[0] != secs:
        _ts_cache = (secs, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)))
    return f"{_ts_cache[1]}.{int((created - secs) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """ts, level, logger, msg, request_id (inside a request), exc (with a traceback), extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id.get()
        if rid is not None:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in out:
                out[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # e.g. an int wider than 64 bits: fall back to strings, never lose the line
            return orjson.dumps({k: v if isinstance(v, str) else repr(v) for k, v in out.items()}).decode()


class LoopBatchedHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes every ``delay_s`` at most instead of once per line.

    Inside a running loop, lines are collected and written (and flushed) together by a timer
    started with the first of them. Outside one (start-up, other threads, shutdown) and at
    ``max_lines`` pending, it writes at once, so nothing waits for a loop that may never run
    again. ``logging.shutdown`` flushes what is pending at exit.
    """

    def __init__(self, stream: Any = None, max_lines: int = 256, delay_s: float = 0.01) -> None:
        super().__init__(stream)
        self.max_lines = max_lines
        self.delay_s = delay_s
        self._pending: list[str] = []
        self._scheduled = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging's own contract
            self.handleError(record)
            return
        self._add(line)

    def write_line(self, line: str) -> None:
        """Queue an already formatted line (the access log's direct path)."""
        self.acquire()
        try:
            self._add(line)
        finally:
            self.release()

    def _add(self, line: str) -> None:  # the caller holds the handler's lock
        self._pending.append(line)
        if len(self._pending) >= self.max_lines:
            self.flush()
            return
        if not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not on an event loop's thread
                self.flush()
                return
            self._scheduled = True
            loop.call_later(self.delay_s, self.flush)

    def flush(self) -> None:
        self.acquire()
        try:
            self._scheduled = False
            if self._pending:
                text = "\n".join(self._pending) + "\n"
                self._pending.clear()
                try:
                    self.stream.write(text)
                except Exception:  # noqa: BLE001 - a closed or broken stderr must not fail requests
                    pass
            if self.stream and hasattr(self.stream, "flush"):
                try:
                    self.stream.flush()
                except Exception:  # noqa: BLE001 - as above
                    pass
        finally:
            self.release()


def _direct_handler() -> LoopBatchedHandler | None:
    """Where access lines may go without a LogRecord: the one handler ``configure`` installs,
    when nothing between ``mqgw.access`` and the root logger adds handlers or filters. Any
    other logging setup (a test's capture handler, an operator's dictConfig) takes the usual
    path, so it sees the same records either way."""
    lg: logging.Logger | None = access_log
    while lg is not None and lg is not logging.root:
        if lg.handlers or lg.filters or not lg.propagate:
            return None
        lg = lg.parent
    handlers = logging.root.handlers
    if len(handlers) != 1 or logging.root.filters:
        return None
    h = handlers[0]
    if type(h) is not LoopBatchedHandler or type(h.formatter) is not JsonFormatter or h.filters \
            or h.level > logging.INFO:
        return None
    return h


def log_access(method: str, path: str, route: str, status: int, ms: float, client: str | None,
                rid: str | None) -> None:
    """One access line; the same JSON as ``JsonFormatter`` makes of the equivalent record."""
    h = _direct_handler()
    if h is None:
        access_log.info("%s %s %d", method, path, status, extra={
            "method": method, "path": path, "route": route, "status": status, "duration_ms": ms,
            "client": client})
        return
    out: dict[str, Any] = {"ts": _timestamp(time.time()), "level": "INFO", "logger": access_log.name,
                           "msg": f"{method} {path} {status}"}
    if rid is not None:
        out["request_id"] = rid
    out.update(method=method, path=path, route=route, status=status, duration_ms=ms, client=client)
    h.write_line(orjson.dumps(out).decode())


def _lean_records() -> None:
    """Skip what our JSON lines never show. The logging docs' "Optimization" section names these
    switches; ``_srcfile = None`` saves a stack walk (findCaller) per record."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def configure(level: str = "INFO") -> None:
    """Send every log line (ours and uvicorn's) as JSON to stderr; safe to call again.

    Meant to run after uvicorn configured its loggers (in the app factory, or at app import).
    """
    _lean_records()
    handler = LoopBatchedHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for h in root.handlers[:]:
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _UVICORN_LOGGERS:  # uvicorn gives these their own plain-text handlers
        lg = logging.getLogger(name)
        # uvicorn --no-access-log leaves uvicorn.access with no handler and no propagation, and
        # decides whether to log by lg.hasHandlers(): keep such a logger silent.
        silenced = not lg.handlers and not lg.propagate
        for h in lg.handlers[:]:
            lg.removeHandler(h)
        lg.setLevel(logging.NOTSET)
        lg.propagate = not silenced


def log_config(level: str = "INFO") -> dict[str, Any]:
    """The same setup as a ``logging.config.dictConfig`` dict, for ``uvicorn.run(log_config=...)``.

    uvicorn applies it in the supervisor too, so its own lines ("Started parent process") are JSON.
    """
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"stderr": {"class": f"{__name__}.LoopBatchedHandler", "formatter": "json",
                                "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {name: {"handlers": [], "level": "NOTSET", "propagate": True}
                    for name in _UVICORN_LOGGERS},
    }
