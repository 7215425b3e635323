"""The served API against its own description, by a fuzzer (issue 10).

schemathesis (pinned in pyproject.toml) reads ``/openapi.yaml`` from a running node (real
redis-server, the suite's broker, uvicorn) and sends every operation generated requests, valid
and invalid, in open mode and with API keys on. The run fails on any 5xx; on any response whose
status, content type, headers or body the spec does not allow; on any request the spec forbids
that the server accepts; on a schema-valid request refused by an operation that has no reason
to refuse one (the registry's); and, with keys on, on an operation that answers without a key.
Deterministic (no random seed), so CI sees the same cases every time. A schemathesis run in the
issue found drifts both ways (fixed, with tests in test_strict_input.py); this keeps them from
coming back. All traffic is on loopback, and every process started here is stopped here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ..support import TLS, Node, bootstrap_admin_key, start_node, unique

#: Cases per operation and phase: ~2,300 requests per run, ~20 s on a busy 2-core machine.
EXAMPLES = 25
#: The node's long-poll bound: a generated wait_ms on an empty queue must not hold the run for
#: 30 s. Larger values are refused with 400 invalid_wait_ms, which the spec documents.
MAX_WAIT_MS = 100

#: schemathesis.toml; ``{ignored_auth}`` is filled in per run.
CONFIG = """
[checks]
enabled = true  # every check, but:
# resources made by one call and used by another, and per-object authorization: this API has
# no such resources (and auth has its own tests)
use_after_free.enabled = false
ensure_resource_availability.enabled = false
object_level_authorization.enabled = false
# with auth off the operations that declare a key answer without one, as the spec says
ignored_auth.enabled = {ignored_auth}
# A schema-valid request may be refused for what no schema can say: a requestId is an opaque
# signed token ("0" is a valid string, not a valid batch), the registry and API keys decide
# who may consume or produce, a topic must exist, and the node's max_wait_ms is below the
# spec's bound. Such refusals are still checked against the spec (status, schema, content
# type); the operations below have no such reason, and must take every schema-valid request.
positive_data_acceptance.enabled = false

[checks.negative_data_rejection]
# 413 is how the API refuses a request over one of its count limits (too_many_messages,
# too_many_headers: documented in openapi.yaml); schemathesis' default list lacks it.
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]

[[operations]]
include-operation-id = ["registerConsumer", "getConsumer", "listConsumers", "unregisterConsumer",
                        "pauseConsumer", "resumeConsumer", "registerProducer", "listProducers",
                        "listApiKeys", "backlog", "alerts", "evaluateAlerts", "health", "openapi"]
checks.positive_data_acceptance.enabled = true

# Three in four of the generated body fields below take a value that works, so that requests
# get past the topic, consumer and producer checks to the broker and the Lua scripts, and their
# answers (records, batches, acks) are checked too; negative cases never get them. Bodies only:
# a binding of a query or path parameter whose schema is a $ref crashes schemathesis 4.32.5's
# schema analysis (and GET /message shares its code with POST /message).
[parameters]
"body.topic" = {{ dictionary = "topics", probability = 0.75 }}
"body.consumer" = {{ dictionary = "consumers", probability = 0.75 }}
"body.producer" = {{ dictionary = "producers", probability = 0.75 }}
"body.wait_ms" = {{ dictionary = "waits", probability = 0.75 }}
"body.requestId" = {{ dictionary = "request_ids", probability = 0.75 }}
"body.clientId" = {{ dictionary = "cluster_mode", probability = 0.75 }}

[dictionaries.waits]
values = [0]

[dictionaries.cluster_mode]
values = [""]
"""


def batches(node: Node, topic: str, consumer: str, producer: str, headers: dict[str, str]) -> list[str]:
    """Records in ``topic`` and two batches of them fetched as ``consumer``: their requestIds
    are handed to the fuzzer, so that its acks, unlocks and piggy-backed acks get past the
    requestId check (and "" is there for "no piggy-backed ack")."""
    with httpx.Client(base_url=node.url, headers=headers, timeout=30, verify=TLS) as http:
        records = [{"value": str(i), "partition": i % 2} for i in range(8)]
        r = http.post("/produce", json={"topic": topic, "producer": producer, "messages": records})
        assert r.status_code == 200 and r.json()["failed"] == 0, r.text
        ids = [""]
        for _ in range(2):
            r = http.get("/message", params={"consumer": consumer, "topic": topic, "max": 2})
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            ids.append(r.json()["requestId"])
    return ids


def fuzz(node: Node, tmp: Path, topic: str, consumer: str, producer: str,
         key: str | None = None) -> Counter[str]:
    """Run schemathesis against ``node`` (with API ``key``, if given); returns how often each
    ``METHOD path status`` was answered (from the node's access log), for the caller to see that
    the data path was reached."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    names = {"topics": [topic], "consumers": [consumer], "producers": [producer],
             "request_ids": batches(node, topic, consumer, producer, headers)}
    config = CONFIG.format(ignored_auth=json.dumps(key is not None))
    if key:
        # as the spec's bearer scheme, not a plain header, so that the ignored_auth check can
        # leave it out and see the 401; read from the environment, not written down
        config += '\n[auth.openapi.bearerAuth]\nbearer = "${MQGW_FUZZ_KEY}"\n'
    config += "".join(f"\n[dictionaries.{k}]\nvalues = {json.dumps(v)}\n" for k, v in names.items())
    path = tmp / "schemathesis.toml"
    path.write_text(config)
    cmd = [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(path), "run",
           f"{node.url}/openapi.yaml", "--url", node.url, "--max-examples", str(EXAMPLES),
           "--generation-deterministic", "--no-color", "--request-timeout", "10", "--max-failures", "50",
           "--workers", "1",
           # Creating topics is left to test_topics.py's table of good and bad bodies: here every
           # schema-valid body would make a topic of up to 10,000 partitions on the broker the
           # whole session shares, and listing them (GET /admin/topics) outlasted the request
           # timeout (a listing asks every partition's end offsets).
           "--exclude-operation-id", "createTopic"]
    # the timeout kills the child before raising; cwd keeps its files in the test's directory
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp,
                         env={**os.environ, "MQGW_FUZZ_KEY": key or ""})
    report = out.stdout + out.stderr
    assert out.returncode == 0, report[-20_000:]
    assert " passed" in report and "Server error" not in report, report[-5000:]
    log = node.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-5000:]
    return Counter(re.findall(r'"msg":"([A-Z]+ /(?:produce|message|ack|unlock) \d{3})"', log))


def reached_the_data_path(answered: Counter[str]) -> None:
    """Records were produced, batches fetched, and acks or unlocks got past the requestId check
    (more than the one produce and two fetches of :func:`batches`)."""
    assert answered["POST /produce 200"] > 1, answered
    assert answered["GET /message 200"] + answered["POST /message 200"] > 2, answered
    assert sum(n for k, n in answered.items() if re.fullmatch(r"POST /(ack|unlock) (200|404|409)", k)) > 0, \
        answered


@pytest.mark.slow
def test_fuzz_open_mode(redis_url: str, bootstrap: str, make_topic: Callable[..., str],
                        tmp_path: Path) -> None:
    topic = make_topic(2)
    node = start_node(redis_url, bootstrap, tmp_path, workers=1, max_wait_ms=MAX_WAIT_MS,
                      start_position="earliest", access_log_sample=1)  # fuzz() reads every line
    try:
        answered = fuzz(node, tmp_path, topic, unique("fuzz"), unique("fuzz"))
    finally:
        node.stop()
    reached_the_data_path(answered)


@pytest.mark.slow
def test_fuzz_with_api_keys(redis_url: str, bootstrap: str, make_topic: Callable[..., str],
                            tmp_path: Path) -> None:
    topic, consumer, producer = make_topic(2), unique("fuzz"), unique("fuzz")
    node = start_node(redis_url, bootstrap, tmp_path, workers=1, auth="true", open_mode="false",
                      max_wait_ms=MAX_WAIT_MS, access_log_sample=1)  # fuzz() reads every line
    try:
        admin = {"authorization": f"Bearer {bootstrap_admin_key(redis_url)}"}
        with httpx.Client(base_url=node.url, headers=admin, timeout=30, verify=TLS) as http:
            for path, body in ((f"/admin/consumers/{consumer}", {"topics": [topic], "start": "earliest"}),
                               (f"/admin/producers/{producer}", {"topics": [topic]})):
                assert http.put(path, json=body).status_code == 201
            # the fuzzer's key may do everything: admin, and consume and produce as those names
            r = http.post("/admin/keys", json={"name": "fuzz", "admin": True, "consumers": [consumer],
                                               "producers": [producer]})
            assert r.status_code == 201, r.text
        answered = fuzz(node, tmp_path, topic, consumer, producer, r.json()["key"])
    finally:
        node.stop()
    reached_the_data_path(answered)
