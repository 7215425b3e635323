"""librdkafka's log lines join the node's JSON log (gateway/broker/kafka/clientlog.py).

Before, a node whose broker was down wrote librdkafka's own lines to stderr, one per client
(``%3|1713881891.083|FAIL|rdkafka#producer-1| [thrd:…]: … Connection refused``), between the
JSON lines that log shippers parse.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from gateway.cli import devstack

from ..support import start_node

RAW = re.compile(r"^%\d\|")  # librdkafka's default log line: %<syslog level>|<time>|<facility>|


def _lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if line.strip()]


def _kafka_records(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in _lines(log):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("logger") == "mqgw.kafka":
            out.append(rec)
    return out


def test_a_node_without_its_broker_logs_librdkafka_as_json(redis_url: str, tmp_path: Path) -> None:
    port = devstack.free_port()  # nothing listens there: every client's connect is refused
    node = start_node(redis_url, f"127.0.0.1:{port}", tmp_path)
    try:
        deadline = time.monotonic() + 60  # a bound, not a timing: the first refusal comes at once
        clients: set[str] = set()
        # Both producers (polled all the time), the admin client (a producer to librdkafka: its
        # lines come from the adapter polling it for them alone) and the metadata consumer.
        while time.monotonic() < deadline and not _all_clients(clients):
            clients = {r.get("client", "") for r in _kafka_records(node.log) if str(port) in r["msg"]}
            time.sleep(0.2)
    finally:
        node.stop()
    records = _kafka_records(node.log)
    assert any(str(port) in r["msg"] and r["level"] in ("ERROR", "WARNING") for r in records), records
    assert all({"facility", "client", "ts"} <= set(r) for r in records), records
    raw = [line for line in _lines(node.log) if RAW.match(line)]
    assert not raw, raw[:5]
    assert _all_clients(clients), clients


def _all_clients(names: set[str]) -> bool:
    """Names librdkafka gives its clients: ``rdkafka#producer-1``, ``rdkafka#consumer-4``."""
    return (len({n for n in names if "#producer-" in n}) >= 3
            and any("#consumer-" in n for n in names))
