"""Gateway settings, read once per process from the environment and an optional TOML file.

Environment variables win over the TOML file (``MQGW_CONFIG``), which wins over
the defaults below. Everything here is per *process*; per *consumer* settings
(consume timeout, start position) live in Redis so every node sees them.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from dataclasses import dataclass, fields
from typing import Any

#: The default requestId signing key: public, so fit only for development (auth refuses it).
DEV_HMAC_KEY = "mqgw-dev-key-change-me"
#: Placeholder keys this repository has shipped in its deploy examples (deploy/, README.md).
PLACEHOLDER_HMAC_KEYS = frozenset({DEV_HMAC_KEY, "replace-with-output-of-openssl-rand-hex-32"})
#: A key containing one of these (in any case) was copied from an example, not generated.
PLACEHOLDER_HMAC_MARKERS = ("change-me", "changeme", "replace", "example", "placeholder")
#: Shorter keys are refused as typed by hand (`openssl rand -hex 32` gives 64 characters): 16
#: bytes are 128 bits, the size of the signature the key makes.
MIN_HMAC_KEY_BYTES = 16


def hmac_key_problem(key: str) -> str | None:
    """What makes ``key`` unfit to sign requestIds in production (one clause), or None.

    Obvious placeholders only: the public development key, the placeholders of the deploy
    examples, keys that say they are one, and keys too short to have been generated. A key
    that passes is not thereby random; generate it (``openssl rand -hex 32``).
    """
    if key == DEV_HMAC_KEY:
        return "MQGW_HMAC_KEY is the public default (the development key)"
    if key in PLACEHOLDER_HMAC_KEYS:
        return "MQGW_HMAC_KEY is the placeholder of the deploy examples"
    lowered = key.lower()
    for marker in PLACEHOLDER_HMAC_MARKERS:
        if marker in lowered:
            return f"MQGW_HMAC_KEY looks like a placeholder (it contains {marker!r})"
    size = len(key.encode())
    if size < MIN_HMAC_KEY_BYTES:
        return f"MQGW_HMAC_KEY is too short ({size} bytes, at least {MIN_HMAC_KEY_BYTES})"
    return None


def hmac_key_refusal(settings: Settings) -> str | None:
    """The one-line reason not to start with these settings' ``hmac_key``, or None to start.

    With auth on a placeholder key is refused: API keys guard nothing if anyone can sign a
    requestId that acks any offset range. With auth off anyone who reaches the port can do
    anything anyway, so such a key (the development key of ``make run`` and the tests) is only
    warned about (:func:`hmac_key_problem`). ``mqgw serve`` checks this before uvicorn starts;
    the app checks it again at start-up for servers started otherwise.
    """
    problem = hmac_key_problem(settings.hmac_key)
    if problem is None or not settings.auth:
        return None
    return (f"refusing to start: auth is on and {problem}; set MQGW_HMAC_KEY to a random secret "
            "shared by all nodes (openssl rand -hex 32)")


@dataclass(frozen=True, slots=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: The broker adapter: ``kafka``, ``rocketmq``, or ``memory`` (in-process, one worker; for
    #: tests).
    broker: str = "kafka"
    #: Topics of the ``memory`` broker, made at start: ``name:queues,name:queues``.
    memory_topics: str = ""
    kafka_bootstrap: str = "127.0.0.1:9092"
    #: Extra librdkafka settings (``KAFKA_CONFIG`` as ``k=v,k=v``), e.g. SASL/TLS.
    kafka_config: str = ""
    #: RocketMQ name servers (``host:port;host:port``), with ``broker = rocketmq``.
    rocketmq_namesrv: str = "127.0.0.1:9876"
    #: The consumer group every pull names (pulls carry their offset; the group's own offsets
    #: are unused). Created on first use where the brokers do not auto-create groups.
    rocketmq_reader_group: str = "mqgw_reader"
    #: The producer group sends and recalls name.
    rocketmq_producer_group: str = "mqgw_producer"
    #: Timeout of one call to a name server or broker.
    rocketmq_timeout_ms: int = 3000
    #: Delays go to the brokers' timers (5.x ``TIMER_DELIVER_MS``) where every master has timers
    #: and recall on, up to their ``timerMaxDelaySec``; longer delays, or all with false, go
    #: through the gateway's delay wheel.
    rocketmq_native_delay: bool = True
    #: HMAC key that signs requestIds. All nodes must share it.
    hmac_key: str = DEV_HMAC_KEY
    #: Redis key prefix, so several gateways can share one Redis.
    key_prefix: str = "mqgw"
    #: Default lock (consume) timeout for consumers that set none.
    consume_timeout_ms: int = 60_000
    #: Default first position of a new consumer: ``latest`` or ``earliest``.
    start_position: str = "latest"
    #: Broadcast clientIds idle for longer than this are forgotten.
    client_idle_ms: int = 7 * 24 * 3600 * 1000
    #: Cluster-mode committed offsets are copied to a Kafka consumer group this often (by one
    #: node at a time, only queues whose offset moved); a consumer whose offsets Redis lost
    #: resumes there. At most this much acknowledged work is redelivered after such a loss.
    #: 0 turns checkpoints (and the restore) off.
    checkpoint_interval_ms: int = 5000
    #: A consumer's topic whose queues are at least this many records ahead of their checkpoint
    #: is copied within a second instead of at the next interval (0: interval only). A Redis
    #: loss redelivers about a second of a busy consumer's work, not an interval's.
    checkpoint_busy_records: int = 1000
    #: The Kafka consumer group of consumer ``C`` is ``<prefix>C``.
    checkpoint_group_prefix: str = "mqgw."
    #: The compacted topic that holds the registry's durable copy (core/registry_copy.py),
    #: restored when Redis comes back empty. Empty: ``<key_prefix>.registry``; ``-``: no copy.
    registry_topic: str = ""
    #: Watermarks (ListOffsets) are refreshed at most this often per topic across all nodes.
    metadata_refresh_ms: int = 200
    #: Batch size default and hard cap for /message.
    default_max_messages: int = 32
    max_messages: int = 1000
    max_wait_ms: int = 30_000
    #: A REST v2 consumer instance nobody called for this long is forgotten (Confluent's
    #: ``consumer.instance.timeout.ms``); its batches not yet committed are redelivered when
    #: their locks run out.
    instance_timeout_ms: int = 300_000
    #: How long a REST v2 ``GET .../records`` waits for records when neither the request
    #: (``timeout``) nor the instance (``consumer.request.timeout.ms``) says (Confluent's 1000).
    instance_wait_ms: int = 1_000
    #: The user's Schema Registry, by Confluent's API (Confluent's, Karapace, Apicurio Registry's
    #: ``http://host:8080/apis/ccompat/v6``), for REST v2's ``avro``, ``protobuf`` and
    #: ``jsonschema`` formats ('' = those formats are refused). Nodes keep only a cache of it.
    schema_registry_url: str = ""
    #: Set by ``mqgw dev`` (``make run``): a development stack, run with auth off, open mode and
    #: the development HMAC key on purpose, whose banner says so once; each worker then does not
    #: warn about them again at start (production nodes leave it off and are warned).
    dev: bool = False
    #: OpenTelemetry spans for produce, fetch, ack and the delay relay (core/spans.py): needs
    #: ``pip install 'mq-gateway[otel]'``; exported by OTLP (``OTEL_EXPORTER_OTLP_ENDPOINT``)
    #: unless the process runs under ``opentelemetry-instrument``. Off: nothing is imported.
    otel_tracing: bool = False
    #: ``user:password`` for the registry's HTTP basic auth ('' = none).
    schema_registry_user_info: str = ""
    #: How long one registry call may take; beyond it the request is answered 503.
    schema_registry_timeout_ms: int = 5_000
    #: Largest request body accepted, in bytes.
    max_body_bytes: int = 8 * 1024 * 1024
    #: Largest number of messages in one produce request.
    max_produce_batch: int = 10_000
    #: Pooled fetch consumers per process; each stays on one partition while it can, so about
    #: the number of partitions one process reads at once.
    fetch_pool_size: int = 16
    #: Pause before re-fetching when a read starts above the requested offset; 0 trusts the
    #: broker. On Apache Kafka such a hole below the high watermark is compaction, transaction
    #: markers or aborted records, and is final. Tansu needs 30: a fetch racing producers at
    #: its tail can skip records that become readable a moment later (docs/delivery-semantics.md,
    #: "Holes are the broker's word"), and ``mqgw dev --broker tansu`` sets it so.
    gap_recheck_ms: int = 0
    #: How long a produce waits for the broker's acknowledgement.
    produce_timeout_ms: int = 30_000
    #: librdkafka linger for produce requests of many messages: longer gives the broker bigger
    #: batches (less work per record) at the cost of latency. Small requests use 0.5 ms.
    produce_linger_ms: int = 2
    #: Open mode: consumers and producers that are not registered are served anyway (with the
    #: defaults above). Registered ones are held to their registration either way. Meant for
    #: development (``mqgw dev`` turns it on); production should register every name.
    open_mode: bool = False
    #: Require an API key (``Authorization: Bearer <key>``) on every data and admin request.
    #: Bootstrap the first admin key with ``mqgw keys bootstrap``.
    auth: bool = True
    #: One JSON line per HTTP request (logger ``mqgw.access``).
    access_log: bool = True
    #: The share of successful requests (status below 400) the access log writes a line for,
    #: chosen at random; error answers (400 and up) always get one. A line is about 250 bytes and
    #: 6-7 µs of CPU (BENCHMARKS.md, issue 20): 1 logs every request, 0 errors only.
    access_log_sample: float = 0.01
    #: Root log level: DEBUG, INFO, WARNING, ERROR.
    log_level: str = "INFO"
    #: How often backlog alerts are evaluated (by one node per interval, elected in Redis).
    alert_interval_ms: int = 15_000
    #: Where alert state changes are POSTed as JSON ('' for nowhere).
    alert_webhook_url: str = ""
    #: The delay wheel's built-in alert (consumer ``_mqgw.relay``, reason ``overdue``): a record
    #: in the level topics this long past the time a relay should have moved it (no relay
    #: running, or all stalled). 0 turns it off.
    delay_overdue_alert_ms: int = 60_000
    #: Where the latest lag report (``mqgw report``'s report.html) is published: the console
    #: links to it ('' for no link: the console says how to make one). http(s) or a path.
    report_url: str = ""
    #: Redis connections per process: a bounded pool that requests wait for (a waiting long poll
    #: holds none), so a burst of requests queues instead of failing with "Too many connections".
    redis_max_connections: int = 64
    #: How long a request waits for a pooled Redis connection before it is answered 503.
    redis_pool_timeout_ms: int = 5_000
    #: A request head (request line and headers) must arrive whole within this time of the
    #: connection's first byte of it, else the connection is dropped (slow clients, slowloris).
    header_timeout_ms: int = 5_000
    #: A request body must arrive whole within this time of its head, else the connection is
    #: dropped (8 MiB in 10 s needs about 7 Mbit/s; raise it for slow links behind no proxy).
    body_timeout_ms: int = 10_000
    #: An idle keep-alive connection (between requests) is closed after this long; a new one
    #: must start its first request within ``header_timeout_ms``. Longer than the idle expiry
    #: of clients and balancers in front (httpx and Node 5 s, AWS ALB and ingress-nginx 60 s),
    #: as nginx's 75 s is: a client that reuses a connection the server is closing at that very
    #: moment gets an error, and a POST is not retried (at 5 s it equalled httpx's own expiry).
    #: Idle connections cost a descriptor each, bounded by ``max_connections_per_worker``.
    keep_alive_timeout_ms: int = 75_000
    #: Largest request head (request line and headers), in bytes: a larger one, or one still
    #: unfinished past it, is answered 431 and the connection closed.
    max_head_bytes: int = 32_768
    #: Most header fields in one request head (431 beyond).
    max_headers: int = 100
    #: A connection whose client takes none of its unsent answers for this long is aborted (while
    #: over 64 KiB of them wait, or a close waits to send the last bytes); progress restarts it.
    write_timeout_ms: int = 30_000
    #: Open connections per worker process; beyond it new connections are answered 503 and
    #: closed at once instead of exhausting file descriptors. 0: derived from the process's file
    #: limit (RLIMIT_NOFILE) minus a reserve.
    max_connections_per_worker: int = 0
    #: ``mqgw serve --workers N`` replaces a worker that has not answered the supervisor's
    #: liveness ping (answered by a thread of its own, whatever its event loop is doing) for
    #: this long. uvicorn's 5 s killed live workers mid-request on a starved machine (126 deaths
    #: on one node at load ~100; importing the app alone took 42 s there): a starved worker is
    #: slow, not dead. A worker that exits is replaced at once whatever this says; this bound is
    #: only for one that is stopped (SIGSTOP, a frozen VM) or hung in native code.
    worker_ping_timeout_ms: int = 60_000
    #: On SIGTERM a node stops accepting connections and answers waiting long polls at once
    #: (empty); other requests get this long to finish, then are answered ``503
    #: shutting_down`` (api/drain.py), and the process exits. Keep it under the orchestrator's
    #: kill delay (Kubernetes: terminationGracePeriodSeconds, 30 s) minus a few seconds.
    stop_grace_ms: int = 4_000

    #: Delayed records (core/wheel.py): the wheel's levels, a comma-separated list of durations
    #: ('' = 1-9 x 100 ms, 1 s, 10 s, 100 s, 1000 s). Each is a topic; a longer delay loops on
    #: the top level, so there is no maximum. The smallest is the most a holder waits in memory.
    delay_levels: str = ""
    #: Names of the level topics: ``<prefix><level>ms``. Created at start when missing.
    delay_topic_prefix: str = "mqgw.delay."
    #: Partitions of each level topic: how many relays can move records of one level at once.
    #: Fewer partitions make larger batches: on Apache Kafka, 4 per level took 4,317 delayed
    #: records/s, 2 took 7,733 and 1 took 9,483, but with 1 a level's single relay fell behind
    #: on Tansu (BENCHMARKS.md, issue 12).
    delay_partitions: int = 2
    #: Replication factor of the topics the gateway creates (-1: the broker's default).
    delay_replication: int = -1
    #: A cancel mark lives this long after the record's due time: a relay stopped for longer
    #: than this could deliver a record that was cancelled.
    delay_mark_retention_ms: int = 7 * 24 * 3600 * 1000
    #: Cancels are refused from this long before a record's due time on (Redis' clock): the
    #: record is delivered or on its way, and no mark per delivered record is kept to say which.
    #: Must exceed the clock skew between relay nodes and Redis.
    delay_cancel_cutoff_ms: int = 1000
    #: Run the relay that moves delayed records along the wheel in this process (``mqgw relay``
    #: runs it alone; turn it off on nodes that should only serve requests).
    relay: bool = True
    #: The relay's lock on a level queue: a relay that dies is replaced after this long.
    relay_lock_ms: int = 5_000
    #: On Kafka, each hop of the delay wheel (records, and the level queue's position) is one
    #: transaction, so a record due once is written once even when a relay stalls or dies
    #: mid-hop (core/relay.py). Off: plain writes, a stalled relay's hop may be written twice.
    relay_exactly_once: bool = True
    #: Records due within this window of the first due one are sent together (fewer, larger
    #: produce requests), so a record may be sent up to this late.
    relay_coalesce_ms: int = 20
    #: Records a relay reads from a level queue at once.
    relay_batch: int = 500

    #: Retries (core/retry.py): a failed record waits in the wheel, then goes to its consumer's
    #: retry topic ``<prefix><consumer>.<topic>.<digest>``, served by /message beside the topic.
    retry_topic_prefix: str = "mqgw.retry."
    #: Partitions of each retry and dead-letter topic the gateway makes.
    retry_partitions: int = 4
    #: Where a consumer's records go after their last attempt when its retry policy names no
    #: dead-letter topic: ``<prefix><consumer>``.
    dead_letter_prefix: str = "mqgw.dead."
    #: The retry policy of a consumer that has none: attempts in all (the first delivery
    #: included), and the delay before attempt n+1: initial x multiplier^(n-1), at most max.
    retry_max_attempts: int = 5
    retry_initial_delay_ms: int = 1_000
    retry_multiplier: float = 2.0
    retry_max_delay_ms: int = 600_000

    @classmethod
    def load(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        path = env.get("MQGW_CONFIG")
        if path:
            try:
                with open(path, "rb") as fh:
                    values.update(tomllib.load(fh).get("gateway", {}))
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise SettingsError(f"MQGW_CONFIG={path}: {e}") from None
            unknown = set(values) - {f.name for f in fields(cls)}
            if unknown:
                raise SettingsError(f"{path}: unknown [gateway] setting(s): "
                                    f"{', '.join(sorted(unknown))}")
        for f in fields(cls):
            for name in (f"MQGW_{f.name.upper()}", f.name.upper()):
                if name in env and (name.startswith("MQGW_") or f.name in _BARE_ENV):
                    values[f.name] = env[name]
                    break
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in values:
                raw = values[f.name]
                out[f.name] = _convert(f.name, f.type, raw)
        s = cls(**out)
        if s.start_position not in ("latest", "earliest"):
            raise SettingsError("start_position (MQGW_START_POSITION) must be 'latest' or "
                                f"'earliest', not {s.start_position!r}")
        if s.report_url and not re.match(r"(https?://|/(?!/))", s.report_url):
            raise SettingsError("report_url (MQGW_REPORT_URL) must be an http(s) URL or a path "
                                f"starting with '/', not {s.report_url!r}")
        if s.schema_registry_url and not re.match(r"https?://", s.schema_registry_url):
            raise SettingsError("schema_registry_url (MQGW_SCHEMA_REGISTRY_URL) must be an "
                                f"http(s) URL, not {s.schema_registry_url!r}")
        if not 0 <= s.access_log_sample <= 1:
            raise SettingsError("access_log_sample (MQGW_ACCESS_LOG_SAMPLE) is a share of requests, "
                                f"from 0 to 1, not {s.access_log_sample!r}")
        return s

    def registry_copy_topic(self) -> str:
        """The registry's durable copy topic ('' when turned off)."""
        if self.registry_topic == "-":
            return ""
        return self.registry_topic or re.sub(r"[^A-Za-z0-9._-]", "_", self.key_prefix) + ".registry"

    def memory_topic_map(self) -> dict[str, int]:
        """Parse ``memory_topics`` (``orders:4,audit:1``)."""
        out: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in self.memory_topics.split(","))):
            name, _, n = item.partition(":")
            out[name] = int(n or 1)
        return out

    def kafka_extra(self) -> dict[str, str]:
        """Parse ``kafka_config`` (``k=v,k=v``) into librdkafka settings."""
        pairs = (p.split("=", 1) for p in self.kafka_config.split(",") if "=" in p)
        return {k.strip(): v.strip() for k, v in pairs}


class SettingsError(ValueError):
    """A setting that cannot be used: ``mqgw`` prints it as one line and exits 2 (a traceback
    would hide the one sentence that matters)."""


def _convert(name: str, kind: Any, raw: Any) -> Any:
    where = f"{name} (MQGW_{name.upper()})"
    if kind in ("bool", bool):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text not in _BOOLS:
            raise SettingsError(f"{where} must be true or false, not {raw!r}")
        return _BOOLS[text]
    try:
        if kind in ("float", float):
            return float(raw)
        return int(raw) if kind in ("int", int) else str(raw)
    except (TypeError, ValueError):
        number = "a number" if kind in ("float", float) else "an integer"
        raise SettingsError(f"{where} must be {number}, not {raw!r}") from None


_BOOLS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}

#: Settings also accepted without the MQGW_ prefix, as docs/configuration.md promises.
_BARE_ENV = {"redis_url", "kafka_bootstrap", "kafka_config", "rocketmq_namesrv"}


def redact_url(url: str) -> str:
    """A connection URL without its passwords (``user:password@``, a query's ``...password=``),
    for messages and logs."""
    return re.sub(r"(password=)[^&]*", r"\1***", re.sub(r"//[^@/]*@", "//***@", url))


def node_id() -> str:
    """``host:pid``: this process among the gateway's nodes and workers (lease holders)."""
    return f"{socket.gethostname()}:{os.getpid()}"


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"


def parse_duration(text: str, units: tuple[str, ...] = tuple(_DURATION_UNITS)) -> float:
    """``10m``, ``1h30m``, ``90s``, ``2d``, ``500ms`` or plain seconds (``90``, ``0.5``) ->
    seconds, > 0. ``units`` limits the units accepted (of ms, s, m, h, d, w)."""
    t = text.strip().lower()
    if re.fullmatch(_NUMBER, t):
        v = float(t)
    else:
        unit = "(" + "|".join(sorted(units, key=len, reverse=True)) + ")"
        step = _NUMBER + r"\s*" + unit
        if not re.fullmatch(rf"(?:{step}\s*)+", t):
            raise ValueError(f"invalid duration {text!r}: use e.g. 90s, 10m, 1h30m, 500ms or plain "
                             f"seconds (units: {', '.join(units)})")
        v = sum(float(n) * _DURATION_UNITS[u] for n, u in re.findall(step, t))
    if v <= 0:
        raise ValueError(f"duration must be > 0: {text!r}")
    return v
