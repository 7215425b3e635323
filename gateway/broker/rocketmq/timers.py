"""RocketMQ 5's timer messages: what the brokers allow, and recall (cancel).

A record with ``TIMER_DELIVER_MS`` is held by the broker until then: never early (measured in
~190 samples), late by up to one ``timerPrecisionMs``. The brokers are asked for their settings
at start (GET_BROKER_CONFIG): timers may be off (``timerWheelEnable``), longer delays than
``timerMaxDelaySec`` are refused (3 days by default), and recall, the cancel, is off unless
``recallMessageEnable`` (5.3.2+; off by default). The gateway holds delays itself (its wheel)
where the brokers cannot: beyond the limit, and, so that every delayed record can be cancelled,
on brokers without recall.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..base import BrokerUnavailable
from .client import Client
from .codes import Req, Resp


@dataclass(frozen=True, slots=True)
class TimerSettings:
    enabled: bool = False
    max_delay_ms: int = 0
    precision_ms: int = 1000
    recall: bool = False


def parse_config(body: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in body.decode(errors="replace").splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


async def read_settings(client: Client) -> TimerSettings:
    """The settings every master shares (the smallest limit, timers and recall only if all
    have them); timers off when no master answers."""
    masters = await client.masters()
    if not masters:
        return TimerSettings()

    async def one(addr: str) -> dict[str, str]:
        resp = await client.call(addr, Req.GET_BROKER_CONFIG)
        return parse_config(resp.body) if resp.code == Resp.SUCCESS else {}
    configs = await asyncio.gather(*(one(a) for a in masters.values()))
    return TimerSettings(
        enabled=all(c.get("timerWheelEnable", "true") == "true" for c in configs),
        max_delay_ms=min(int(c.get("timerMaxDelaySec", "259200")) for c in configs) * 1000,
        precision_ms=max(int(c.get("timerPrecisionMs", "1000")) for c in configs),
        recall=all(c.get("recallMessageEnable", "false") == "true" for c in configs))


class RecallRefused(Exception):
    """The broker would not recall the record: due already, or recall is off."""

    def __init__(self, too_late: bool, message: str) -> None:
        super().__init__(message)
        self.too_late = too_late


async def recall(client: Client, producer_group: str, topic: str, handle: str) -> None:
    """RECALL_MESSAGE: the broker puts a delete mark in the record's timer slot. The handle names
    the broker (``v1 <topic> <broker> <due> <id>``, base64url), so any master is asked via the
    name servers' view of that broker."""
    import base64

    try:
        parts = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode().split(" ")
        broker = parts[2]
    except (ValueError, IndexError):
        raise RecallRefused(False, "malformed recall handle") from None
    addr = (await client.masters()).get(broker)
    if addr is None:
        raise BrokerUnavailable(f"broker {broker} has no master now")
    resp = await client.call(addr, Req.RECALL_MESSAGE, {
        "producerGroup": producer_group, "topic": parts[1], "recallHandle": handle})
    if resp.code == Resp.SUCCESS:
        return
    if resp.code == Resp.ILLEGAL_OPERATION:
        raise RecallRefused(True, resp.remark or "the record is due already")
    if resp.code == Resp.NO_PERMISSION:
        raise RecallRefused(False, "recall is switched off on the broker (recallMessageEnable)")
    raise BrokerUnavailable(f"recall: RocketMQ answered {resp.code} {resp.remark or ''}")
