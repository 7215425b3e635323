"""The drain of a stopping node (gateway/api/drain.py) through the one HTTP layer that answers it
(``Front``, gateway/api/access.py): a request still running after the grace is answered ``503
shutting_down``, one that ends in time keeps its answer, and a cancel that is not the drain's
(the client went away) is not turned into an answer. The process-level case (SIGTERM under
load) is tests/system/test_node_lifecycle.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.responses import JSONResponse

from gateway.api.access import Front
from gateway.api.drain import DRAIN

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def fresh_drain() -> Iterator[None]:
    DRAIN.grace_s = 0.05
    yield
    DRAIN.clear()


def _scope() -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/produce", "headers": [], "query_string": b"",
            "root_path": "", "app": None}


async def _call(app: Any) -> tuple[asyncio.Task[None], list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    task = asyncio.create_task(Front(app, {}, access_log=False)(_scope(), receive, send))
    await asyncio.sleep(0)
    return task, sent


async def test_a_request_still_running_after_the_grace_is_answered_503() -> None:
    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(30)

    task, sent = await _call(slow)
    DRAIN.begin()
    await asyncio.wait_for(task, 10)
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == "shutting_down"


async def test_a_request_that_ends_within_the_grace_keeps_its_answer_and_polls_end_at_once() -> None:
    ended: list[str] = []
    DRAIN.on_begin(lambda: ended.append("long polls answered"))

    async def quick(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.01)
        await JSONResponse({"ok": True})(scope, receive, send)

    task, sent = await _call(quick)
    DRAIN.begin()
    assert ended == ["long polls answered"]  # the hooks run as the stop begins
    await asyncio.wait_for(task, 10)
    assert sent[0]["status"] == 200


async def test_a_cancel_that_is_not_the_drains_is_not_answered() -> None:
    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(30)

    task, sent = await _call(slow)
    task.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sent == []
