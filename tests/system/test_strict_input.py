"""Input the spec does not allow is refused, and input it allows is taken (issue 10).

Before: integer parameters went through Python's ``int()`` (``+5``, `` 5``, ``1_0``, ``٣``,
``１`` passed), whole-number floats such as ``100.0`` were refused in bodies, a requestId with
``==`` appended still verified, ``garbage`` was said to have a bad signature, unknown /message
parameters were ignored (``maxx=5`` locked a queue with 32 records), a PATCH without a body
passed, and ``mode: null`` in a PATCH failed. Then: a JSON string such as ``"max": "5"`` was
taken in a body, ``max=`` and ``encoding=`` were read as the defaults, a repeated parameter
silently kept its last value, a typo in an admin query (``deleteOffset=true``) was ignored, a
whole-number float was refused as a reset's ``queue``, and the spec and the server disagreed
about ``null`` (``max``, ``encoding``, ``partition``, ``timestamp``).
"""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from gateway.core.errors import Invalid
from gateway.core.requestid import _SIG_BYTES, BatchRef, RequestIdCodec

from ..support import HMAC_KEY, Api, unique
from ..support.openapi import expect, spec_allows

# -- integers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["+5", " 5", "5 ", "1_0", "٣", "１", "5.0", "0x5", "", "-", "1e3"])
def test_query_integers_are_ascii_digits_only(api: Api, make_topic, raw: str) -> None:
    topic = make_topic(1)
    r = api.http.get(api.url("/message"), params={"consumer": unique(), "topic": topic, "max": raw})
    body = expect(r, 400, "invalid_max")
    assert body["error"]["details"]["parameter"] == "max", body


def test_out_of_range_integers_name_the_parameter(api: Api, make_topic) -> None:
    topic = make_topic(1)
    body = expect(api.message(consumer=unique(), topic=topic, wait_ms="-1"), 400, "invalid_wait_ms")
    assert body["error"]["details"] == {"parameter": "wait_ms", "min": 0, "max": 30000}, body


def test_whole_number_floats_are_integers_in_bodies(api: Api, make_topic) -> None:
    topic = make_topic(2)
    g = unique()
    body = expect(api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": "a", "partition": 1.0, "timestamp": 1_700_000_000_000.0}]}), 200)
    assert body["results"][0]["partition"] == 1
    expect(api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": "a", "partition": 1.5}]}), 400, "invalid_partition")
    expect(api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": "a", "partition": True}]}), 400, "invalid_partition")
    expect(api.http.post(api.url("/message"), json={"consumer": g, "topic": topic, "max": 5.0}), 200)
    expect(api.http.post(api.url("/message"), json={"consumer": g, "topic": topic, "max": 5.5}),
           400, "invalid_max")
    expect(api.http.patch(api.url(f"/admin/consumers/{g}"), json={"consumeTimeoutMs": 30000.0}), 200)


@pytest.mark.parametrize("value", ["5", "", True, [5], {"n": 5}])
def test_body_integers_are_json_numbers(api: Api, make_topic, value: Any) -> None:
    """A body is JSON: ``"max": "5"`` is a string, refused as the spec says (a query string,
    where everything is text, is the place for digits in a string)."""
    topic = make_topic(1)
    body = expect(api.http.post(api.url("/message"), json={"consumer": unique(), "topic": topic,
                                                           "max": value}), 400, "invalid_max")
    assert body["error"]["details"]["parameter"] == "max", body


# -- the spec and the server agree ---------------------------------------------------------------

#: (name, method, template, body, taken): for each body, the spec must allow it exactly when the
#: server takes it. ``{t}`` is a topic, ``{g}`` a consumer registered for it in cluster mode.
MSG, PRODUCE, CONSUMER = "/message", "/produce", "/admin/consumers/{consumer}"
RESET = CONSUMER + "/reset"
FETCH = {"consumer": "{g}", "topic": "{t}"}
RECORD = {"topic": "{t}", "value": "a"}
AGREEMENT: list[tuple[str, str, str, dict[str, Any], bool]] = [
    ("message-max-int", "post", MSG, {**FETCH, "max": 5}, True),
    ("message-max-whole-float", "post", MSG, {**FETCH, "max": 5.0}, True),
    ("message-max-null", "post", MSG, {**FETCH, "max": None}, True),
    ("message-max-string", "post", MSG, {**FETCH, "max": "5"}, False),
    ("message-max-fraction", "post", MSG, {**FETCH, "max": 5.5}, False),
    ("message-wait-null", "post", MSG, {**FETCH, "wait_ms": None}, True),
    ("message-wait-string", "post", MSG, {**FETCH, "wait_ms": "0"}, False),
    ("message-encoding-null", "post", MSG, {**FETCH, "encoding": None}, True),
    ("message-encoding-empty", "post", MSG, {**FETCH, "encoding": ""}, False),
    ("message-request-id-null", "post", MSG, {**FETCH, "requestId": None}, True),
    ("message-client-id-null", "post", MSG, {**FETCH, "clientId": None}, True),
    ("message-unknown-field", "post", MSG, {**FETCH, "maxx": 5}, False),
    ("produce-timestamp-null", "post", PRODUCE, {**RECORD, "timestamp": None}, True),
    ("produce-partition-null", "post", PRODUCE, {"topic": "{t}", "messages": [{"partition": None}]}, True),
    ("produce-whole-floats", "post", PRODUCE, {**RECORD, "partition": 0.0, "timestamp": 1.7e12}, True),
    ("produce-partition-fraction", "post", PRODUCE, {**RECORD, "partition": 0.5}, False),
    ("produce-partition-bool", "post", PRODUCE, {**RECORD, "partition": False}, False),
    ("produce-timestamp-string", "post", PRODUCE, {**RECORD, "timestamp": "1700000000000"}, False),
    ("patch-mode-null", "patch", CONSUMER, {"mode": None}, True),
    ("patch-timeout-whole-float", "patch", CONSUMER, {"consumeTimeoutMs": 30000.0}, True),
    ("patch-timeout-fraction", "patch", CONSUMER, {"consumeTimeoutMs": 30000.5}, False),
    ("reset-client-id-null", "post", RESET, {"topic": "{t}", "to": "latest", "clientId": None}, True),
    ("reset-client-id-empty", "post", RESET, {"topic": "{t}", "to": "latest", "clientId": ""}, False),
    ("reset-queue-whole-float", "post", RESET, {"topic": "{t}", "to": "earliest", "queue": 0.0}, True),
    ("reset-offset-whole-float", "post", RESET, {"topic": "{t}", "to": "offset", "queue": "0", "offset": 0.0},
     True),
    ("reset-offset-fraction", "post", RESET, {"topic": "{t}", "to": "offset", "queue": "0", "offset": 0.5},
     False),
    # issue 20: the server was more lenient than the spec, or the spec silent
    ("reset-queue-null", "post", RESET, {"topic": "{t}", "to": "earliest", "queue": None}, False),
    ("reset-timestamp-missing", "post", RESET, {"topic": "{t}", "to": "timestamp"}, False),
    ("reset-timestamp-null", "post", RESET, {"topic": "{t}", "to": "latest", "timestamp": None}, False),
    ("reset-offset-missing", "post", RESET, {"topic": "{t}", "to": "offset", "queue": "0"}, False),
    ("reset-offset-no-queue", "post", RESET, {"topic": "{t}", "to": "offset", "offset": 0}, False),
    ("reset-timestamp", "post", RESET, {"topic": "{t}", "to": "timestamp", "timestamp": 0}, True),
    ("produce-delay-and-deliver-at", "post", PRODUCE, {**RECORD, "delayMs": 1, "deliverAt": 1}, False),
    ("produce-delay-and-null-deliver-at", "post", PRODUCE, {**RECORD, "delayMs": 0, "deliverAt": None}, True),
    ("produce-batch-delay-and-deliver-at", "post", PRODUCE,
     {"topic": "{t}", "delayMs": 1, "deliverAt": 1, "messages": [{"value": "a"}]}, False),
    ("produce-message-delay-and-deliver-at", "post", PRODUCE,
     {"topic": "{t}", "messages": [{"value": "a", "delayMs": 1, "deliverAt": "2020-01-01T00:00:00Z"}]},
     False),
    ("patch-retry-mixed", "patch", CONSUMER, {"retry": {"delaysMs": [1], "multiplier": 2}}, False),
    ("patch-retry-switch", "patch", CONSUMER, {"retry": {"delaysMs": [1], "multiplier": None}}, True),
    ("put-burst-without-rate", "put", CONSUMER, {"topics": ["{t}"], "rateLimit": {"burst": 5}}, False),
    ("put-rate-limit-empty", "put", CONSUMER, {"topics": ["{t}"], "rateLimit": {}}, False),
    ("patch-rate-limit-empty", "patch", CONSUMER, {"rateLimit": {}}, True),
    ("patch-retry-one-field", "patch", CONSUMER, {"retry": {"deadLetterTopic": "dlq"}}, True),
    ("nack-unknown-field", "post", "/nack", {"requestId": "x", "delay": 5}, False),
]


def _fill(v: Any, subst: dict[str, str]) -> Any:
    if isinstance(v, str):
        return subst.get(v, v)
    if isinstance(v, list):
        return [_fill(x, subst) for x in v]
    if isinstance(v, dict):
        return {k: _fill(x, subst) for k, x in v.items()}
    return v


@pytest.mark.parametrize("name,method,template,body,taken", AGREEMENT, ids=[c[0] for c in AGREEMENT])
def test_spec_and_server_agree(api: Api, make_topic, name: str, method: str, template: str,
                               body: dict[str, Any], taken: bool) -> None:
    topic, g = make_topic(1), unique()
    expect(api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic], "mode": "cluster"}), 201)
    filled = _fill(body, {"{t}": topic, "{g}": g})
    assert spec_allows(method, template, filled) is taken, f"the spec {'refuses' if taken else 'allows'} it"
    r = api.http.request(method.upper(), api.url(template.replace("{consumer}", g)), json=filled)
    assert (r.status_code < 400) is taken, (r.status_code, r.text)


def test_null_means_absent_on_produce(api: Api, make_topic) -> None:
    """``partition: null`` and ``timestamp: null`` are "not given", as ``key``, ``headers`` and
    ``producer`` are: the partitioner picks, and the producer stamps the time."""
    topic = make_topic(1)
    body = expect(api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": "a", "partition": None, "timestamp": None}]}), 200)
    assert body["results"] == [{"partition": 0, "offset": 0}]
    g = unique()
    expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"), json={"topic": topic, "to": "earliest"}),
           200)
    got = expect(api.message(consumer=g, topic=topic), 200)
    assert got["messages"][0]["timestamp"] > 1_700_000_000_000, got


def test_reset_queue_as_a_whole_number(api: Api, make_topic) -> None:
    topic, g = make_topic(2), unique()
    body = expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                                json={"topic": topic, "to": "earliest", "queue": 1.0}), 200)
    assert [q["queue"] for q in body["queues"]] == ["1"], body


# -- requestIds ----------------------------------------------------------------------------------

def test_request_ids_have_one_spelling_and_say_what_is_wrong(api: Api, make_topic) -> None:
    topic = make_topic(1)
    g = unique()
    api.produce(topic, ["x"])
    expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                         json={"topic": topic, "to": "earliest"}), 200)
    rid = expect(api.message(consumer=g, topic=topic), 200)["requestId"]
    for bad in (rid + "==", rid + "=", rid + "\n", " " + rid, rid[:-1] + "$"):
        body = expect(api.ack(bad), 400, "invalid_request_id")
        assert "malformed" in body["error"]["message"], body
    body = expect(api.ack("garbage"), 400, "invalid_request_id")
    assert "malformed" in body["error"]["message"], body
    # signed with the gateway's key, yet with a non-integer offset: a 400, never a 500
    codec = RequestIdCodec(HMAC_KEY)
    good = codec.encode(BatchRef("kafka", g, "", topic, "0", 0, 1, 1, 1))
    raw = base64.urlsafe_b64decode(good + "=" * (-len(good) % 4))
    payload = raw[:-_SIG_BYTES].replace(b"\x1f0\x1f1\x1f", b"\x1f1.5\x1f1\x1f", 1)  # offset "1.5"
    assert payload != raw[:-_SIG_BYTES]
    bad = base64.urlsafe_b64encode(payload + codec._sign(payload)).rstrip(b"=").decode()
    body = expect(api.ack(bad), 400, "invalid_request_id")
    assert "malformed" in body["error"]["message"], body
    expect(api.ack(rid), 200)


def _signed(codec: RequestIdCodec, fields: list[str]) -> str:
    """A requestId made with the gateway's key from any fields: what a leaked key could make."""
    payload = "\x1f".join(fields).encode()
    return base64.urlsafe_b64encode(payload + codec._sign(payload)).rstrip(b"=").decode()


@pytest.mark.parametrize("number", ["1.5", "", "+1", "٣", "9223372036854775808", "-9223372036854775809",
                                    "99999999999999999999"])
def test_signed_request_ids_with_bad_numbers_are_malformed(number: str) -> None:
    """Every number of a requestId must be an int64 (what the Lua scripts and Redis can hold)."""
    codec = RequestIdCodec("k")
    fields = ["1", "kafka", "g", "", "t", "0", "0", "1", "1", "1"]
    assert codec.decode(_signed(codec, fields)) == BatchRef("kafka", "g", "", "t", "0", 0, 1, 1, 1)
    for i in (6, 7, 8, 9):
        with pytest.raises(Invalid, match="malformed"):
            codec.decode(_signed(codec, [*fields[:i], number, *fields[i + 1:]]))


def test_request_id_decoding_raises_only_the_domain_error() -> None:
    """Seeded mutations of a good requestId, signed and unsigned: each decodes or is a 400."""
    codec = RequestIdCodec("k")
    good = codec.encode(BatchRef("kafka", "g", "c", "t", "0", 10, 20, 30, 40))
    raw = base64.urlsafe_b64decode(good + "=" * (-len(good) % 4))
    rnd = random.Random(10)
    alphabet = "AZaz09-_=+/ .\n\x00é\x1f"
    for _ in range(3000):
        kind = rnd.randrange(4)
        if kind == 0:  # text edits
            chars = list(good)
            for _ in range(rnd.randrange(1, 4)):
                chars.insert(rnd.randrange(len(chars) + 1), rnd.choice(alphabet))
            text = "".join(chars)
        elif kind == 1:  # byte edits, re-encoded
            b = bytearray(raw)
            b[rnd.randrange(len(b))] = rnd.randrange(256)
            text = base64.urlsafe_b64encode(bytes(b)).rstrip(b"=").decode()
        else:  # payload edits, re-signed: a leaked key's worst
            payload = bytearray(raw[:-_SIG_BYTES])
            for _ in range(rnd.randrange(1, 3)):
                payload[rnd.randrange(len(payload))] = rnd.choice(b"0123456789-.\x1f\xff a")
            signed = bytes(payload) + codec._sign(bytes(payload))
            text = base64.urlsafe_b64encode(signed).rstrip(b"=").decode()
        try:
            codec.decode(text)
        except Invalid as e:
            assert e.code == "invalid_request_id"


# -- parameters ----------------------------------------------------------------------------------

def test_unknown_parameters_are_refused_and_lock_nothing(api: Api, make_topic) -> None:
    topic = make_topic(1)
    g = unique()
    api.produce(topic, [str(i) for i in range(40)])
    expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                         json={"topic": topic, "to": "earliest"}), 200)
    body = expect(api.message(consumer=g, topic=topic, maxx=5), 400, "unknown_parameter")
    assert body["error"]["details"]["parameters"] == ["maxx"]
    expect(api.http.post(api.url("/message"), json={"consumer": g, "topic": topic, "wait": 5}),
           400, "unknown_parameter")
    expect(api.http.post(api.url("/ack"), json={"requestId": "x", "extra": 1}), 400, "unknown_parameter")
    got = expect(api.message(consumer=g, topic=topic, max=5), 200)  # nothing was locked before
    assert got["status"] == "ok" and len(got["messages"]) == 5


def test_repeated_parameters_are_refused(api: Api, make_topic) -> None:
    """``max=1&max=1000``: which one counts is a guess a proxy or cache may make differently."""
    topic = make_topic(1)
    url = api.url("/message")
    body = expect(api.http.get(url, params=[("consumer", unique()), ("topic", topic), ("max", "1"),
                                            ("max", "1000")]), 400, "repeated_parameter")
    assert body["error"]["details"]["parameters"] == ["max"]
    expect(api.http.post(api.url("/ack"), params=[("requestId", "a"), ("requestId", "b")]),
           400, "repeated_parameter")
    expect(api.http.request("DELETE", api.url(f"/admin/consumers/{unique()}"),
                            params=[("deleteOffsets", "false"), ("deleteOffsets", "true")]),
           400, "repeated_parameter")
    # backlog's consumer is a list: repeating it is how several are asked for
    a, b = unique(), unique()
    for g in (a, b):  # names never seen are a 404 there
        api.config(g, start="earliest")
    got = expect(api.http.get(api.url("/admin/backlog"), params=[("consumer", a), ("consumer", b),
                                                                   ("age", "false")]), 200)
    assert [c["consumer"] for c in got["consumers"]] == sorted([a, b])


@pytest.mark.parametrize("method,path,params", [
    ("DELETE", "/admin/consumers/{g}", {"deleteOffset": "true"}),
    ("GET", "/admin/backlog", {"consumers": "x"}),
    ("GET", "/admin/alerts", {"al": "true"}),
    ("POST", "/admin/alerts/evaluate", {"al": "true"}),
    ("POST", "/unlock", {"requestId": "x", "request_id": "x"}),
])
def test_admin_query_typos_are_refused(api: Api, make_topic, method: str, path: str,
                                       params: dict[str, str]) -> None:
    """A typo must not silently change what a call does: ``deleteOffset=true`` would unregister
    the consumer and keep its offsets."""
    topic, g = make_topic(1), unique()
    expect(api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic]}), 201)
    body = expect(api.http.request(method, api.url(path.replace("{g}", g)), params=params),
                  400, "unknown_parameter")
    assert set(body["error"]["details"]["parameters"]) <= set(params), body
    assert expect(api.http.get(api.url(f"/admin/consumers/{g}")), 200)["registered"] is True


def test_nulls_and_bodies_as_the_spec_says(api: Api, make_topic) -> None:
    topic = make_topic(1)
    g = unique()
    expect(api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic], "mode": "broadcast"}), 201)
    expect(api.http.patch(api.url(f"/admin/consumers/{g}")), 400, "missing_body")
    body = expect(api.http.patch(api.url(f"/admin/consumers/{g}"), json={"mode": None}), 200)
    assert body["mode"] == "cluster"
    expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                         json={"topic": topic, "to": "latest", "clientId": None}), 200)
    expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"),
                         json={"topic": topic, "to": "latest", "clientId": ""}), 400, "missing_client_id")
    expect(api.http.post(api.url("/message"), json={"consumer": g, "topic": topic, "requestId": None}), 200)
    expect(api.http.post(api.url("/produce")), 400, "missing_body")
    expect(api.message(consumer=g, topic=topic, encoding=""), 400, "invalid_encoding")
