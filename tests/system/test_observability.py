"""Observability: JSON logs with a request id, Prometheus metrics summed over uvicorn workers.

The first tests build a small starlette app in-process; ``test_multiprocess_*`` runs
``tests/support/metrics_app.py`` under ``uvicorn --workers 2``; the ``gateway_*`` tests run real gateway
nodes (``mqgw serve``) and are skipped until gateway.api.app wires the middleware and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from gateway.api import access, routes
from gateway.cli import devstack
from gateway.cli import main as cli
from gateway.ops import logs, metrics

ROOT = Path(__file__).resolve().parents[2]
HEX32 = re.compile(r"[0-9a-f]{32}")
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")

# -- helpers ------------------------------------------------------------------------------

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the series called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scrape_local() -> Samples:
    return parse(asyncio.run(metrics.render()).decode())


class JsonLines(logging.Handler):
    """Formats at emit time, in the emitting task's context (where the request id is set)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logs.JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def records(self, logger: str | None = None) -> list[dict[str, Any]]:
        out = [orjson.loads(line) for line in self.lines]
        return [r for r in out if logger is None or r["logger"] == logger]


@pytest.fixture
def json_logs() -> Iterator[JsonLines]:
    root = logging.getLogger()
    handler, level = JsonLines(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


app_log = logging.getLogger("mqgw.test")


def build_app(access_log: bool = True) -> Starlette:
    async def item(request: Request) -> Response:
        app_log.info("handling item", extra={"item": request.path_params["item_id"]})
        return PlainTextResponse("ok")

    async def thing(request: Request) -> Response:
        return PlainTextResponse("thing")

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.2)  # a long poll in miniature
        return PlainTextResponse("late")

    async def stream(request: Request) -> Response:
        async def body() -> Any:
            for i in range(3):
                yield f"{i}\n"
                await asyncio.sleep(0.01)
        return StreamingResponse(body(), media_type="text/plain")

    async def teapot(request: Request) -> Response:
        raise HTTPException(418, "short and stout")

    async def boom(request: Request) -> Response:
        raise RuntimeError("boom")

    async def internal(request: Request, exc: Exception) -> Response:
        app_log.exception("unhandled error on %s", request.url.path)
        return PlainTextResponse("internal", status_code=500)

    return access.App([
        access.route("/items/{item_id}", item, methods=["GET"]),
        access.route("/slow", slow, ["GET"]), access.route("/stream", stream, ["GET"]),
        access.route("/teapot", teapot, ["GET"]),
        Route("/boom", boom),  # starlette's own per-route wrapper: Front's handlers reach it too
        Mount("/sub", routes=[Route("/things/{x}", thing)]),
    ], access_log=access_log, exception_handlers={Exception: internal})


def call(app: Starlette, path: str, method: str = "GET",
         headers: dict[str, Any] | None = None) -> httpx.Response:
    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False,
                                        client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            return await c.request(method, path, headers=headers)
    return asyncio.run(main())


# -- JSON log lines -----------------------------------------------------------------------

def test_json_formatter_fields_extras_and_exception() -> None:
    fmt = logs.JsonFormatter()
    rec = logging.LogRecord("mqgw.x", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    rec.topic, rec.count, rec.odd = "t1", 3, object()
    line = fmt.format(rec)
    assert "\n" not in line
    d = orjson.loads(line)
    assert TS.fullmatch(d["ts"]) and d["ts"][:19] == time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                     time.gmtime(rec.created))
    assert (d["level"], d["logger"], d["msg"]) == ("WARNING", "mqgw.x", "hello world")
    assert (d["topic"], d["count"]) == ("t1", 3) and d["odd"].startswith("<object")
    assert "request_id" not in d and "exc" not in d and "args" not in d

    token = logs.request_id.set("rid-1")
    try:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            rec = logging.LogRecord("mqgw.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
        line = fmt.format(rec)
    finally:
        logs.request_id.reset(token)
    assert "\n" not in line  # the traceback is inside the JSON string, escaped
    d = orjson.loads(line)
    assert d["request_id"] == "rid-1"
    assert "Traceback" in d["exc"] and "ValueError: bad\nvalue" in d["exc"]


def test_configure_makes_root_and_uvicorn_loggers_json() -> None:
    root = logging.getLogger()
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved = (root.handlers[:], root.level,
             {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level,
                  logging.getLogger(n).propagate) for n in names})
    try:
        for n in names:  # as uvicorn's default config leaves them
            logging.getLogger(n).handlers[:] = [logging.StreamHandler()] if n != "uvicorn.error" else []
            logging.getLogger(n).propagate = n == "uvicorn.error"
            logging.getLogger(n).setLevel(logging.INFO)
        logs.configure("warning")
        logs.configure("debug")  # again: still exactly one handler
        assert len(root.handlers) == 1 and isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        assert root.level == logging.DEBUG
        for n in names:
            lg = logging.getLogger(n)
            assert lg.handlers == [] and lg.propagate and lg.level == logging.NOTSET
            assert lg.hasHandlers()
        # uvicorn --no-access-log: no handler, no propagation; it must stay off
        access = logging.getLogger("uvicorn.access")
        access.handlers[:], access.propagate = [], False
        logs.configure("info")
        assert not access.hasHandlers()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for n, (hs, lvl, prop) in saved[2].items():
            lg = logging.getLogger(n)
            lg.handlers[:], lg.propagate = hs, prop
            lg.setLevel(lvl)


def test_log_config_is_a_valid_dictconfig() -> None:
    import logging.config

    cfg = logs.log_config("info")
    assert cfg["formatters"]["json"]["()"] == "gateway.ops.logs.JsonFormatter"
    logging.config.dictConfigClass(cfg)  # parses without applying


# -- request id and access log --------------------------------------------------------------

def test_request_id_is_generated_echoed_and_on_every_line(json_logs: JsonLines) -> None:
    r = call(build_app(), "/items/42")
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert HEX32.fullmatch(rid)
    handler_line, = json_logs.records("mqgw.test")
    assert handler_line["request_id"] == rid and handler_line["item"] == "42"
    access, = json_logs.records("mqgw.access")
    assert access["request_id"] == rid
    assert access["msg"] == "GET /items/42 200"
    assert {k: access[k] for k in ("method", "path", "route", "status", "client")} == {
        "method": "GET", "path": "/items/42", "route": "/items/{item_id}", "status": 200,
        "client": "127.0.0.1:40000"}
    assert isinstance(access["duration_ms"], float) and access["duration_ms"] >= 0
    assert logs.request_id.get() is None  # reset after the request

    r2 = call(build_app(), "/items/42")
    assert r2.headers["x-request-id"] != rid


@pytest.mark.parametrize("incoming, kept", [
    ("abc-123_X.y", True),
    ("a" * 128, True),
    ("a" * 129, False),
    ("has space", False),
    ("semi;colon", False),
    ("", False),
    ("ünïcode", False),
])
def test_client_request_id_kept_only_when_sane(incoming: str, kept: bool, json_logs: JsonLines) -> None:
    headers = {"X-Request-Id": incoming.encode("utf-8")}
    r = call(build_app(), "/items/1", headers=headers)
    rid = r.headers["x-request-id"]
    assert len(r.headers.get_list("x-request-id")) == 1
    if kept:
        assert rid == incoming
    else:
        assert HEX32.fullmatch(rid)
    assert {line["request_id"] for line in json_logs.records() if line["logger"].startswith("mqgw")} == {rid}


class CountingStream:
    """A stream that records each write call, to see how lines are batched."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass

    def lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(ln) for w in self.writes for ln in w.splitlines()]


def batched_logger(stream: CountingStream, **kw: Any) -> tuple[logging.Logger, logs.LoopBatchedHandler]:
    handler = logs.LoopBatchedHandler(stream, **kw)
    handler.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger(f"mqgw.test.batched.{uuid.uuid4().hex[:8]}")
    lg.propagate, lg.level = False, logging.INFO
    lg.addHandler(handler)
    return lg, handler


def test_request_ids_are_unique_32_hex_digits() -> None:
    ids = [logs.new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids) and all(HEX32.fullmatch(i) for i in ids)
    # another process (worker or node) draws another random prefix
    code = "from gateway.ops import logs; print(logs.new_request_id())"
    other = subprocess.run([sys.executable, "-c", code],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert HEX32.fullmatch(other) and other[:16] != ids[0][:16]


def test_log_lines_of_one_loop_turn_are_written_together() -> None:
    stream = CountingStream()
    # 0.5 s: the short sleep below stays well inside the batch's delay even when a loaded
    # machine wakes the loop late
    lg, _handler = batched_logger(stream, delay_s=0.5)

    async def main() -> None:
        for i in range(20):
            lg.info("line %d", i)
        assert stream.writes == []  # held for the batch, not written per line
        await asyncio.sleep(0.01)
        lg.info("line 20")
        assert stream.writes == []
        await asyncio.sleep(0.6)
        assert len(stream.writes) == 1  # one write for all 21 lines
        lg.info("line 21")
        await asyncio.sleep(0.6)
    asyncio.run(main())
    assert len(stream.writes) == 2
    assert [d["msg"] for d in stream.lines()] == [f"line {i}" for i in range(22)]


def test_log_lines_outside_a_loop_and_past_the_cap_are_written_at_once() -> None:
    stream = CountingStream()
    lg, handler = batched_logger(stream, max_lines=5, delay_s=60)
    lg.info("no loop here")
    assert len(stream.writes) == 1  # start-up, threads, shutdown: nothing waits for a loop

    async def main() -> None:
        for i in range(12):
            lg.info("busy %d", i)
        assert len(stream.writes) == 1 + 2  # two full batches of 5; 2 lines pending
        # another thread's line does not wait for this loop's timer either... unless a batch is
        # already pending, which it joins (written with that batch, in order)
        t = threading.Thread(target=lg.info, args=("from a thread",))
        t.start()
        t.join()
    asyncio.run(main())
    handler.flush()  # what logging.shutdown() does at exit: pending lines are not lost
    msgs = [d["msg"] for d in stream.lines()]
    assert msgs == ["no loop here"] + [f"busy {i}" for i in range(12)] + ["from a thread"]


def test_access_lines_skip_logging_only_where_it_changes_nothing(json_logs: JsonLines) -> None:
    """With the handler ``configure`` installs as the only one, access lines are written
    directly; with any other setup they are records. Either way the line is the same JSON."""
    root = logging.getLogger()
    saved = root.handlers[:]
    stream = CountingStream()
    batched = logs.LoopBatchedHandler(stream)
    batched.setFormatter(logs.JsonFormatter())
    try:
        root.handlers[:] = [batched]
        assert logs._direct_handler() is batched
        call(build_app(), "/items/1", headers={"X-Request-Id": "direct-1"})
        root.handlers.append(json_logs)  # now a capture handler is there too: records again
        assert logs._direct_handler() is None
        call(build_app(), "/items/1", headers={"X-Request-Id": "record-1"})
    finally:
        root.handlers[:] = saved
    batched.flush()
    lines = [d for d in stream.lines() if d["logger"] == "mqgw.access"]
    direct, record = lines
    assert [d["request_id"] for d in lines] == ["direct-1", "record-1"]
    assert [r["request_id"] for r in json_logs.records("mqgw.access")] == ["record-1"]
    assert list(direct) == list(record)  # same fields, same order
    for k in direct:
        if k not in ("ts", "request_id", "duration_ms"):
            assert direct[k] == record[k], k
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", direct["ts"])
    # a filter on the access logger must see every line: no direct path then
    access = logging.getLogger("mqgw.access")
    access.addFilter(lambda r: True)
    try:
        root.handlers[:] = [batched]
        assert logs._direct_handler() is None
    finally:
        root.handlers[:] = saved
        access.filters.clear()


def test_a_broken_log_stream_does_not_fail_the_caller() -> None:
    class Broken(CountingStream):
        def write(self, text: str) -> None:
            raise OSError("stderr closed")
    lg, handler = batched_logger(Broken())
    lg.info("dropped, not raised")
    handler.flush()


def test_access_log_can_be_off(json_logs: JsonLines) -> None:
    r = call(build_app(access_log=False), "/items/7")
    assert r.status_code == 200 and r.headers["x-request-id"]
    assert json_logs.records("mqgw.access") == []
    assert len(json_logs.records("mqgw.test")) == 1


def test_slow_and_streamed_responses_pass_through(json_logs: JsonLines) -> None:
    app = build_app()
    r = call(app, "/slow")
    assert r.text == "late" and r.headers["x-request-id"]
    r = call(app, "/stream")
    assert r.text == "0\n1\n2\n" and r.headers["x-request-id"]
    slow, streamed = json_logs.records("mqgw.access")
    assert slow["duration_ms"] >= 190
    assert (streamed["route"], streamed["status"]) == ("/stream", 200)


def test_unhandled_error_is_counted_and_logged_with_the_request_id(json_logs: JsonLines) -> None:
    before = scrape_local()
    r = call(build_app(), "/boom")
    assert r.status_code == 500
    # The 500 is the app's handler's, answered by the front layer: it carries the request id,
    # which the log lines share.
    access, = json_logs.records("mqgw.access")
    assert r.text == "internal" and r.headers["x-request-id"] == access["request_id"]
    error, = json_logs.records("mqgw.test")
    assert (access["status"], access["route"]) == (500, "/boom")
    assert error["request_id"] == access["request_id"] and "RuntimeError: boom" in error["exc"]
    after = scrape_local()
    key = {"route": "/boom", "method": "GET", "status": "500"}
    assert value(after, "mqgw_requests_total", **key) - value(before, "mqgw_requests_total", **key) == 1


# -- metrics ----------------------------------------------------------------------------------

def test_requests_are_counted_by_route_template() -> None:
    app = build_app(access_log=False)
    before = scrape_local()
    expected = [("/items/1", "GET", 200), ("/items/2", "GET", 200), ("/items/x%20y", "GET", 200),
                ("/items/1", "POST", 405), ("/nope/123", "GET", 404), ("/teapot", "GET", 418),
                ("/sub/things/9", "GET", 200), ("/sub/other", "GET", 404), ("/items/3", "BREW", 405)]
    for path, method, status in expected:
        assert call(app, path, method).status_code == status, path
    after = scrape_local()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("mqgw_requests_total", route="/items/{item_id}", method="GET", status="200") == 3
    assert delta("mqgw_requests_total", route="/items/{item_id}", method="POST", status="405") == 1
    assert delta("mqgw_requests_total", route="/items/{item_id}", method="other", status="405") == 1
    assert delta("mqgw_requests_total", route="unmatched", method="GET", status="404") == 2
    assert delta("mqgw_requests_total", route="/teapot", status="418") == 1
    assert delta("mqgw_requests_total", route="/sub/things/{x}", status="200") == 1
    assert delta("mqgw_request_duration_seconds_count", route="/items/{item_id}") == 5
    assert delta("mqgw_request_duration_seconds_bucket", route="/items/{item_id}", le="+Inf") == 5
    routes = {dict(ls).get("route") for (n, ls) in after if n.startswith("mqgw_request")}
    assert not any(r and re.search(r"/items/\d|/nope|/sub/other", r) for r in routes), routes


def test_route_template_without_scope_route() -> None:
    """Older starlette leaves no ``scope["route"]``; the template is then found by matching."""
    app = build_app()
    base = {"type": "http", "root_path": "", "headers": [], "app": app, "endpoint": object()}
    assert access.route_template({**base, "path": "/items/5", "method": "GET"}) == "/items/{item_id}"
    assert access.route_template({**base, "path": "/items/5", "method": "POST"}) == "/items/{item_id}"
    assert access.route_template({**base, "path": "/nope", "method": "GET"}) == "unmatched"
    assert access.route_template({"type": "http", "path": "/nope", "method": "GET"}) == "unmatched"


def test_domain_counters() -> None:
    before = scrape_local()
    metrics.produced(ok=5, failed=2)
    metrics.produced(ok=0, failed=0)
    metrics.fetched("ok", 4, redelivered=False)
    metrics.fetched("ok", 3, redelivered=True)
    metrics.fetched("empty", 0, redelivered=False)
    metrics.fetched("paused", 0, redelivered=False)
    metrics.fetched("rate_limited", 0, redelivered=False)
    for result in ("committed", "committed", "already_committed", "lock_lost", "offset_reset",
                   "offset_mismatch", "unknown"):
        metrics.acked(result)
    metrics.dependency_error("redis")
    metrics.dependency_error("broker")
    metrics.dependency_error("broker")
    after = scrape_local()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("mqgw_produced_messages_total", result="ok") == 5
    assert delta("mqgw_produced_messages_total", result="failed") == 2
    assert delta("mqgw_fetched_messages_total") == 7
    assert delta("mqgw_redeliveries_total") == 1
    for status, n in (("ok", 2), ("empty", 1), ("paused", 1), ("rate_limited", 1)):
        assert delta("mqgw_fetch_responses_total", status=status) == n
    for result, n in (("committed", 2), ("already_committed", 1), ("lock_lost", 1),
                      ("offset_reset", 1), ("offset_mismatch", 1), ("unknown", 1)):
        assert delta("mqgw_acks_total", result=result) == n
    assert delta("mqgw_stale_acks_total") == 3
    assert delta("mqgw_dependency_errors_total", dependency="redis") == 1
    assert delta("mqgw_dependency_errors_total", dependency="broker") == 2


def test_all_series_exist_before_the_first_event() -> None:
    s = scrape_local()
    for name, label, values in (
            ("mqgw_produced_messages_total", "result", ("ok", "failed")),
            ("mqgw_fetch_responses_total", "status", metrics.FETCH_STATUSES),
            ("mqgw_acks_total", "result", metrics.ACK_RESULTS),
            ("mqgw_dependency_errors_total", "dependency", metrics.DEPENDENCIES)):
        for v in values:
            assert (name, frozenset({(label, v)})) in s, (name, v)
    for name in ("mqgw_fetched_messages_total", "mqgw_redeliveries_total", "mqgw_stale_acks_total"):
        assert (name, frozenset()) in s


def test_metrics_route_with_collector_hooks() -> None:
    async def backlog() -> list[Any]:
        g = GaugeMetricFamily("mqgw_test_backlog", "backlog per consumer", labels=["consumer"])
        g.add_metric(["orders"], 12)
        return [g]

    async def broken() -> list[Any]:
        raise ConnectionError("redis is down")

    metrics.add_collector_hook(backlog)
    metrics.add_collector_hook(broken)
    try:
        app = Starlette(routes=[Route("/metrics", routes.metrics_route)])
        r = call(app, "/metrics")
    finally:
        metrics._hooks.remove(backlog)
        metrics._hooks.remove(broken)
    assert r.status_code == 200
    assert r.headers["content-type"] == metrics.CONTENT_TYPE_LATEST
    s = parse(r.text)  # also checks no series appears twice
    assert value(s, "mqgw_test_backlog", consumer="orders") == 12
    assert ("mqgw_requests_total" in r.text) and "# TYPE mqgw_request_duration_seconds histogram" in r.text
    assert "_created" not in r.text


# -- mqgw serve's multiprocess directory ------------------------------------------------------

def test_serve_makes_a_fresh_prometheus_dir_and_removes_it(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    env: dict[str, str] = {}
    with cli.prometheus_dir(env) as path:
        assert env[cli.PROM_ENV] == path and os.path.basename(path).startswith("mqgw-prom-")
        assert os.listdir(path) == []
        Path(path, "counter_123.db").write_bytes(b"x")
    assert not os.path.exists(path) and cli.PROM_ENV not in env


def test_serve_empties_a_prometheus_dir_the_user_chose(tmp_path: Path) -> None:
    d = tmp_path / "prom"
    d.mkdir()
    (d / "counter_1.db").write_bytes(b"stale")
    (d / "histogram_2.db").write_bytes(b"stale")
    (d / "keep.txt").write_text("not ours")
    env = {cli.PROM_ENV: str(d)}
    with cli.prometheus_dir(env) as path:
        assert path == str(d)
        assert sorted(os.listdir(d)) == ["keep.txt"]
    assert d.is_dir() and env == {cli.PROM_ENV: str(d)}  # the user's directory stays
    env = {cli.PROM_ENV: str(tmp_path / "new" / "dir")}
    with cli.prometheus_dir(env) as path:
        assert os.path.isdir(path)


def test_dev_runs_the_gateway_through_serve() -> None:
    assert cli._serve_cmd("127.0.0.1", 8080, 2)[1:] == [
        "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "8080", "--workers", "2"]


# -- several uvicorn workers ----------------------------------------------------------------

def _start(cmd: list[str], env: dict[str, str], log: Path, port: int) -> subprocess.Popen:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz" if "gateway" in cmd else
                         f"http://127.0.0.1:{port}/pid", timeout=0.5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    _stop(proc)
    raise TimeoutError(log.read_text()[-3000:])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass


def _fresh(url: str, **kw: Any) -> httpx.Response:
    """One request on a new connection, so the kernel picks a worker for each."""
    with httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        return c.get(url, **kw)


async def _burst(base: str, paths: list[str]) -> list[str]:
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as c:
        sem = asyncio.Semaphore(8)

        async def one(p: str) -> str:
            async with sem:
                r = await c.get(p)
                assert r.status_code == 200, r.text
                return r.headers["x-pid"]
        return await asyncio.gather(*(one(p) for p in paths))


def _scrape_each_worker(base: str, check: Callable[[Samples], None], workers: int = 2) -> set[str]:
    """Scrape until every worker answered at least once; ``check`` each scrape.

    Each scrape is made while a /block request holds one worker's loop, so another one has to
    accept it; which worker gets blocked is up to the kernel, so a few rounds see them all.
    """
    seen: set[str] = set()
    for _ in range(40):
        blocker = threading.Thread(target=_fresh, args=(f"{base}/block?ms=300",))
        blocker.start()
        time.sleep(0.08)
        r = _fresh(f"{base}/metrics")
        blocker.join()
        assert r.status_code == 200
        check(parse(r.text))
        seen.add(r.headers["x-pid"])
        if len(seen) == workers:
            break
    return seen


@pytest.mark.slow  # two workers, hundreds of requests, several scrapes
@pytest.mark.timeout(120)
def test_multiprocess_totals_are_exact_whichever_worker_answers(tmp_path: Path) -> None:
    prom = tmp_path / "prom"
    prom.mkdir()
    port = devstack.free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom)}
    cmd = [sys.executable, "-m", "uvicorn", "tests.support.metrics_app:app", "--host", "127.0.0.1",
           "--port", str(port), "--workers", "2", "--no-access-log"]
    proc = _start(cmd, env, tmp_path / "uvicorn.log", port)
    base = f"http://127.0.0.1:{port}"
    try:
        served: dict[str, int] = {}
        sent = 0
        while sent < 2000 and (sent < 200 or len(served) < 2):
            for pid in asyncio.run(_burst(base, [f"/hello/n{sent + i}" for i in range(40)])):
                served[pid] = served.get(pid, 0) + 1
            sent += 40
        assert len(served) == 2, f"one worker served all {sent} requests: {served}"

        def exact(s: Samples) -> None:
            assert value(s, "mqgw_requests_total", route="/hello/{name}") == sent
            assert value(s, "mqgw_requests_total", route="/hello/{name}", method="GET",
                         status="200") == sent
            assert value(s, "mqgw_request_duration_seconds_count", route="/hello/{name}") == sent
            assert value(s, "mqgw_test_cluster_value") == 7  # from the hook: reported, not summed

        assert len(_scrape_each_worker(base, exact)) == 2

        # A worker that dies is replaced by uvicorn; what it counted stays in the totals
        # (a Prometheus counter must never go down).
        victim = next(iter(served))
        os.kill(int(victim), signal.SIGKILL)
        deadline = time.monotonic() + 30
        pids: set[str] = set()
        while time.monotonic() < deadline:
            pids = set(asyncio.run(_burst(base, ["/pid"] * 16)))
            if victim not in pids and len(pids) == 2:
                break
            time.sleep(0.2)
        assert victim not in pids and len(pids) == 2, pids
        assert len(_scrape_each_worker(base, exact)) == 2
        assert list(prom.glob("counter_*.db")) and not list(prom.glob("gauge_live*"))
    finally:
        _stop(proc)
    lines = [ln for ln in (tmp_path / "uvicorn.log").read_text().splitlines() if ln.strip()]
    access = [orjson.loads(ln) for ln in lines if '"mqgw.access"' in ln]
    assert len(access) >= sent and all(HEX32.fullmatch(a["request_id"]) for a in access)
    assert not [ln for ln in lines if "uvicorn.access" in ln]  # --no-access-log still holds


# -- real gateway nodes -----------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: multiprocess
def test_gateway_serve_metrics_and_json_logs(workers: int, redis_url: str, bootstrap: str,
                                             make_topic: Callable[..., str], tmp_path: Path) -> None:
    port = devstack.free_port()
    run_tmp = tmp_path / "tmp"
    run_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({"MQGW_REDIS_URL": redis_url, "MQGW_KAFKA_BOOTSTRAP": bootstrap,
                "MQGW_HMAC_KEY": "test-hmac-key-0123456789", "MQGW_START_POSITION": "earliest",
                "MQGW_OPEN_MODE": "true", "MQGW_AUTH": "false", "TMPDIR": str(run_tmp),
                # every request's line: the test reads the health check's (1 % by default)
                "MQGW_ACCESS_LOG_SAMPLE": "1"})
    log = tmp_path / "serve.log"
    proc = _start([sys.executable, "-m", "gateway", "serve", "--port", str(port),
                   "--workers", str(workers)], env, log, port)
    base = f"http://127.0.0.1:{port}"
    try:
        assert len(glob.glob(str(run_tmp / "mqgw-prom-*"))) == 1
        rid = "it-" + uuid.uuid4().hex[:8]
        r = httpx.get(f"{base}/healthz", headers={"X-Request-Id": rid})
        assert r.headers["x-request-id"] == rid
        topic = make_topic(1)
        group = f"obs-{uuid.uuid4().hex[:8]}"
        with httpx.Client(base_url=base, timeout=30,
                          limits=httpx.Limits(max_keepalive_connections=0)) as c:
            r = c.post("/produce", json={"topic": topic, "messages": [{"value": str(i)} for i in range(3)]})
            assert r.status_code == 200 and r.json()["failed"] == 0
            batch = c.get("/message", params={"consumer": group, "topic": topic, "max": 10,
                                              "wait_ms": 5000}).json()
            assert batch["status"] == "ok" and batch["messages"]
            assert c.post("/ack", json={"requestId": batch["requestId"]}).json()["result"] == "committed"
            assert c.post("/ack", json={"requestId": batch["requestId"]}).json()["result"] == \
                "already_committed"
            assert c.get("/nowhere/1").status_code == 404
        expected = {
            ("mqgw_produced_messages_total", ("result", "ok")): 3,
            ("mqgw_produced_messages_total", ("result", "failed")): 0,
            ("mqgw_fetched_messages_total", None): len(batch["messages"]),
            ("mqgw_fetch_responses_total", ("status", "ok")): 1,
            ("mqgw_acks_total", ("result", "committed")): 1,
            ("mqgw_acks_total", ("result", "already_committed")): 1,
            ("mqgw_stale_acks_total", None): 0,
            ("mqgw_redeliveries_total", None): 0,
        }
        for _ in range(6):  # whichever worker answers, the node's totals
            s = parse(_fresh(f"{base}/metrics").text)
            for (name, label), n in expected.items():
                assert value(s, name, **dict([label] if label else [])) == n, (name, label)
            assert value(s, "mqgw_requests_total", route="/message", method="GET", status="200") == 1
            assert value(s, "mqgw_requests_total", route="/produce", method="POST", status="200") == 1
            assert value(s, "mqgw_requests_total", route="/ack", method="POST", status="200") == 2
            assert value(s, "mqgw_requests_total", route="unmatched", status="404") == 1
            assert value(s, "mqgw_requests_total", route="/healthz", status="200") >= 1
    finally:
        _stop(proc)
    assert glob.glob(str(run_tmp / "mqgw-prom-*")) == []  # serve removed its directory
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    records = [orjson.loads(ln) for ln in lines]  # every line is JSON, the supervisor's too
    health = [d for d in records if d["logger"] == "mqgw.access" and d.get("request_id") == rid]
    assert len(health) == 1 and health[0]["route"] == "/healthz"


@pytest.mark.timeout(120)
def test_gateway_counts_pauses_rate_limits_redeliveries_stale_acks_and_backlog(
        node_factory: Callable[..., Any], make_topic: Callable[..., str]) -> None:
    """The operational counters, driven through a real node (open mode, auth off)."""
    node = node_factory(key_prefix=f"obs-{uuid.uuid4().hex[:8]}", alert_interval_ms=0)
    topic, g = make_topic(1), f"obs-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=node.url, timeout=30) as c:
        def msg(**kw: Any) -> httpx.Response:
            return c.get("/message", params={"consumer": g, "topic": topic, "max": 1, **kw})

        before = parse(c.get("/metrics").text)
        c.patch(f"/admin/consumers/{g}", json={"start": "earliest", "consumeTimeoutMs": 200,
                                                "alerts": {"backlogMessages": 100}}).raise_for_status()
        for i in range(4):
            assert c.post("/produce", json={"topic": topic, "value": f"v{i}"}).json()["failed"] == 0
        first = msg(wait_ms=5000).json()
        time.sleep(0.3)  # the lock expires
        again = msg().json()
        assert again["redelivered"] is True and again["offset"] == first["offset"]
        assert c.post("/ack", json={"requestId": first["requestId"]}).json()["result"] == "lock_lost"
        assert c.post("/ack", json={"requestId": again["requestId"]}).json()["result"] == "committed"
        c.post(f"/admin/consumers/{g}/pause").raise_for_status()
        assert msg().json()["status"] == "paused"
        c.patch(f"/admin/consumers/{g}", json={"paused": False,
                                                "rateLimit": {"messagesPerSecond": 0.01, "burst": 1}})
        ok = msg().json()
        assert ok["status"] == "ok"
        c.post("/ack", json={"requestId": ok["requestId"]})
        assert msg().status_code == 429
        c.post("/admin/alerts/evaluate").raise_for_status()
        after = parse(c.get("/metrics").text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("mqgw_fetch_responses_total", status="ok") == 3
    assert delta("mqgw_fetch_responses_total", status="paused") == 1
    assert delta("mqgw_fetch_responses_total", status="rate_limited") == 1
    assert delta("mqgw_fetched_messages_total") == 3
    # ``again`` is flagged; ``first`` or ``ok`` too if its read took longer than the 200 ms lock
    # (a batch answered after its lock ran out is flagged: core/fetch.py Batch.redelivered_at)
    assert delta("mqgw_redeliveries_total") == sum(b["redelivered"] for b in (first, again, ok))
    assert delta("mqgw_stale_acks_total") == 1
    assert delta("mqgw_acks_total", result="lock_lost") == 1
    assert delta("mqgw_acks_total", result="committed") == 2
    assert delta("mqgw_requests_total", route="/message", method="GET", status="429") == 1
    assert value(after, "mqgw_consumer_backlog", consumer=g) == 2  # 4 produced, 2 committed
    assert value(after, "mqgw_backlog_alert", consumer=g) == 0
