"""A watchdog for slow stops: what a process is doing when its shutdown takes too long.

2 of ~180 node starts in the tests hung for more than 15 s after SIGTERM, at "Waiting for
application shutdown." (the services closing), and were killed; 250 stops outside the tests
all took under 0.7 s, so the hang needs a test's conditions to show. Nothing said where it
waited. Now, past :data:`SLOW_STOP_S`, the process logs one warning with every thread's Python
stack (librdkafka calls made in the clients' pool show there) and every asyncio task's stack
(an ``await`` that never returns shows there). Only a diagnosis: the stop goes on as before.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..aio import describe

log = logging.getLogger("mqgw.shutdown")

#: A shutdown still running after this long is reported. Under the tests' 10 s before a kill
#: (tests/support Node.stop), above the ~0.5 s a stop takes.
SLOW_STOP_S = 5.0


@contextmanager
def report_if_slow(what: str, after_s: float = SLOW_STOP_S,
                   on_report: Callable[[str], None] | None = None) -> Iterator[None]:
    """Run the body; if it is still running after ``after_s``, log what every thread and task
    of this event loop is doing (``on_report`` also gets the text: tests)."""
    loop = asyncio.get_running_loop()
    done = threading.Event()

    def watch() -> None:
        if done.wait(after_s):
            return
        text = _stacks(loop)
        log.warning("%s still running after %.0f s; where it waits:\n%s", what, after_s, text)
        if on_report is not None:
            on_report(text)

    threading.Thread(target=watch, name="mqgw-slow-stop", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Every thread's stack, then every pending task's (read from this other thread: a task
    set changing meanwhile costs only this report a line)."""
    out = io.StringIO()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"thread {names.get(ident, ident)}:\n")
        out.write("".join(traceback.format_stack(frame)))
    try:
        tasks = list(asyncio.all_tasks(loop))
    except RuntimeError as e:  # the set changed while it was read
        out.write(f"tasks: not read ({e})\n")
        tasks = []
    for task in tasks:  # the whole await chain (get_stack shows only the outermost frame), and
        out.write(describe(task))  # a task whose cancel was swallowed is flagged as such
    return out.getvalue()
