"""A tiny app with the gateway's observability pieces, for ``uvicorn --workers 2`` in tests.

``/hello/{name}`` blocks its worker's event loop for a few ms, so while one worker is busy the
other accepts the next connections and both serve some requests. Every response says which
process answered (``x-pid``), so a test can check that each worker's scrape shows all workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.api import access, routes
from gateway.ops import logs, metrics

PID = str(os.getpid())


async def hello(request: Request) -> Response:
    time.sleep(0.005)  # noqa: ASYNC251 -- deliberately blocking: see the module docstring
    return PlainTextResponse(f"hello {request.path_params['name']}", headers={"x-pid": PID})


async def block(request: Request) -> Response:
    """Hold this worker's event loop, so connections made meanwhile go to the other worker."""
    time.sleep(int(request.query_params.get("ms", "300")) / 1000)  # noqa: ASYNC251
    return PlainTextResponse("done", headers={"x-pid": PID})


async def pid(request: Request) -> Response:
    return PlainTextResponse(PID, headers={"x-pid": PID})


async def scrape(request: Request) -> Response:
    response = await routes.metrics_route(request)
    response.headers["x-pid"] = PID
    return response


async def cluster_gauge() -> list[Metric]:
    """Stands in for a value read from Redis: the same on every worker, so never summed."""
    g = GaugeMetricFamily("mqgw_test_cluster_value", "a value shared by all workers")
    g.add_metric([], 7)
    return [g]


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    try:
        yield
    finally:
        metrics.shutdown()


metrics.add_collector_hook(cluster_gauge)
logs.configure("INFO")

app = access.App([
    Route("/hello/{name}", hello, methods=["GET"]),
    Route("/pid", pid, methods=["GET"]),
    Route("/block", block, methods=["GET"]),
    Route("/metrics", scrape, methods=["GET"]),
], access_log=True, lifespan=lifespan)
