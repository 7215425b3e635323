"""Application factory: wires settings, Redis, the broker adapter and the services.

Everything built here lives for the whole process (one per uvicorn worker): the
Redis pool, the registered Lua scripts, the broker clients. Requests build nothing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .. import broker as brokers
from ..broker import Broker, BrokerUnavailable, UnknownTopic
from ..config import Settings, hmac_key_problem, hmac_key_refusal, node_id
from ..core.auth import Authorizer, KeyStore
from ..core.checkpoint import Checkpoints
from ..core.consume import ConsumeService
from ..core.deadletters import CURSOR_GROUP, DeadLetters
from ..core.delay import DelayService
from ..core.errors import DomainError
from ..core.nack import NackService
from ..core.names import internal_topic_prefixes
from ..core.produce import ProduceGate
from ..core.registry import Registry
from ..core.registry_copy import RegistryCopy
from ..core.relay import RELAY_GROUP, Relay
from ..core.requestid import RequestIdCodec
from ..core.topics import TopicService
from ..core.watermarks import Watermarks
from ..ops import logs, metrics
from ..ops.alerts import AlertMonitor
from ..store import UNAVAILABLE, OffsetStore
from .access import App
from .admin import admin_routes
from .errors import ApiError, from_domain, unavailable_body
from .routes import JSON, data_routes
from .topics import topic_routes

log = logging.getLogger("mqgw")
_SPEC = resources.files("gateway") / "openapi.yaml"  # a link to the top-level spec, packaged as data


@dataclass
class Gateway:
    settings: Settings
    store: OffsetStore
    broker: Broker
    consume: ConsumeService
    openapi: bytes
    registry: Registry
    keys: KeyStore
    auth: Authorizer
    checkpoints: Checkpoints
    produce_gate: ProduceGate
    delay: DelayService
    nack: NackService
    dead_letters: DeadLetters
    relay: Relay | None = None  # None: this process does not relay (``relay = false``)
    alerts: AlertMonitor | None = None  # backlog alerts: set and started in lifespan
    topics: TopicService | None = None  # /admin/topics


def create_app(settings: Settings | None = None, broker: Broker | None = None) -> Starlette:
    settings = settings or Settings.load()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        refusal = hmac_key_refusal(settings)  # `mqgw serve` checked it already; other servers
        if refusal is not None:
            raise RuntimeError(refusal)
        b = broker or brokers.create(settings)
        await b.start()
        store = OffsetStore.connect(settings.redis_url, settings.key_prefix,
                                    settings.redis_max_connections,
                                    settings.redis_pool_timeout_ms / 1000)
        wm = Watermarks(store, b, settings.metadata_refresh_ms)
        keys = KeyStore(store)
        auth = Authorizer(settings.auth, keys)
        checkpoints = Checkpoints(settings, store, b, on_restore=metrics.offsets_restored)
        copy = RegistryCopy(settings, store, b)
        store.registry.journal = copy.wrote
        await copy.start()  # a Redis that lost the registry gets it back before this serves
        consume = ConsumeService(settings, store, b, wm, RequestIdCodec(settings.hmac_key), auth,
                                 on_ack=lambda r: metrics.acked(r.result.value),
                                 checkpoints=checkpoints, registry_copy=copy)
        spec = _SPEC.read_bytes() if _SPEC.is_file() else b""
        key_problem = hmac_key_problem(settings.hmac_key)  # only without auth (refused above)
        if key_problem is not None:
            log.warning(f"{key_problem}: anyone can forge requestIds. "
                        "Set a secret key shared by all nodes.")
        if not settings.auth:
            log.warning("auth is off (MQGW_AUTH=false): anyone who reaches this port can produce, "
                        "consume and use the admin API")
        if settings.open_mode:
            log.warning("open mode is on (MQGW_OPEN_MODE=true): unregistered consumers and "
                        "producers are served")
        registry = Registry(store, settings, checkpoints)
        gate = ProduceGate(store, settings.open_mode,
                           internal=internal_topic_prefixes(settings))
        delay = DelayService(settings, store, b)
        relay = Relay(settings, store, b, wm, delay, metrics.delay_moved, checkpoints) \
            if settings.relay and not delay.native else None
        if relay is not None:
            delay.poke = relay.poke
            await delay.start()  # its level topics exist before this serves (see there)
            relay.start()
        nack = NackService(settings, store, b, consume, delay)
        app.state.gw = Gateway(settings, store, b, consume, spec, registry, keys, auth, checkpoints,
                               gate, delay, nack, DeadLetters(settings, store, b, wm, checkpoints), relay,
                               topics=TopicService(settings, b, wm))
        listener = asyncio.create_task(gate.listen(f"{node_id()}:{uuid.uuid4().hex[:8]}"),
                                       name="mqgw-registry-changes")
        alerts = app.state.gw.alerts = AlertMonitor(app.state.gw)
        alerts.start()

        async def names() -> set[str]:
            registered, seen = await registry.consumer_names()
            return registered | seen | {RELAY_GROUP, CURSOR_GROUP}  # the gateway's own too
        checkpoints.start(names)
        try:
            yield
        finally:
            metrics.shutdown()
            if relay is not None:
                await relay.stop()
            await delay.close()
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await checkpoints.stop()
            await copy.stop()
            await alerts.stop()
            await b.close()
            await store.aclose()

    return App(data_routes + admin_routes + topic_routes, lifespan=lifespan, access_log=settings.access_log,
               access_log_sample=settings.access_log_sample,
               exception_handlers={
        ApiError: _api_error,
        DomainError: _domain_error,
        HTTPException: _http_error,
        ClientDisconnect: _client_gone,
        UnknownTopic: _unknown_topic,
        BrokerUnavailable: _unavailable,
        **dict.fromkeys(UNAVAILABLE, _unavailable),  # Redis unreachable, failing over, read-only
        Exception: _internal,
    })


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSON(exc.body(), status_code=exc.status, headers=exc.headers)


async def _domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DomainError)
    return await _api_error(request, from_domain(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSON({"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code,
                headers=exc.headers)


async def _unknown_topic(request: Request, exc: Exception) -> Response:
    return JSON({"error": {"code": "unknown_topic", "message": f"topic {str(exc)!r} does not exist"}},
                status_code=404)


async def _unavailable(request: Request, exc: Exception) -> Response:
    dep, body = unavailable_body(exc)
    metrics.dependency_error(dep)
    log.warning("dependency unavailable on %s: %s", request.url.path, exc)
    # The cause (host, port, broker error) goes to the log, not to clients.
    return JSON(body, status_code=503, headers={"Retry-After": "1"})


#: The status a request is counted and logged with when its client left before the body arrived
#: whole: nginx's "client closed request". Nobody receives it; it keeps those requests out of 500s.
CLIENT_CLOSED = 499


async def _client_gone(request: Request, exc: Exception) -> Response:
    log.info("client disconnected before its request body arrived whole on %s", request.url.path)
    return JSON({"error": {"code": "client_closed_request", "message": "client disconnected"}},
                status_code=CLIENT_CLOSED)


async def _internal(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return JSON({"error": {"code": "internal", "message": "internal error"}}, status_code=500)


def factory() -> Starlette:
    """Entry point for ``uvicorn --factory gateway.app:factory``."""
    settings = Settings.load()
    logs.configure(settings.log_level)
    return create_app(settings)
