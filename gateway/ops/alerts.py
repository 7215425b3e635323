"""Backlog alerts: per-consumer thresholds on the backlog (messages) and on the age of the
oldest unconsumed record, evaluated by one node at a time, with state kept in Redis.

Every node runs an :class:`AlertMonitor`. Once per ``alert_interval_ms`` one of them wins a
lease (``SET NX PX``) and evaluates every consumer under an evaluation lock; the new state is
written only if that lock is still held (one Lua call), and only the node that wrote a
transition posts its webhook, so two nodes never report the same transition. Thresholds are
the config hash fields ``alert_backlog`` and ``alert_age_ms``
(``PATCH /admin/consumers/{c} {"alerts": {...}}``).

The keys (``P:{alerts}:state|gauges|evaluated|lease|lock``) are in the store's layout table
(``gateway/store/keys.py``); their reads and writes, and the two scripts, are
``gateway/store/alerts.py``.

Webhooks are sent at most once: a node that dies between writing a transition and posting
it loses that post (the state in the admin API and the metrics is still right).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from ..aio import stop_task
from ..broker import Broker
from ..config import Settings, node_id
from ..core.errors import Busy
from ..core.registry import Registry
from ..core.relay import RELAY_CONSUMER
from ..core.wheel import Wheel, parse_levels
from ..store import AlertKey, OffsetStore, now_ms
from . import backlog
from .wheel_lag import wheel_lag

if TYPE_CHECKING:
    import httpx  # imported when the first webhook is sent

log = logging.getLogger("mqgw.alerts")

WEBHOOK_TIMEOUT_S = 5.0
WEBHOOK_RETRIES = 3
WEBHOOK_BACKOFF_S = 0.5  # doubled after every failed attempt
#: How long evaluate_now() waits for an evaluation running elsewhere.
LOCK_WAIT_S = 30.0

def _age_threshold(cfg: dict[str, str]) -> bool:
    return "oldestAgeMs" in backlog.thresholds(cfg)


#: Unregistered consumers get backlog series while they fetched within this long, at most
#: this many of them (the most recent).
METRIC_SEEN_MS = 15 * 60 * 1000
METRIC_SEEN_MAX = 100


class AlertMonitor:
    """One per process. ``settings``, ``store``, ``broker`` and ``registry`` are what
    :func:`backlog.collect` reads (it is handed the monitor)."""

    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 registry: Registry) -> None:
        self.settings = settings
        self.store = store  # its .alerts: the lease, lock and state in Redis
        self.broker = broker
        self.registry = registry
        self.interval_ms = settings.alert_interval_ms
        self.webhook_url = settings.alert_webhook_url
        self.node_id = f"{node_id()}:{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._http: httpx.AsyncClient | None = None  # made on the first webhook
        #: The delay levels, whose lateness is the relay consumer's alert (ops/wheel_lag.py).
        self.wheel = Wheel(parse_levels(settings.delay_levels), settings.delay_topic_prefix)

    def key(self, what: AlertKey) -> str:
        return self.store.alerts.key(what)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        global _current
        _current = self
        _register_metrics_hook()
        if self.interval_ms > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqgw-alerts")

    async def stop(self) -> None:
        global _current
        if _current is self:
            _current = None
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
            try:  # let another node evaluate without waiting out our lease
                await self.store.alerts.release("lease", self.node_id)
            except Exception as e:  # noqa: BLE001 - best effort at shutdown
                log.info("could not release the alert lease: %r", e)
        if self._sender is not None:
            try:  # give pending webhooks a moment, then drop them
                await asyncio.wait_for(self._outbox.join(), 2.0)
            except TimeoutError:
                log.warning("dropping %d unsent alert webhook(s) at shutdown", self._outbox.qsize())
            await stop_task(self._sender)
            self._sender = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _run(self) -> None:
        # Ticks are shorter than the interval so an expired lease is taken soon by some node;
        # the lease still allows one evaluation per interval across all nodes.
        tick = max(0.05, self.interval_ms / 4000)
        while True:
            try:
                if await self.store.alerts.take("lease", self.node_id, self.interval_ms):
                    await self._locked(wait_s=0)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the loop must outlive any failure
                log.warning("backlog alert evaluation failed: %r", e)
            await asyncio.sleep(tick)

    async def evaluate_now(self) -> None:
        """Evaluate at once (whatever the lease), after any evaluation running on another node."""
        if not await self._locked(wait_s=LOCK_WAIT_S):
            raise Busy("busy", "another alert evaluation is still running")

    async def _locked(self, wait_s: float) -> bool:
        token = uuid.uuid4().hex
        ttl = max(30_000, 3 * self.interval_ms)
        deadline = time.monotonic() + wait_s
        while not await self.store.alerts.take("lock", token, ttl):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        try:
            await self._evaluate(token)
        finally:
            await self.store.alerts.release("lock", token)
        return True

    # -- evaluation ----------------------------------------------------------------------------
    async def _metric_consumers(self, now: int, states: dict[str, dict[str, Any]]) -> set[str]:
        """Who gets backlog gauges (series in /metrics): registered consumers, those with alert
        thresholds, and the METRIC_SEEN_MAX most recent unregistered ones seen within
        METRIC_SEEN_MS. In open mode any client can invent names: one fuzzing run left 1,151
        series behind, each scraped forever."""
        registered, seen = await self.registry.seen_consumers()
        recent = sorted((t, n) for n, t in seen.items() if t >= now - METRIC_SEEN_MS)
        return registered | set(states) | {n for _, n in recent[-METRIC_SEEN_MAX:]}

    async def _evaluate(self, token: str) -> None:
        started = time.monotonic()
        consumers = await backlog.collect(self, with_age=_age_threshold)
        consumers = [c for c in consumers if c["consumer"] != RELAY_CONSUMER]
        if self.settings.delay_overdue_alert_ms > 0 and (wheel := await self._wheel()):
            consumers.append(wheel)
        now = now_ms()
        previous = await self.store.alerts.states()
        states: dict[str, dict[str, Any]] = {}
        events: list[dict[str, Any]] = []
        for c in consumers:
            limits = c["alerts"]
            if not limits:
                continue  # no thresholds (any more): not kept, resolved below if it was firing
            name = c["consumer"]
            old = previous.pop(name, None)
            was_firing = bool(old and old["state"] == "firing")
            reasons = _reasons(c, limits, old if was_firing else None)
            firing = bool(reasons)
            state = {
                "consumer": name, "state": "firing" if firing else "ok",
                "since": old["since"] if old and was_firing == firing else now,
                "reasons": reasons, "totalBacklog": c["totalBacklog"], "oldestAgeMs": c["oldestAgeMs"],
                "thresholds": limits, "evaluatedMs": now,
            }
            states[name] = state
            if firing and not was_firing:
                events.append(_event(state, "firing", reasons))
            elif was_firing and not firing and old is not None:
                events.append(_event(state, "resolved", old["reasons"]))
        for old in previous.values():  # unregistered, or its thresholds were removed
            if old["state"] == "firing":
                events.append(_event({**old, "since": now}, "resolved", old["reasons"]))
        shown = await self._metric_consumers(now, states)
        gauges = {c["consumer"]: {"totalBacklog": c["totalBacklog"], "oldestAgeMs": c["oldestAgeMs"]}
                  for c in consumers if c["consumer"] in shown}
        if not await self.store.alerts.commit(token, now, states, gauges):
            log.warning("backlog alert evaluation outlived its lock; results dropped")
            return
        took_ms = round(1000 * (time.monotonic() - started))
        log.debug("backlog alerts evaluated",
                  extra={"consumers": len(consumers), "alerts": len(states), "duration_ms": took_ms})
        for e in events:
            log.warning("backlog alert %s for consumer %s: %s", e["event"], e["consumer"],
                        ",".join(e["reasons"]))
            self._post_later(e)

    async def _wheel(self) -> dict[str, Any] | None:
        """The delay wheel as the relay consumer's built-in alert: it fires when a record in the
        level topics is ``delay_overdue_alert_ms`` past the time a relay should have moved it
        (no relay running, or every relay stalled); ``oldestAgeMs`` is that lateness. None
        while no level topic exists."""
        lag = await wheel_lag(self, self.wheel)
        if not lag.levels:
            return None
        return {"consumer": RELAY_CONSUMER, "alerts": {"overdueMs": self.settings.delay_overdue_alert_ms},
                "totalBacklog": lag.waiting, "oldestAgeMs": lag.overdue_ms}

    # -- views and metrics -----------------------------------------------------------------------
    async def view(self, include_all: bool = False) -> dict[str, Any]:
        raw, evaluated = await self.store.alerts.view()
        states = sorted(raw.values(), key=lambda s: s["consumer"])
        out: dict[str, Any] = {"alerts": [s for s in states if s["state"] == "firing"],
                               "evaluatedMs": evaluated}
        if include_all:
            out["all"] = states
        return out

    async def collect_metrics(self) -> list[Metric]:
        gauges, states = await self.store.alerts.gauges_and_states()
        size = GaugeMetricFamily("mqgw_consumer_backlog",
                                 "Records not yet committed (broadcast: slowest clientId), "
                                 "as of the last alert evaluation", labels=["consumer"])
        age = GaugeMetricFamily("mqgw_consumer_oldest_age_seconds",
                                "Age of the oldest unconsumed record (consumers with an age "
                                "threshold), as of the last alert evaluation", labels=["consumer"])
        firing = GaugeMetricFamily("mqgw_backlog_alert",
                                   "1 while the consumer's backlog alert fires, else 0",
                                   labels=["consumer"])
        for consumer, g in sorted(gauges.items()):
            size.add_metric([consumer], g["totalBacklog"])
            if g["oldestAgeMs"] is not None:
                age.add_metric([consumer], g["oldestAgeMs"] / 1000)
        for consumer, st in sorted(states.items()):
            firing.add_metric([consumer], 1 if st["state"] == "firing" else 0)
        return [size, age, firing]

    # -- webhook -------------------------------------------------------------------------------
    def _post_later(self, payload: dict[str, Any]) -> None:
        """Queue a webhook; one sender per process keeps them in order."""
        if not self.webhook_url:
            return
        self._outbox.put_nowait(payload)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_loop(), name="mqgw-alert-webhook")

    async def _send_loop(self) -> None:
        while True:
            payload = await self._outbox.get()
            try:
                await self._post(payload)
            except Exception as e:  # noqa: BLE001 - never let one payload stop the sender
                log.error("alert webhook for %s failed: %r", payload.get("consumer"), e)
            finally:
                self._outbox.task_done()

    async def _post(self, payload: dict[str, Any]) -> None:
        import httpx  # only needed when a webhook is configured

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S)
        body = orjson.dumps(payload)
        for attempt in range(WEBHOOK_RETRIES + 1):
            try:
                r = await self._http.post(self.webhook_url, content=body,
                                          headers={"content-type": "application/json"})
                if r.is_success:
                    return
                problem = f"HTTP {r.status_code}"
                if r.status_code < 500 and r.status_code not in (408, 429):
                    break  # the receiver refuses it: retrying will not help
            except httpx.HTTPError as e:
                problem = repr(e)
            if attempt < WEBHOOK_RETRIES:
                log.warning("alert webhook attempt %d failed (%s); retrying", attempt + 1, problem)
                await asyncio.sleep(WEBHOOK_BACKOFF_S * 2 ** attempt)
        log.error("alert webhook %s for consumer %s not delivered: %s", payload["event"],
                  payload["consumer"], problem)


def _reasons(c: dict[str, Any], limits: dict[str, int], firing: dict[str, Any] | None) -> list[str]:
    reasons = []
    if "backlogMessages" in limits and c["totalBacklog"] >= limits["backlogMessages"]:
        reasons.append("backlog")
    for limit, reason in (("oldestAgeMs", "age"), ("overdueMs", "overdue")):
        if limit not in limits:
            continue
        age = c["oldestAgeMs"]
        if age is None:  # the broker could not tell: keep what we had, do not flap
            if firing and reason in firing["reasons"]:
                reasons.append(reason)
        elif age >= limits[limit]:
            reasons.append(reason)
    return reasons


def _event(state: dict[str, Any], event: str, reasons: list[str]) -> dict[str, Any]:
    """The webhook body; for ``resolved``, ``reasons`` are the ones that had been firing."""
    return {"event": event, "consumer": state["consumer"], "reasons": reasons,
            "totalBacklog": state["totalBacklog"], "oldestAgeMs": state["oldestAgeMs"],
            "thresholds": state["thresholds"], "since": state["since"], "gateway": "mq-gateway"}


# -- Prometheus scrape hook: one per process, reading through the running monitor ---------------
_current: AlertMonitor | None = None
_hooked = False


async def collect_metrics() -> list[Metric]:
    """``mqgw_consumer_backlog``, ``mqgw_consumer_oldest_age_seconds`` and ``mqgw_backlog_alert``
    from the Redis state (the same on every node and worker, so never summed)."""
    return await _current.collect_metrics() if _current is not None else []


def _register_metrics_hook() -> None:
    global _hooked
    if _hooked:
        return
    from . import metrics

    metrics.add_collector_hook(collect_metrics)
    _hooked = True
