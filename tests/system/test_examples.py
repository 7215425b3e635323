"""The client examples (examples/: Python, JavaScript, Java, Go), run against live gateway nodes.

Each language's producer writes records, its consumer reads them, and the test checks what the
README promises a client gets: every record arrives (at least once), a stopped consumer (SIGTERM)
exits 0 and leaves no queue locked, a batch whose handler fails is unlocked and comes again,
broadcast clientIds each get every record, and API keys are sent.

The consumers run with a lock timeout of 10 minutes, longer than any bound here: a lock an
example left behind would hold its queue past the test's end, so records arriving and queues
found unlocked prove the examples acked or unlocked, not that a lock expired. Nothing is timed;
every subprocess has a bound and is killed in ``finally``. A language whose toolchain is absent
is skipped.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli import devstack

from ..support import ROOT, Api, Node, Secure, start_node, unique

EXAMPLES = ROOT / "examples"
LOCK_MS = 600_000  # see the module docstring
BOUND_S = 120  # the most any one consumer is given to see its records (a bound, not a timing)
#: What the examples read from the environment: never inherited from the test's own.
EXAMPLE_ENV = ("MQGW_URL", "MQGW_API_KEY", "MQGW_PRODUCER", "MQGW_CLIENT_ID", "MQGW_FAIL_ONCE",
               "MQGW_WAIT_MS", "MQGW_LINGER_MS")


@dataclass
class Programs:
    """How to run one language's producer and consumer (argv before their own arguments)."""

    lang: str
    producer: list[str]
    consumer: list[str]


def _version(argv: list[str]) -> tuple[int, ...] | None:
    """The first dotted number a ``--version`` style command prints, or None if it fails."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"(\d+)(?:\.(\d+))?", out.stdout + out.stderr)
    return tuple(int(g) for g in m.groups() if g) if m else None


def _need(tool: str | None, argv_version: list[str], minimum: tuple[int, ...]) -> str:
    """The tool's path, or skip the test when it is missing or too old."""
    if tool is None or (v := _version([tool, *argv_version])) is None or v < minimum:
        pytest.skip(f"{tool or argv_version} {'.'.join(map(str, minimum))}+ not installed")
    return tool


@pytest.fixture(scope="session")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Both Java programs compiled once (javac starts faster than the source launcher per run)."""
    javac = _need(shutil.which("javac"), ["-version"], (17,))
    java = _need(shutil.which("java"), ["-version"], (17,))
    out = tmp_path_factory.mktemp("java-examples")
    subprocess.run([javac, "-d", str(out), *map(str, sorted((EXAMPLES / "java").glob("*.java")))],
                   check=True, timeout=300, capture_output=True)
    return java, out


@pytest.fixture(scope="session")
def go_binaries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both Go programs built once, offline (the module has no requirements)."""
    go = _need(shutil.which("go") or shutil.which("go", path="/usr/local/go/bin"), ["version"], (1, 18))
    out = tmp_path_factory.mktemp("go-examples")
    env = {**os.environ, "GOFLAGS": "-buildvcs=false", "GOPROXY": "off", "GOTOOLCHAIN": "local",
           "GOWORK": "off"}
    home = Path(os.environ.get("HOME", "/nonexistent"))
    if not os.access(home, os.W_OK):  # the build cache lives under HOME by default
        env |= {"GOCACHE": str(out / "cache"), "GOPATH": str(out / "gopath")}
    subprocess.run([go, "build", "-o", str(out) + "/", "./..."], cwd=EXAMPLES / "go", env=env,
                   check=True, timeout=600, capture_output=True)
    return out


@pytest.fixture(params=["python", "javascript", "java", "go"])
def programs(request: pytest.FixtureRequest) -> Programs:
    lang: str = request.param
    if lang == "python":
        d = EXAMPLES / "python"
        py = sys.executable  # the venv's: httpx is installed there
        return Programs(lang, [py, str(d / "producer.py")], [py, str(d / "consumer.py")])
    if lang == "javascript":
        node = _need(shutil.which("node"), ["--version"], (18,))  # global fetch
        d = EXAMPLES / "javascript"
        return Programs(lang, [node, str(d / "producer.mjs")], [node, str(d / "consumer.mjs")])
    if lang == "java":
        java, classes = request.getfixturevalue("java_classes")
        # Start-up flags only (a small JIT and GC for short runs on a busy machine): the programs
        # run as they are, with the default (HTTP/2-preferring) HttpClient.
        jvm = [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", str(classes)]
        return Programs(lang, [*jvm, "Producer"], [*jvm, "Consumer"])
    bins: Path = request.getfixturevalue("go_binaries")
    return Programs(lang, [str(bins / "producer")], [str(bins / "consumer")])


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in EXAMPLE_ENV}
    return {**env, "MQGW_URL": url, "MQGW_WAIT_MS": "1000", **extra}


class Running:
    """A consumer example as a process, with its stdout lines (records) collected as they come."""

    def __init__(self, argv: list[str], env: dict[str, str], stdin: Path | None = None,
                 pipe: bool = False) -> None:
        """``pipe``: stdin is a pipe this test writes to (:meth:`write`) and keeps open."""
        with open(stdin or os.devnull, "rb") as input_:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(argv, env=env, cwd=ROOT,
                                         stdin=subprocess.PIPE if pipe else input_,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         start_new_session=True)
        self.records: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(s, t), daemon=True) for s, t in
                         ((self.proc.stdout, self.records), (self.proc.stderr, self.stderr))]
        for t in self._readers:
            t.start()

    def _read(self, stream: Any, into: list[Any]) -> None:
        for line in stream:
            with self._changed:
                into.append(json.loads(line) if into is self.records else line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def write(self, lines: list[str]) -> None:
        """Lines into its stdin pipe, left open."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(v + "\n" for v in lines))
        self.proc.stdin.flush()

    def read_all_and_idle(self) -> bool:
        """It took every byte written to its stdin (the pipe is empty) and every thread of it
        sleeps: what it read is in its hands, nothing is on its way in."""
        assert self.proc.stdin is not None
        waiting = array.array("i", [0])
        fcntl.ioctl(self.proc.stdin.fileno(), termios.FIONREAD, waiting)
        if waiting[0]:
            return False
        tasks = Path(f"/proc/{self.proc.pid}/task")
        try:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return all(s in ("S", "D", "I") for s in states)

    def values(self) -> set[str]:
        with self._changed:
            return {r["value"] for r in self.records}

    def wait_for(self, done: Callable[[], bool]) -> None:
        """Until ``done()`` holds; fails if the process ends first or the bound runs out."""
        with self._changed:
            self._changed.wait_for(lambda: done() or self.proc.poll() is not None, BOUND_S)
        assert done(), f"rc={self.proc.poll()} records={len(self.records)} stderr={self.log()}"

    def stop(self) -> int:
        """SIGTERM, as a process manager stops it; its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.finish(60)

    def finish(self, timeout: float = BOUND_S) -> int:
        """Its exit code once it ends, with all its output read."""
        rc = self.proc.wait(timeout)
        for t in self._readers:
            t.join(10)
        return rc

    def log(self) -> str:
        return "".join(self.stderr)[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def start() -> Iterator[Callable[..., Running]]:
    """Start examples (``stdin``: a file to read); whatever still runs at the end of the test is
    killed."""
    started: list[Running] = []

    def run(argv: list[str], env: dict[str, str], stdin: Path | None = None,
            pipe: bool = False) -> Running:
        started.append(Running(argv, env, stdin, pipe))
        return started[-1]
    yield run
    for r in started:
        r.kill()


def produce(p: Programs, topic: str, values: list[str], env: dict[str, str]) -> dict[int, int]:
    """Run the producer example; the end offset it reached on each partition."""
    out = subprocess.run([*p.producer, topic], input="".join(v + "\n" for v in values), env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=BOUND_S)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == len(values) and not any("error" in r for r in results), out.stdout[-3000:]
    ends: dict[int, int] = {}
    for r in results:
        ends[r["partition"]] = max(ends.get(r["partition"], 0), r["offset"] + 1)
    return ends


def assert_settled(queues: list[dict[str, Any]], topic: str, ends: dict[int, int] | None = None) -> None:
    """No queue of ``topic`` is locked, and (given ``ends``) each is committed to its end."""
    mine = {int(q["queue"]): q for q in queues if q["topic"] == topic}
    assert not [q for q in mine.values() if q["locked"]], mine
    for partition, end in (ends or {}).items():
        assert mine[partition]["committedOffset"] >= end, (partition, end, mine)


def test_produce_consume_stop_and_resume(programs: Programs, cluster: list[Node], api: Api,
                                         make_topic: Callable[..., str],
                                         start: Callable[[list[str], dict[str, str]], Running]) -> None:
    """A consumer stopped mid-stream exits 0 holding nothing; a second one, on another node,
    gets the rest at once; together they saw every record."""
    topic, group = make_topic(3, "ex"), unique("ex")
    api.config(group, start="earliest", consumeTimeoutMs=LOCK_MS)
    values = [f"{programs.lang}-{i}" for i in range(200)]
    ends = produce(programs, topic, values, _env(cluster[0].url))

    first = start([*programs.consumer, group, topic], _env(cluster[1].url))
    first.wait_for(lambda: len(first.values()) >= 10)
    assert first.stop() == 0, first.log()
    queues = api.http.get(api.url(f"/consumers/{group}/queues")).json()["queues"]
    assert_settled(queues, topic)  # what it held was acked or unlocked

    second = start([*programs.consumer, group, topic], _env(cluster[2].url))
    second.wait_for(lambda: first.values() | second.values() >= set(values))
    assert second.stop() == 0, second.log()
    queues = api.http.get(api.url(f"/consumers/{group}/queues")).json()["queues"]
    assert_settled(queues, topic, ends)


def test_a_failing_handler_unlocks_its_batch(programs: Programs, node: Node, api: Api,
                                             make_topic: Callable[..., str],
                                             start: Callable[[list[str], dict[str, str]], Running]) -> None:
    """The handler fails once on one record: the batch is unlocked and fetched again at once (the
    lock would hold it for 10 minutes). A rate limit makes the consumer meet 429s on the way."""
    topic, group = make_topic(1, "ex"), unique("ex")
    api.config(group, start="earliest", consumeTimeoutMs=LOCK_MS,
               rateLimit={"messagesPerSecond": 20, "burst": 3})
    values = [f"{programs.lang}-{i}" for i in range(10)]
    ends = produce(programs, topic, values, _env(node.url))

    consumer = start([*programs.consumer, group, topic], _env(node.url, MQGW_FAIL_ONCE=values[4]))
    consumer.wait_for(lambda: consumer.values() >= set(values))
    assert consumer.stop() == 0, consumer.log()
    assert "handler failed" in consumer.log()
    queues = api.http.get(api.url(f"/consumers/{group}/queues")).json()["queues"]
    assert_settled(queues, topic, ends)


def test_broadcast_with_an_api_key(programs: Programs, sec: Secure, make_topic: Callable[..., str],
                                   start: Callable[[list[str], dict[str, str]], Running]) -> None:
    """On nodes that require keys: the producer and two broadcast clientIds (on two nodes) use a
    key from MQGW_API_KEY, and each clientId gets every record. Without the key, 401: exit 1."""
    topic, group, producer = make_topic(2, "ex"), unique("bc"), unique("pr")
    sec.admin("PUT", f"/admin/producers/{producer}", json={"topics": [topic]})
    sec.admin("PUT", f"/admin/consumers/{group}", json={
        "topics": [topic], "mode": "broadcast", "start": "earliest", "consumeTimeoutMs": LOCK_MS})
    key = sec.key(unique("k"), producers=[producer], consumers=[group])
    values = [f"{programs.lang}-{i}" for i in range(40)]
    ends = produce(programs, topic, values, _env(sec.nodes[0].url, MQGW_API_KEY=key))

    clients = {cid: start([*programs.consumer, group, topic],
                          _env(sec.nodes[i].url, MQGW_API_KEY=key, MQGW_CLIENT_ID=cid))
               for i, cid in enumerate((f"{programs.lang}-a", f"{programs.lang}-b"))}
    for c in clients.values():
        c.wait_for(lambda c=c: c.values() >= set(values))  # type: ignore[misc]
    for cid, c in clients.items():
        assert c.stop() == 0, c.log()
        view = sec.admin("GET", f"/consumers/{group}/clients/{cid}/queues")
        assert_settled(view["queues"], topic, ends)

    keyless = start([*programs.consumer, group, topic], _env(sec.nodes[0].url, MQGW_CLIENT_ID="x"))
    assert keyless.proc.wait(BOUND_S) == 1
    assert "401" in keyless.log()


def test_a_producer_waits_for_the_gateway(programs: Programs, redis_url: str, bootstrap: str,
                                          tmp_path: Path, make_topic: Callable[..., str],
                                          start: Callable[..., Running]) -> None:
    """The producer starts before any gateway listens on its URL: it retries with backoff,
    saying so on stderr, and once a node starts on that port every record gets written (the
    consumer example reads them all back). Before, it crashed on the first refused connection."""
    topic, group = make_topic(2, "ex"), unique("ex")
    port = devstack.free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}"
    values = [f"{programs.lang}-early-{i}" for i in range(150)]  # two requests of a batch each
    lines = tmp_path / "values.txt"
    lines.write_text("".join(v + "\n" for v in values))
    producer = start([*programs.producer, topic], _env(url), lines)
    producer.wait_for(lambda: "retrying" in producer.log())  # still running: not crashed
    assert "unreachable" in producer.log(), producer.log()
    node = start_node(redis_url, bootstrap, tmp_path, port=port)
    try:
        assert producer.finish() == 0, producer.log()
        assert len(producer.records) == len(values), producer.records
        assert not [r for r in producer.records if "error" in r], producer.records
        with httpx.Client(timeout=30) as http:
            r = http.patch(f"{url}/admin/consumers/{group}",
                           json={"start": "earliest", "consumeTimeoutMs": LOCK_MS})
            assert r.status_code == 200, r.text
        consumer = start([*programs.consumer, group, topic], _env(url))
        consumer.wait_for(lambda: consumer.values() >= set(values))
        assert consumer.stop() == 0, consumer.log()
    finally:
        node.stop()


def test_a_producer_sends_a_pipe_as_it_flows_and_what_it_read_when_stopped(
        programs: Programs, node: Node, api: Api, make_topic: Callable[..., str],
        start: Callable[..., Running]) -> None:
    """``tail -f app.log | producer``: lines go out while stdin stays open (a batch leaves
    MQGW_LINGER_MS after its first line), and Ctrl-C sends the lines read and not sent yet.
    Before: the producers read stdin to its end first, so an open pipe sent nothing, and Ctrl-C
    dropped everything read."""
    topic = make_topic(1, "ex")
    flowing = start([*programs.producer, topic], _env(node.url, MQGW_LINGER_MS="20"), pipe=True)
    flowing.write(["a1", "a2"])
    flowing.wait_for(lambda: len(flowing.records) >= 2)  # sent; stdin still open
    flowing.write(["a3"])
    flowing.wait_for(lambda: len(flowing.records) >= 3)
    assert flowing.proc.poll() is None

    # A linger longer than any test: only the stop can send what it read.
    held = start([*programs.producer, topic], _env(node.url, MQGW_LINGER_MS="3600000"), pipe=True)
    held.write(["b1", "b2"])
    deadline = time.monotonic() + BOUND_S
    calm = 0
    while calm < 3:  # read, and asleep, three looks in a row
        assert time.monotonic() < deadline and held.proc.poll() is None, held.log()
        calm = calm + 1 if held.read_all_and_idle() else 0
        time.sleep(0.02)
    assert held.records == []
    held.proc.send_signal(signal.SIGINT)
    assert held.finish(60) == 130, held.log()
    assert len(held.records) == 2 and not [r for r in held.records if "error" in r], held.records
    flowing.proc.send_signal(signal.SIGTERM)
    assert flowing.finish(60) == 143, flowing.log()
    end = api.http.get(api.url(f"/admin/topics/{topic}")).json()["partitions"][0]["endOffset"]
    assert end == 5
