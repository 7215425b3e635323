"""The gateway and Apache RocketMQ's own clients and tools read each other's records (issue 22).

A gateway in front of RocketMQ is only useful beside the clients already on the cluster: what it
writes must look to them like what they write, and the other way round. So the other side here
is always Apache's code, never the gateway's adapter:

- Apache's Java client, rocketmq-client 5.5.0 over the remoting protocol
  (``tests/support/java/RocketInterop.java``, compiled once per module against the jars of
  gateway/cli/rocketmq_dist.py): a ``DefaultMQPullConsumer`` reads what ``POST /produce`` wrote
  (a batch and a single send) with its tags, keys (``KEYS``), headers (user properties, and
  nothing else: no marker of the gateway's), born times and message ids in the client's form;
  and ``GET /message`` reads what a ``DefaultMQProducer`` wrote, a body over 4 KiB included,
  which that producer stores zlib-compressed by default.
- ``mqadmin consumerProgress`` (``MQAdminStartup``, rocketmq-tools 5.5.0): an operator's view of
  a gateway consumer is its checkpoint group, ``mqgw|<consumer>`` (core/checkpoint.py copies
  acknowledged offsets there in rounds): the acked offset, the queue's end and the lag.
- Apache's C++ client (librocketmq, 2019, as the ``rocketmq-client-python==0.5.0rc2`` wheel
  bundles it; x86_64 only, skipped where it does not import): its ``Producer`` writes, compressed
  bodies included (4.x style: no codec bits in the flag), and its C pull consumer (the C API
  through ctypes, in a child process: a crash there fails a test, not the run) reads the
  gateway's records. It is a second implementation of the format, written independently of the
  Java one.

Topic names have no '.', which the gateway spells '|' on RocketMQ. Everything runs on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli import rocketmq_dist

from ..support import ON_ROCKETMQ, ROOT, Api, Node, read_checkpoint, unique, wait_for

pytestmark = [pytest.mark.rocketmq, pytest.mark.skipif(
    not ON_ROCKETMQ, reason="Apache RocketMQ's own clients and tools: the MQGW_TEST_BROKER=rocketmq pass")]

JAVA_SOURCE = ROOT / "tests" / "support" / "java" / "RocketInterop.java"
CHECKPOINT_PREFIX = "mqgw|"  # checkpoint_group_prefix "mqgw." as RocketMQ spells it (message.group_name)
#: MessageSysFlag: the body is compressed; bits 8-10 name the codec (3: zlib; 0 from 4.x clients).
COMPRESSED = 0x1
CODEC_BITS, ZLIB_CODEC = 0x700, 0x300
#: Over the producers' ``compressMsgBodyOverHowmuch`` (4 KiB, the Java and the C++ default), and
#: not one character repeated, so that a decompression bug cannot pass for the right text.
BIG_BODY = "".join(f"line {i:04d}: the quick brown fox jumps over the lazy dog\n" for i in range(120))
assert len(BIG_BODY.encode()) > 6000


# -- Apache's Java client --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def java_interop(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict[str, Any]]]:
    """RocketInterop.java compiled once; calling the result runs it on a list of commands (see the
    Java file) and returns its JSON answers."""
    dist = rocketmq_dist.resolve()
    work = tmp_path_factory.mktemp("rocket-interop")
    out = subprocess.run(["javac", "--release", "17", "-nowarn", "-cp", f"{dist}/*", "-d",
                          str(work / "classes"), str(JAVA_SOURCE)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]

    def run(namesrv: str, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # user.home: the client's logs (logs/rocketmqlogs) go to the module's directory
        done = subprocess.run([rocketmq_dist.java(), "-Xmx128m", f"-Duser.home={work}",
                               "-cp", f"{dist}/*{os.pathsep}{work / 'classes'}", "RocketInterop", namesrv],
                              input="".join(json.dumps(c) + "\n" for c in commands),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (done.stderr + done.stdout)[-3000:]
        # logback prints its status lines on stdout too: the answers are the JSON ones
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return run


def produce(api: Api, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = api.http.post(api.url("/produce"), json={"topic": topic, "messages": messages})
    assert r.status_code == 200, r.text
    assert r.json()["failed"] == 0, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def read_all(api: Api, topic: str, count: int) -> list[dict[str, Any]]:
    """``count`` records of ``topic`` through ``GET /message`` from the start (a new consumer,
    ``start: earliest``), each batch acknowledged; each record with its ``queue``."""
    group = unique("interop")
    api.config(group, start="earliest")
    got: list[dict[str, Any]] = []

    def more() -> bool:
        body = api.message(consumer=group, topic=topic, max=50, wait_ms=1000).json()
        if body["status"] == "ok":
            got.extend({**m, "queue": body["queue"]} for m in body["messages"])
            assert api.ack(body["requestId"]).json()["result"] == "committed"
        return len(got) >= count
    wait_for(more, f"{count} records of {topic} through /message", timeout=60)
    assert len(got) == count, got
    return sorted(got, key=lambda m: (m["queue"], m["offset"]))


def headers_of(record: dict[str, Any]) -> dict[str, str]:
    pairs = record["headers"]
    assert len({n for n, _ in pairs}) == len(pairs), pairs
    return {n: v for n, v in pairs}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_java_client_reads_what_the_gateway_wrote(
        api: Api, bootstrap: str, make_topic: Callable[..., str],
        java_interop: Callable[..., list[dict[str, Any]]]) -> None:
    """Keys, tags, headers and born times of ``POST /produce`` records as the Java client's pull
    consumer decodes them, from a batch (SEND_BATCH_MESSAGE) and a single send (SEND_MESSAGE_V2)."""
    topic = make_topic(4)
    born, born_single = 1_790_000_000_000, 1_790_000_000_123
    batch: list[dict[str, Any]] = [
        {"value": "order created", "key": "order-42", "tag": "created",
         "headers": {"trace-id": "abc-123", "origin": "gateway"}},
        {"value": "ünïcödé ✓ 日本語", "key": "клиент-7", "tag": "updated", "headers": [["lang", "русский"]]},
        {"value": "no key, no tag, no headers"},
    ]
    single: dict[str, Any] = {"value": "alone", "key": "k-single", "tag": "TagS", "headers": {"h": "v"}}
    # one timestamp for the batch: the records of one queue and time travel as one batch
    results = produce(api, topic, [{**m, "queue": "broker-a.2", "timestamp": born} for m in batch])
    results += produce(api, topic, [{**single, "queue": "broker-a.2", "timestamp": born_single}])
    assert [(r["queue"], r["offset"]) for r in results] == [("broker-a.2", n) for n in range(4)]

    *records, done = java_interop(bootstrap, [{"pull": topic, "queue": 2, "offset": 0, "count": 10}])
    assert done == {"pulled": 4, "status": "NO_NEW_MSG"}
    sent = [*batch, single]
    for n, (rec, m) in enumerate(zip(records, sent, strict=True)):
        assert (rec["topic"], rec["queueId"], rec["offset"]) == (topic, 2, n), rec
        assert rec["body"] == m["value"], rec
        assert rec["keys"] == m.get("key"), rec
        assert rec["tags"] == m.get("tag"), rec
        want_headers = dict(m.get("headers", {}))  # a list of pairs or an object
        assert rec["properties"] == want_headers, rec  # the user properties: the headers, no more
        assert rec["bornTimestamp"] == (born if n < 3 else born_single), rec
        # the message id (UNIQ_KEY) in the Java client's form, which its tools and the broker read
        assert re.fullmatch(r"[0-9A-F]{32}", rec["uniqKey"] or ""), rec
    assert len({r["uniqKey"] for r in records}) == 4


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_gateway_reads_what_the_java_client_wrote(
        api: Api, bootstrap: str, make_topic: Callable[..., str],
        java_interop: Callable[..., list[dict[str, Any]]]) -> None:
    """Records of a Java ``DefaultMQProducer`` through ``GET /message``: value, key (the ``KEYS``
    property as it is stored: several keys are space-separated), tag, headers (the user
    properties), and a zlib-compressed body decompressed."""
    topic = make_topic(4)
    sent: list[dict[str, Any]] = [
        {"tag": "TagA", "keys": ["order-1"], "properties": {"color": "red", "ü-name": "ß-value"},
         "body": "hello from java"},
        {"keys": ["k1", "k2"], "body": "two keys"},
        {"tag": "Big", "properties": {"size": "large"}, "body": BIG_BODY},
        {"body": "bare"},
    ]
    answers = java_interop(bootstrap, [
        *({"send": topic, "queue": 1, **m} for m in sent),
        # what the broker stores (the premise of the compression check below)
        {"pull": topic, "queue": 1, "offset": 0, "count": len(sent)}])
    acks, stored = answers[:len(sent)], answers[len(sent):-1]
    assert [(a["status"], a["queueId"], a["offset"]) for a in acks] == \
        [("SEND_OK", 1, n) for n in range(len(sent))], acks
    # the Java decoder clears the compressed bit once it has inflated the body; the codec bits stay
    assert [s["sysFlag"] & CODEC_BITS for s in stored] == [0, 0, ZLIB_CODEC, 0], stored

    records = read_all(api, topic, len(sent))
    for n, (rec, m) in enumerate(zip(records, sent, strict=True)):
        assert (rec["queue"], rec["offset"]) == ("broker-a.1", n), rec
        assert rec["encoding"] == "utf8", rec
        assert rec["value"] == m["body"], rec["value"][:200]
        assert rec["key"] == (" ".join(m["keys"]) if "keys" in m else None), rec
        assert rec.get("tag") == m.get("tag"), rec
        assert headers_of(rec) == m.get("properties", {}), rec
        assert "mqgw-undecodable" not in headers_of(rec)


# -- the operator's tool: mqadmin --------------------------------------------------------------------

def mqadmin(namesrv: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home.mkdir(exist_ok=True)
    return subprocess.run([rocketmq_dist.java(), "-Xmx128m", f"-Duser.home={home}",
                           "-cp", f"{rocketmq_dist.resolve()}/*", rocketmq_dist.ADMIN_TOOL,
                           *args, "-n", namesrv],
                          env={**os.environ, "ROCKETMQ_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)


def progress_rows(out: str, topic: str) -> list[list[str]]:
    """consumerProgress's table: #Topic #Broker Name #QID #Broker Offset #Consumer Offset #Diff
    #Inflight #LastTime, the rows of ``topic``."""
    return [line.split() for line in out.splitlines() if line.split()[:1] == [topic]]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_mqadmin_consumer_progress_shows_a_gateway_consumers_acked_offset(
        bootstrap: str, node_factory: Callable[..., Node], make_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """A checkpoint round copies the acknowledged offset to ``mqgw|<consumer>``, where
    ``mqadmin consumerProgress`` shows it with the queue's end and the lag."""
    node = node_factory(checkpoint_interval_ms=500)
    topic, g = make_topic(1), unique("ck")
    group = CHECKPOINT_PREFIX + g
    with httpx.Client(base_url=node.url, timeout=30) as http:
        assert http.patch(f"/admin/consumers/{g}", json={"start": "earliest"}).status_code == 200
        r = http.post("/produce", json={"topic": topic, "messages": [
            {"value": f"v{i}", "queue": "broker-a.0"} for i in range(10)]})
        assert r.status_code == 200 and r.json()["failed"] == 0, r.text
        body = http.get("/message", params={"consumer": g, "topic": topic, "max": 4,
                                            "wait_ms": 5000}).json()
        assert [m["offset"] for m in body["messages"]] == [0, 1, 2, 3], body
        assert http.post("/ack", json={"requestId": body["requestId"]}).json()["committedOffset"] == 4

    # A JVM start per look costs seconds: wait for the round with the broker's own answer
    # (QUERY_CONSUMER_OFFSET), then ask the tool. The group holds the start (0) from the first
    # fetch on; 4 once a round copied the ack.
    wait_for(lambda: read_checkpoint(bootstrap, "mqgw." + g, topic, 1) == {0: 4},
             "a checkpoint round with the ack", timeout=60)

    def progress() -> list[str] | None:
        out = mqadmin(bootstrap, tmp_path / "mqadmin", "consumerProgress", "-g", group, "-t", topic)
        rows = progress_rows(out.stdout, topic)
        return rows[0] if rows and rows[0][4] == "4" else None
    row = wait_for(progress, "the ack in mqadmin consumerProgress", timeout=60)
    # Topic, Broker Name, QID, Broker Offset (the queue's end), Consumer Offset, Diff
    assert row[:6] == [topic, "broker-a", "0", "10", "4", "6"], row

    # The group alone, as operators ask: the tool routes by the group's retry topic,
    # %RETRY%<group>, which RocketMQ makes for a consumer that registers (a push consumer's
    # heartbeat); a gateway group that has none is not found.
    out = mqadmin(bootstrap, tmp_path / "mqadmin", "consumerProgress", "-g", group)
    assert progress_rows(out.stdout, topic)[0][:6] == row[:6], out.stdout[-3000:]


# -- Apache's C++ client (the rocketmq-client-python 0.5.0rc2 wheel) -------------------------------

#: Run in a child process: ``python -c CPP_CLIENT '<command as JSON>'``; one JSON answer a line.
#: ``produce``: the wheel's ``Producer`` sends each message (round robin over the topic's queues);
#: ``pull``: the C API's pull consumer (CPullConsumer.h, not wrapped by the wheel) reads a queue
#: from an offset, each record's user properties asked by name.
CPP_CLIENT = r'''
import ctypes, json, sys
from ctypes import POINTER, c_char, c_char_p, c_int, c_longlong, c_void_p

from rocketmq.client import Message, Producer
from rocketmq.ffi import dll

cmd = json.loads(sys.argv[1])
if cmd["op"] == "produce":
    p = Producer("interop_cpp_producer")
    p.set_namesrv_addr(cmd["namesrv"])
    p.start()
    for m in cmd["messages"]:
        msg = Message(cmd["topic"])
        if "tag" in m:
            msg.set_tags(m["tag"])
        if "keys" in m:
            msg.set_keys(m["keys"])
        for k, v in m.get("properties", {}).items():
            msg.set_property(k, v)
        msg.set_body(m["body"])
        r = p.send_sync(msg)
        print(json.dumps({"status": r.status.name, "msgId": r.msg_id, "offset": r.offset}), flush=True)
    p.shutdown()
    sys.exit(0)


class CMessageQueue(ctypes.Structure):  # CMessageQueue.h (CCommon.h: MAX_TOPIC_LENGTH 512, ...)
    _fields_ = [("topic", c_char * 512), ("brokerName", c_char * 256), ("queueId", c_int)]


class CPullResult(ctypes.Structure):  # CPullResult.h
    _fields_ = [("pullStatus", c_int), ("nextBeginOffset", c_longlong), ("minOffset", c_longlong),
                ("maxOffset", c_longlong), ("msgFoundList", POINTER(c_void_p)), ("size", c_int),
                ("pData", c_void_p)]


PULL_STATUS = ["FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL", "BROKER_TIMEOUT"]
dll.CreatePullConsumer.argtypes, dll.CreatePullConsumer.restype = [c_char_p], c_void_p
dll.SetPullConsumerNameServerAddress.argtypes = [c_void_p, c_char_p]
dll.StartPullConsumer.argtypes = dll.ShutdownPullConsumer.argtypes = [c_void_p]
dll.FetchSubscriptionMessageQueues.argtypes = [c_void_p, c_char_p, POINTER(POINTER(CMessageQueue)),
                                               POINTER(c_int)]
dll.ReleaseSubscriptionMessageQueue.argtypes = [POINTER(CMessageQueue)]
dll.Pull.argtypes = [c_void_p, POINTER(CMessageQueue), c_char_p, c_longlong, c_int]
dll.Pull.restype = CPullResult
dll.ReleasePullResult.argtypes = [POINTER(CPullResult)]  # a C++ reference

c = dll.CreatePullConsumer(b"interop_cpp_reader")
assert dll.SetPullConsumerNameServerAddress(c, cmd["namesrv"].encode()) == 0
assert dll.StartPullConsumer(c) == 0
mqs, n = POINTER(CMessageQueue)(), c_int()
assert dll.FetchSubscriptionMessageQueues(c, cmd["topic"].encode(), ctypes.byref(mqs), ctypes.byref(n)) == 0
mq = next(mqs[i] for i in range(n.value) if mqs[i].queueId == cmd["queue"])
offset, got, status = cmd["offset"], 0, "FOUND"
while got < cmd["count"]:
    r = dll.Pull(c, ctypes.byref(mq), b"*", offset, cmd["count"] - got)
    status = PULL_STATUS[r.pullStatus]
    if status != "FOUND":
        break
    for i in range(r.size):
        m = r.msgFoundList[i]
        text = lambda b: (b or b"").decode()
        print(json.dumps({
            "queueId": dll.GetMessageQueueId(m), "offset": dll.GetMessageQueueOffset(m),
            "tags": text(dll.GetMessageTags(m)), "keys": text(dll.GetMessageKeys(m)),
            "body": text(dll.GetMessageBody(m)),
            "properties": {k: text(dll.GetMessageProperty(m, k.encode())) for k in cmd["names"]}}),
            flush=True)
    got += r.size
    offset = r.nextBeginOffset
    dll.ReleasePullResult(ctypes.byref(r))
print(json.dumps({"pulled": got, "status": status}), flush=True)
dll.ReleaseSubscriptionMessageQueue(mqs)
dll.ShutdownPullConsumer(c)
'''


@pytest.fixture(scope="module")
def cpp_client(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict[str, Any]]]:
    """Runs :data:`CPP_CLIENT` on a command; skips where the wheel does not import."""
    if platform.machine() != "x86_64":
        pytest.skip("the rocketmq-client-python 0.5.0rc2 wheel is x86_64 only")
    home = tmp_path_factory.mktemp("rocket-cpp")  # librocketmq logs to $HOME/logs/rocketmq-cpp
    env = {**os.environ, "HOME": str(home)}
    probe = subprocess.run([sys.executable, "-c", "import rocketmq.client"], cwd=home, env=env,
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"rocketmq-client-python 0.5.0rc2 does not import here: {probe.stderr[-300:]}")

    def run(command: dict[str, Any]) -> list[dict[str, Any]]:
        done = subprocess.run([sys.executable, "-c", CPP_CLIENT, json.dumps(command)], cwd=home,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (done.stderr + done.stdout)[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return run


def stored_sys_flags(namesrv: str, topic: str, queue: int, count: int) -> list[int]:
    """The flags of a queue's first records as the broker stores them (a raw PULL_MESSAGE):
    clients' decoders clear the compressed bit once they inflated a body."""
    from gateway.broker.rocketmq.client import Client
    from gateway.broker.rocketmq.codes import PULL_SUBSCRIPTION, Req
    from gateway.broker.rocketmq.message import decode_messages

    async def pull() -> list[int]:
        client = Client(namesrv)
        try:
            addr, qid = await client.master_of(topic, f"broker-a.{queue}")
            resp = await client.call(addr, Req.PULL_MESSAGE, {
                "consumerGroup": "interop_raw_reader", "topic": topic, "queueId": str(qid),
                "queueOffset": "0", "maxMsgNums": str(count), "sysFlag": str(PULL_SUBSCRIPTION),
                "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
                "subVersion": "0", "expressionType": "TAG"})
            return [m.sys_flag for m in decode_messages(resp.body or b"")]
        finally:
            await client.close()
    return asyncio.run(pull())


@pytest.mark.timeout(120)
def test_the_gateway_reads_what_the_cpp_client_wrote(
        api: Api, bootstrap: str, make_topic: Callable[..., str],
        cpp_client: Callable[..., list[dict[str, Any]]]) -> None:
    """Records of the C++ ``Producer`` through ``GET /message``: tag, key, a property, and a body
    it compressed the 4.x way (the compressed bit without codec bits: zlib)."""
    topic = make_topic(1)  # the wheel's producer picks queues round robin and answers no queue
    sent: list[dict[str, Any]] = [
        {"tag": "TagC", "keys": "order-c1", "properties": {"color": "blue", "origin": "cpp"},
         "body": "from the C++ client"},
        {"tag": "Big", "body": BIG_BODY},
        {"keys": "k-only", "body": "keyed, no tag"},
    ]
    acks = cpp_client({"op": "produce", "namesrv": bootstrap, "topic": topic, "messages": sent})
    assert [(a["status"], a["offset"]) for a in acks] == [("OK", n) for n in range(len(sent))], acks
    flags = stored_sys_flags(bootstrap, topic, 0, len(sent))
    assert [f & (COMPRESSED | CODEC_BITS) for f in flags] == [0, COMPRESSED, 0], flags

    records = read_all(api, topic, len(sent))
    for n, (rec, m) in enumerate(zip(records, sent, strict=True)):
        assert (rec["queue"], rec["offset"]) == ("broker-a.0", n), rec
        assert rec["value"] == m["body"], rec["value"][:200]
        assert rec["key"] == m.get("keys"), rec
        assert rec.get("tag") == m.get("tag"), rec
        assert headers_of(rec) == m.get("properties", {}), rec


@pytest.mark.timeout(120)
def test_the_cpp_client_reads_what_the_gateway_wrote(
        api: Api, bootstrap: str, make_topic: Callable[..., str],
        cpp_client: Callable[..., list[dict[str, Any]]]) -> None:
    """``POST /produce`` records pulled by the C API's pull consumer: body, tag, key and the
    headers as properties, and no ``mqgw-value`` marker on a record that has a value."""
    topic = make_topic(2)
    sent: list[dict[str, Any]] = [
        {"value": "to the C++ client", "key": "order-9", "tag": "TagG",
         "headers": {"color": "green", "trace-id": "t-1"}},
        {"value": "second", "key": "order-10", "tag": "TagH", "headers": {"color": "grey"}},
        {"value": "third, bare"},
    ]
    results = produce(api, topic, [{**m, "queue": "broker-a.1"} for m in sent])
    assert [(r["queue"], r["offset"]) for r in results] == [("broker-a.1", n) for n in range(3)]
    names = ["color", "trace-id", "mqgw-value"]
    *records, done = cpp_client({"op": "pull", "namesrv": bootstrap, "topic": topic, "queue": 1,
                                 "offset": 0, "count": 10, "names": names})
    assert done == {"pulled": 3, "status": "NO_NEW_MSG"}, done
    for n, (rec, m) in enumerate(zip(records, sent, strict=True)):
        assert (rec["queueId"], rec["offset"]) == (1, n), rec
        assert rec["body"] == m["value"], rec
        assert rec["keys"] == m.get("key", ""), rec  # the C API answers "" for none
        assert rec["tags"] == m.get("tag", ""), rec
        assert rec["properties"] == {k: m.get("headers", {}).get(k, "") for k in names}, rec
