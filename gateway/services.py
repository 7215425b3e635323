"""The services of one process, built and closed in one place.

A gateway worker (``gateway.api.app``) and ``mqgw relay`` (``gateway.cli.main``) run the same
objects over one Redis client and one broker adapter: :func:`open_services` builds them, starts
their background tasks in dependency order and returns them as one typed :class:`Services`;
:func:`close_services` stops everything in the reverse order. Built once per process; requests
build nothing.

A Redis client or a broker handed in (``redis=``, ``broker=``: tests on fakeredis and the
in-memory broker) stays the caller's: it is neither started nor closed here.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from . import broker as brokers
from .aio import stop_task
from .broker import Broker
from .config import Settings, hmac_key_problem, hmac_key_refusal, node_id
from .core.auth import Authorizer, KeyStore
from .core.checkpoint import Checkpoints
from .core.consume import ConsumeService
from .core.deadletters import CURSOR_CONSUMER, DeadLetters
from .core.delay import DelayService
from .core.instances import InstanceService
from .core.nack import NackService
from .core.names import InternalTopics
from .core.produce import ProduceGate
from .core.registry import Registry
from .core.registry_copy import RegistryCopy
from .core.relay import RELAY_CONSUMER, Relay
from .core.requestid import RequestIdCodec
from .core.schemas import SchemaService
from .core.spans import Spans
from .core.topics import TopicService
from .core.watermarks import Watermarks
from .ops import metrics
from .ops.alerts import AlertMonitor
from .schemas import RegistryClient
from .store import OffsetStore, Redis

log = logging.getLogger("mqgw")


@dataclass(eq=False)
class Services:
    """Everything a request or the relay uses, wired to one store and one broker."""

    settings: Settings
    store: OffsetStore
    broker: Broker
    watermarks: Watermarks
    consume: ConsumeService
    registry: Registry
    keys: KeyStore
    auth: Authorizer
    checkpoints: Checkpoints
    produce_gate: ProduceGate
    delay: DelayService
    nack: NackService
    dead_letters: DeadLetters
    topics: TopicService
    registry_copy: RegistryCopy
    #: Backlog alerts (``/admin/alerts``); evaluated only in a serving process.
    alerts: AlertMonitor
    #: REST v2 consumer instances (``/consumers/{group}/instances/...``).
    instances: InstanceService
    #: The user's Schema Registry (REST v2's avro, protobuf and jsonschema); None: not set.
    schemas: SchemaService | None = None
    #: OpenTelemetry spans (``otel_tracing``; no-ops when off).
    spans: Spans = field(default_factory=lambda: Spans(False))
    #: None: this process does not relay (``relay = false``, or the broker delays natively).
    relay: Relay | None = None
    #: Topics nobody may name through the API: the gateway's own and the broker's.
    internal: InternalTopics = field(default_factory=InternalTopics)
    #: What :func:`close_services` undoes, last opened first.
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack, repr=False)


async def open_services(settings: Settings, *, broker: Broker | None = None,
                        redis: Redis | None = None, serve: bool = True) -> Services:
    """Build the services and start their background work.

    ``serve``: a gateway worker. It refuses an HMAC key it must not run with, restores a lost
    registry before it serves, follows registry changes, evaluates alerts, copies offsets to the
    broker, and relays delayed records if ``relay`` is on. Without it (``mqgw relay``) only the
    relay runs, whatever ``relay`` says (the HTTP nodes beside it run with ``relay = false``).

    On failure what was started is stopped again before the error propagates."""
    if serve:
        refusal = hmac_key_refusal(settings)  # `mqgw serve` checked it already; other servers
        if refusal is not None:
            raise RuntimeError(refusal)
        if not settings.dev:  # mqgw dev's banner says it once
            _warn_open(settings)
    stack = AsyncExitStack()
    try:
        return await _open(settings, stack, broker, redis, serve)
    except BaseException:
        await stack.aclose()
        raise


async def close_services(services: Services) -> None:
    """Stop the background work, then close the clients this module opened."""
    await services._stack.aclose()


async def _open(settings: Settings, stack: AsyncExitStack, given_broker: Broker | None,
                redis: Redis | None, serve: bool) -> Services:
    if given_broker is None:
        b = brokers.create(settings)
        await b.start()
        stack.push_async_callback(b.close)
    else:
        b = given_broker
    if redis is None:
        store = OffsetStore.connect(settings.redis_url, settings.key_prefix,
                                    settings.redis_max_connections,
                                    settings.redis_pool_timeout_ms / 1000)
        stack.push_async_callback(store.aclose)
    else:
        store = OffsetStore(redis, settings.key_prefix)

    wm = Watermarks(store, b, settings.metadata_refresh_ms)
    keys = KeyStore(store)
    auth = Authorizer(settings.auth, keys)
    checkpoints = Checkpoints(settings, store, b, on_restore=metrics.offsets_restored)
    copy = RegistryCopy(settings, store, b)
    store.registry.journal = copy.wrote
    consume = ConsumeService(settings, store, b, wm, RequestIdCodec(settings.hmac_key), auth,
                             on_ack=lambda r: metrics.acked(r.result.value),
                             checkpoints=checkpoints, registry_copy=copy)
    internal = InternalTopics.of(settings, b.owns_topic)
    registry = Registry(store, settings, checkpoints, internal)
    gate = ProduceGate(store, settings.open_mode, internal=internal)
    delay = DelayService(settings, store, b)
    stack.push_async_callback(delay.close)
    schemas = SchemaService(RegistryClient(
        settings.schema_registry_url, settings.schema_registry_user_info,
        settings.schema_registry_timeout_ms)) if settings.schema_registry_url else None
    if schemas is not None:
        stack.push_async_callback(schemas.close)
    spans = Spans(settings.otel_tracing, b.name)
    relay = Relay(settings, store, b, wm, delay, metrics.delay_moved, checkpoints, spans) \
        if settings.relay or not serve else None
    s = Services(settings, store, b, wm, consume, registry, keys, auth, checkpoints, gate, delay,
                 NackService(settings, store, b, consume, delay),
                 DeadLetters(settings, store, b, wm, checkpoints), TopicService(settings, b, wm),
                 copy, AlertMonitor(settings, store, b, registry),
                 InstanceService(settings, store, consume, auth, registry, checkpoints,
                                 schemas),
                 schemas, spans, relay, internal, stack)

    if serve:
        await copy.start()  # a Redis that lost the registry gets it back before this serves
        stack.push_async_callback(copy.stop)
    if relay is not None:
        delay.poke = relay.poke
        await delay.start()  # its level topics exist before this serves (see there)
        relay.start()
        stack.push_async_callback(relay.stop)
    if serve:
        listener = asyncio.create_task(gate.listen(f"{node_id()}:{uuid.uuid4().hex[:8]}"),
                                       name="mqgw-registry-changes")
        stack.push_async_callback(stop_task, listener)
        s.alerts.start()
        stack.push_async_callback(s.alerts.stop)

        async def names() -> set[str]:
            registered, seen = await registry.consumer_names()
            return registered | seen | {RELAY_CONSUMER, CURSOR_CONSUMER}  # the gateway's own too
        checkpoints.start(names)
        stack.push_async_callback(checkpoints.stop)
        stack.callback(metrics.shutdown)  # first at close: the worker's live gauges go
    return s


def _warn_open(settings: Settings) -> None:
    """Log what leaves a serving node open to anyone who reaches it."""
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
