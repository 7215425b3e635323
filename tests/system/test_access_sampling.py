"""The access log's volume is a setting (issue 20): every error answer gets a line, and a random
share ``access_log_sample`` of the others (1 in 100 by default). At a line per request the log
was ~250 MB an hour per node at 2,000 records/s (BENCHMARKS.md, issue 20)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

import httpx
import orjson
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gateway.api import access
from gateway.config import Settings, SettingsError

from ..support import TLS, Node


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.statuses: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.statuses.append(record.__dict__["status"])


@pytest.fixture
def lines() -> Iterator[Lines]:
    """Access lines as records (a handler on ``mqgw.access`` takes the logging path)."""
    lg = logging.getLogger("mqgw.access")
    handler, level = Lines(), lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        lg.removeHandler(handler)
        lg.setLevel(level)


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok")


async def _boom(request: Request) -> Response:
    raise RuntimeError("boom")


async def _internal(request: Request, exc: Exception) -> Response:
    return PlainTextResponse("internal", status_code=500)


def _serve(sample: float, paths: list[str]) -> list[int]:
    app = access.App([access.route("/ok", _ok, ["GET"]), access.route("/boom", _boom, ["GET"])],
                     exception_handlers={Exception: _internal}, access_log_sample=sample)

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            return [(await c.get(p)).status_code for p in paths]
    return asyncio.run(main())


def test_errors_are_always_logged_and_the_rest_sampled(lines: Lines) -> None:
    assert _serve(0.0, ["/ok"] * 50 + ["/nowhere", "/boom"]) == [200] * 50 + [404, 500]
    assert lines.statuses == [404, 500]  # no 200 at a sample of 0
    lines.statuses.clear()
    _serve(1.0, ["/ok"] * 50)
    assert lines.statuses == [200] * 50  # every one at 1
    lines.statuses.clear()
    _serve(0.5, ["/ok"] * 400)
    assert 100 < len(lines.statuses) < 300  # about half (binomial: 200 +- 10 per sigma)


def test_the_sample_is_a_share() -> None:
    assert Settings.load({}).access_log_sample == 0.01
    assert Settings.load({"MQGW_ACCESS_LOG_SAMPLE": "1"}).access_log_sample == 1.0
    for bad in ("2", "-0.1", "ten"):
        with pytest.raises(SettingsError, match="access_log_sample"):
            Settings.load({"MQGW_ACCESS_LOG_SAMPLE": bad})


def test_a_served_node_samples_by_its_setting(node_factory: Callable[..., Node]) -> None:
    node = node_factory(workers=1, access_log_sample=0)
    with httpx.Client(timeout=10, verify=TLS) as http:
        for _ in range(20):
            assert http.get(f"{node.url}/healthz").status_code == 200
        assert http.get(f"{node.url}/nowhere").status_code == 404
    node.stop()  # a clean stop writes what is pending
    records = [orjson.loads(ln) for ln in node.log.read_text().splitlines() if ln.startswith("{")]
    logged = [r["msg"] for r in records if r["logger"] == "mqgw.access"]
    assert logged == ["GET /nowhere 404"], logged
