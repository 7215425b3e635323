"""Input the spec does not allow is refused, and input it allows is taken (issue 10).

Before: integer parameters went through Python's ``int()`` (``+5``, `` 5``, ``1_0``, ``٣``,
``１`` passed), whole-number floats such as ``100.0`` were refused in bodies, a requestId with
``==`` appended still verified, ``garbage`` was said to have a bad signature, unknown /message
parameters were ignored (``maxx=5`` locked a queue with 32 records), a PATCH without a body
passed, ``mode: null`` in a PATCH failed, and ``timestamp: null`` was taken on produce.
"""

from __future__ import annotations

import base64

import httpx
import pytest

from gateway.core.requestid import _SIG_BYTES, BatchRef, RequestIdCodec

from .helpers import HMAC_KEY, Api, unique


def expect(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    if code is not None:
        assert body["error"]["code"] == code, r.text
    return body


@pytest.mark.parametrize("raw", ["+5", " 5", "5 ", "1_0", "٣", "１", "5.0", "0x5", "", "-"])
def test_query_integers_are_ascii_digits_only(api: Api, make_topic, raw: str) -> None:
    topic = make_topic(1)
    r = api.http.get(api.url("/message"), params={"consumer": unique(), "topic": topic, "max": raw})
    if raw == "":  # an empty parameter is the default, as an absent one
        expect(r, 200)
    else:
        expect(r, 400, "invalid_max")


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


def test_null_timestamp_is_refused_on_produce(api: Api, make_topic) -> None:
    topic = make_topic(1)
    expect(api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": "a", "timestamp": None}]}), 400, "invalid_timestamp")


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
