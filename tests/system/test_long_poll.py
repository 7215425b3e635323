"""An idle long poll costs a small, bounded number of Redis calls (counted with MONITOR)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ..support import Monitor, sha, unique


@pytest.mark.slow  # ten 30 s long polls
@pytest.mark.timeout(120)
def test_idle_30s_long_polls_cost_few_redis_calls(node_factory, make_topic, redis_url: str) -> None:
    # Its own key prefix, no alert monitor and no offset checkpoints: the session's other nodes
    # share this Redis, and those two background rounds read every consumer every few seconds
    # (they are not what a poll costs), so only this node's poll commands are counted below.
    # The registry copy's once-a-second marker check is counted apart.
    prefix = unique("lp")
    node = node_factory(metadata_refresh_ms=500, alert_interval_ms=0, checkpoint_interval_ms=0,
                        key_prefix=prefix)
    topic = make_topic(6)
    groups = [unique() for _ in range(10)]
    with httpx.Client(timeout=60) as http:
        for g in groups:  # register every consumer at the latest offset
            r = http.get(node.url + "/message", params={"consumer": g, "topic": topic})
            assert r.json()["status"] == "empty"
        with Monitor(redis_url) as mon:
            start = time.monotonic()

            def poll(g: str) -> dict:
                return httpx.get(node.url + "/message", timeout=60,
                                 params={"consumer": g, "topic": topic, "wait_ms": 30_000}).json()
            with ThreadPoolExecutor(len(groups)) as ex:
                results = list(ex.map(poll, groups))
            took = time.monotonic() - start
    assert all(r["status"] == "empty" for r in results)
    # each poll waited its full 30 s; the ceiling only catches one that hangs on (10 s of room
    # for a loaded machine), and the counts below are bounded per interval of `took`
    assert 29.5 < took < 40, took
    chooses = mon.count("choose", prefix + ":")
    watermark_reads = mon.count("watermarks", f"{prefix}:{{wm:{topic}}}")
    # per waiting request: the first choose plus one re-check every 5 s
    assert chooses <= len(groups) * 8, chooses
    # watermark reads are shared by every waiter of the process: one per refresh interval
    assert watermark_reads <= 30_000 / 500 + 5, watermark_reads
    # nothing else but connection upkeep: handshakes for pooled connections and health-check PINGs.
    # This node's connections are those that touched its keys; count everything they sent.
    conns = {k for k, c in zip(mon.conns, mon.lines, strict=True) if prefix + ":" in c}
    mine = [c for k, c in zip(mon.conns, mon.lines, strict=True) if k in conns]
    # the registry copy's watch (core/registry_copy.py) looks for its marker once a second per
    # process, whatever the polls do: bounded by the time, not by the number of waiters
    marker = f"EXISTS {prefix}:{{reg}}:copied"
    watch = [c for c in mine if c == marker]
    assert len(watch) <= took / 1.0 + 5, len(watch)
    # and for registry copies left pending (by any node) every PENDING_EVERY s
    from gateway.core.registry_copy import PENDING_EVERY, WATCH_S

    pending = f"SRANDMEMBER {prefix}:{{reg}}:copy_pending"
    looks = [c for c in mine if c.startswith(pending)]
    assert len(looks) <= took / (PENDING_EVERY * WATCH_S) + 2, len(looks)
    others = [c for c in mine if not c.startswith("EVALSHA") and c != marker
              and not c.startswith(pending)]
    assert all(c.split()[0] in ("PING", "HELLO", "CLIENT", "SELECT") for c in others), others
    assert len(others) <= 2 * len(groups) + 2, others


class LuaMonitor(Monitor):
    """Also keep script-internal commands, to see lease takes (SET ... NX inside the script)."""

    def _run(self) -> None:
        with self.r.monitor() as m:
            self.ready.set()
            for cmd in m.listen():
                if self.marker in cmd["command"]:
                    return
                self.lines.append(cmd["command"])


@pytest.mark.slow  # three nodes kept busy for 3 s
@pytest.mark.timeout(120)
def test_watermark_refresh_is_leased_across_nodes(node_factory, make_topic, redis_url: str) -> None:
    """Three busy nodes list offsets at most once per refresh interval between them."""
    # Their own key prefix: the session's other nodes (their backlog monitors) would share the lease.
    prefix = unique("wl")
    nodes = [node_factory(metadata_refresh_ms=250, key_prefix=prefix) for _ in range(3)]
    topic = make_topic(4)
    lease_key = f"{prefix}:{{wm:{topic}}}:lease"
    with httpx.Client(timeout=30) as http:
        http.post(nodes[0].url + "/produce", json={"topic": topic, "value": "v"})
        with LuaMonitor(redis_url) as mon:
            start = time.monotonic()
            i = 0
            # 3 s and at least 100 requests, however slow a loaded machine is: the bounds below
            # are per refresh interval of the time it took
            while time.monotonic() - start < 3.0 or i <= 100:
                r = http.get(nodes[i % 3].url + "/message",
                             params={"consumer": unique(), "topic": topic})
                assert r.status_code == 200
                i += 1
            took = time.monotonic() - start
    leases = [c for c in mon.lines if c.startswith(f"SET {lease_key}")]
    writes = [c for c in mon.lines
              if c.startswith("EVALSHA " + sha("watermarks_put")) and f"{prefix}:" in c]
    assert i > 100 and took >= 3.0
    # one broker listing per interval cluster-wide, plus a partial interval at each edge of the window
    # and a cold start (a node with no copy anywhere lists without the lease)
    assert 1 <= len(writes) <= took / 0.25 + 3, (len(writes), took)
    # lease attempts ride on a script call each node makes anyway: at most one per node per interval
    assert len(leases) <= len(nodes) * (took / 0.25 + 2), (len(leases), took)
