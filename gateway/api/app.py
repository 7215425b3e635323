"""Application factory: the Starlette app over the process's services.

The services (``gateway.services``) are built when the app starts (one set per uvicorn worker:
the Redis pool, the registered Lua scripts, the broker clients) and closed when it stops;
requests build nothing. Which status each error answers is ``errors``' (:data:`HANDLERS`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from ..broker import Broker
from ..config import Settings
from ..ops import gc_tuning, logs, watchdog
from ..services import close_services, open_services
from ..store import Redis
from .access import App
from .admin import admin_routes
from .console import console_routes
from .drain import DRAIN
from .errors import HANDLERS
from .routes import data_routes
from .topics import topic_routes
from .v2 import http_error, v2_routes


def create_app(settings: Settings | None = None, broker: Broker | None = None,
               redis: Redis | None = None) -> Starlette:
    """The gateway app. ``broker`` and ``redis`` (a client): ones the caller made and closes
    (tests: the in-memory broker, fakeredis); by default the app makes and closes its own."""
    settings = settings or Settings.load()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        services = await open_services(settings, broker=broker, redis=redis)
        app.state.services = services
        DRAIN.grace_s = settings.stop_grace_ms / 1000
        DRAIN.on_begin(services.consume.drain)
        DRAIN.follow_signals()
        try:
            yield
        finally:
            DRAIN.clear()
            with watchdog.report_if_slow("application shutdown"):
                await close_services(services)

    # Matched in order, a regex each: the data routes and the REST v2 ones (their hot paths:
    # produce, records, offsets) before the admin API.
    return App(data_routes + v2_routes + admin_routes + topic_routes + console_routes,
               lifespan=lifespan,
               access_log=settings.access_log, access_log_sample=settings.access_log_sample,
               exception_handlers={**HANDLERS, HTTPException: http_error})


def factory() -> Starlette:
    """Entry point for ``uvicorn --factory gateway.api.app:factory`` (each worker calls it)."""
    settings = Settings.load()
    logs.configure(settings.log_level)
    app = create_app(settings)
    gc_tuning.tune_for_serving()
    return app
