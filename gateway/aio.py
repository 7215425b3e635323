"""asyncio rules every layer follows: cancellations are never lost, and a background task is
stopped one way.

**Python 3.11 loses cancellations in ``asyncio.wait_for``** (CPython gh-86296, fixed in 3.12 by
gh-96764): when the awaited future finishes in the same loop turn as the cancel arrives,
``wait_for`` returns its result and the ``CancelledError`` is gone. redis-py 8 takes that path in
every command it sends (``send_packed_command`` wraps the write in ``wait_for`` whenever a socket
timeout is set, and its default is 5 s). Measured with a real redis-server (the loop of
tests/system/test_cancellation.py, a task looping on SET cancelled once at a random moment): 212
of 300 cancels were swallowed and the task ran on; a node's stop then waited for ever on its
alerts task ("Waiting for application shutdown.", SIGTERM ignored). Importing this module (the
``gateway`` package does) puts 3.12's ``wait_for`` in place on 3.11: the same body over
``asyncio.timeout``, which counts cancels (``Task.cancelling``) and lets an outside cancel through.
The 300 cancels: 0 swallowed. On 3.12+ nothing is changed.

**One stop rule** (:func:`stop_tasks`): cancel, wait, and cancel again while the task still
runs, however often a cancel is lost in code that is not ours; warn once, with where the task
waits, if it has not ended after :data:`STOP_WARN_S`. Every background task of the gateway is
stopped through it.

A leaf module: it imports nothing of the gateway, so every layer may use it.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("mqgw.tasks")

#: A stop still waiting for a task after this long is logged (with the task's await chain).
STOP_WARN_S = 5.0
#: How often a task that ignored its cancel is cancelled again.
RECANCEL_S = 0.1


async def _wait_for(fut: Any, timeout: float | None) -> Any:  # noqa: ASYNC109 - its signature
    """CPython 3.12's ``asyncio.wait_for`` (Lib/asyncio/tasks.py), for 3.11."""
    if timeout is not None and timeout <= 0:
        fut = asyncio.ensure_future(fut)
        if fut.done():
            return fut.result()
        fut.cancel()
        await asyncio.wait([fut])
        try:
            return fut.result()
        except asyncio.CancelledError as exc:
            raise TimeoutError from exc
    async with asyncio.timeout(timeout):
        return await fut


#: The ``wait_for`` this interpreter came with (tests show its defect on 3.11).
ORIGINAL_WAIT_FOR = asyncio.wait_for


def _install() -> None:
    if sys.version_info < (3, 12) and asyncio.wait_for is not _wait_for:
        asyncio.wait_for = _wait_for
        asyncio.tasks.wait_for = _wait_for


_install()


def await_chain(coro: Any) -> list[str]:
    """Where a coroutine waits: ``file:line function`` for each coroutine, generator and async
    generator it awaits, outermost first (``Task.get_stack`` shows only the outermost frame)."""
    out: list[str] = []
    seen = 0
    while coro is not None and seen < 100:
        seen += 1
        frame = (getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                 or getattr(coro, "ag_frame", None))
        if frame is not None:
            out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        nxt = (getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
               or getattr(coro, "ag_await", None))
        if type(nxt).__name__ in ("async_generator_asend", "async_generator_athrow"):
            # ``async for``: the awaited step object does not name its generator; it refers to it
            nxt = next((r for r in gc.get_referents(nxt) if inspect.isasyncgen(r)), None)
        coro = nxt
    return out


def _name(task: asyncio.Future[Any]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else repr(task)


def describe(task: asyncio.Future[Any]) -> str:
    """A task's name, whether a cancel is pending on it, and its await chain."""
    if not isinstance(task, asyncio.Task):
        return f"future {task!r}\n"
    state = f" (cancel requested {task.cancelling()}x, still running)" if task.cancelling() else ""
    chain = "\n".join(f"  {line}" for line in await_chain(task.get_coro()))
    return f"task {task.get_name()}{state}:\n{chain}\n"


async def stop_tasks(tasks: Iterable[asyncio.Future[Any] | None], warn_after_s: float = STOP_WARN_S) -> None:
    """Cancel every task (None: never started) and wait until all have ended, cancelling again
    any that runs on; a failure a task ended with is logged, not raised (it is being stopped)."""
    pending = {t for t in tasks if t is not None}
    started = time.monotonic()
    warned = False
    while True:
        running = {t for t in pending if not t.done()}
        if not running:
            break
        for t in running:
            t.cancel()
        await asyncio.wait(running, timeout=RECANCEL_S)
        if not warned and time.monotonic() - started >= warn_after_s:
            warned = True
            log.warning("stopping %d task(s): still running after %.0f s:\n%s", len(running),
                        warn_after_s, "".join(describe(t) for t in running if not t.done()))
    for t in pending:
        if not t.cancelled() and t.exception() is not None:
            log.warning("%s ended with %r", _name(t), t.exception())


async def stop_task(task: asyncio.Future[Any] | None) -> None:
    """:func:`stop_tasks` for one task."""
    await stop_tasks([task])

