"""Per consumer against per topic: who falls behind the production of the topics it reads.

Summing consumption over every reader of a topic and setting it beside the topic's production
("produced 3.13/s, consumed 4.20/s") reads as a shrinking backlog while one reader falls behind:
two readers of a 3/s topic at 2.1/s each sum to 4.2/s. So the report compares each consumer (or
broadcast clientId) with the production of the partitions it reads, and never sums consumption
across readers. Pure Python over the job's result rows (dicts), shared by the charts and the page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]


def who(r: Row, sep: str = " / ") -> str:
    """'consumer' or 'consumer / clientId'."""
    name: str = r["consumer"]
    return name + (f"{sep}{r['client_id']}" if r.get("client_id") else "")


def behind(r: Row) -> bool:
    """Its lag grows: ``drain_status`` ``never`` (:mod:`gateway.reports.lag`: a lag trend
    beyond noise, above the lag of one sample interval). Not "consumption < production": both
    rates carry the noise of where each sample caught the consumer, so one that keeps up reads
    at 99 % on some partitions and 101 % on others."""
    return r.get("drain_status") == "never"


def ratio(r: Row) -> float | None:
    """Consumption ÷ production (1.0 keeps up); None when nothing was produced or not measured."""
    c, p = r.get("consumption_rate"), r.get("production_rate")
    if c is None or not p:
        return None
    q: float = c / p
    return q


def ranked(consumers: Iterable[Row]) -> list[Row]:
    """Those falling behind first (most lag first), then the rest by lag: the order of the rates
    chart and table, so the first rows are the ones an operator has to act on."""
    return sorted(consumers, key=lambda r: (not behind(r), -(r.get("lag") or 0), r["consumer"],
                                            r.get("client_id") or ""))


def topics_by_reader(readers: Iterable[Row]) -> dict[tuple[str, str], list[str]]:
    """(consumer, client_id) -> the topics it reads, by name."""
    out: dict[tuple[str, str], list[str]] = {}
    for r in readers:
        out.setdefault((r["consumer"], r.get("client_id") or ""), []).append(topic_name(r))
    return {k: sorted(v) for k, v in out.items()}


def topic_name(r: Row) -> str:
    b = r.get("broker")
    return r["topic"] if b in (None, "", "kafka") else f"{b}:{r['topic']}"


def topics_text(names: Sequence[str], most: int = 1) -> str:
    """'orders', or 'orders +2' for a consumer of three topics."""
    if not names:
        return "—"
    return ", ".join(names[:most]) + (f" +{len(names) - most}" if len(names) > most else "")


def slowest_readers(readers: Iterable[Row]) -> dict[tuple[str, str], Row]:
    """(broker, topic) -> its reader with the lowest consumption ÷ production (ties: most lag)."""
    out: dict[tuple[str, str], Row] = {}
    for r in readers:
        k = (r["broker"], r["topic"])
        q = ratio(r)
        key = (q if q is not None else float("inf"), -(r.get("lag") or 0))
        cur = out.get(k)
        if cur is None:
            out[k] = r
            continue
        cq = ratio(cur)
        if key < (cq if cq is not None else float("inf"), -(cur.get("lag") or 0)):
            out[k] = r
    return out
