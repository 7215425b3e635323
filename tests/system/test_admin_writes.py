"""Admin writes change what they name and nothing else, refuse internal topics, and say when
they created a consumer; views of names never seen are 404 (issue 20).

Before: ``mqgw admin consumers set --retry-max-attempts 3`` dropped ``delaysMs`` and
``deadLetterTopic`` (a PATCH replaced ``retry`` whole), ``--alert-backlog`` dropped
``oldestAgeMs``, and ``--burst`` alone sent nothing and exited 0. A ``deadLetterTopic`` could
be a delay level, a retry topic or ``__consumer_offsets`` (the relay then dropped those dead
letters), a policy could mix ``delaysMs`` with ``initialDelayMs``, and in open mode ``pause
<typo>`` made a ghost consumer while the views of unknown names answered 200.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from gateway.cli.main import main as mqgw_main

from ..support import Api, unique
from ..support.openapi import expect, spec_allows

#: A registration with every setting set, so that a change of one shows in no other.
FULL: dict[str, Any] = {
    "mode": "cluster", "consumeTimeoutMs": 30_000, "maxBatch": 100, "start": "earliest",
    "rateLimit": {"messagesPerSecond": 50.0, "burst": 7},
    "retry": {"maxAttempts": 4, "delaysMs": [1000, 2000], "deadLetterTopic": "dlq-kept"},
    "alerts": {"backlogMessages": 10, "oldestAgeMs": 60_000},
}

#: ``mqgw admin consumers set`` options, each with the one change it must make to the view.
CLI_SETTINGS: list[tuple[list[str], Callable[[dict[str, Any]], None]]] = [
    (["--mode", "broadcast"], lambda v: v.update(mode="broadcast")),
    (["--timeout-ms", "4000"], lambda v: v.update(consumeTimeoutMs=4000)),
    (["--max-batch", "9"], lambda v: v.update(maxBatch=9)),
    (["--start", "latest"], lambda v: v.update(start="latest")),
    (["--rate", "20"], lambda v: v["rateLimit"].update(messagesPerSecond=20.0)),
    (["--burst", "3"], lambda v: v["rateLimit"].update(burst=3)),
    (["--no-rate-limit"], lambda v: v.update(rateLimit=None)),
    (["--alert-backlog", "99"], lambda v: v["alerts"].update(backlogMessages=99)),
    (["--alert-age-ms", "5000"], lambda v: v["alerts"].update(oldestAgeMs=5000)),
    (["--retry-max-attempts", "3"], lambda v: v["retry"].update(maxAttempts=3)),
    (["--retry-delays-ms", "10,20,30"], lambda v: v["retry"].update(delaysMs=[10, 20, 30])),
    (["--dead-letter-topic", "dlq-new"], lambda v: v["retry"].update(deadLetterTopic="dlq-new")),
]

#: Fields of the view that every write moves, or that the test does not set.
_VOLATILE = ("updatedMs", "createdMs", "created")


def settings_of(view: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in view.items() if k not in _VOLATILE}


def cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, Any, str]:
    """``mqgw admin --url URL ARGS`` in this process: (exit code, JSON printed, stderr)."""
    capsys.readouterr()
    code = mqgw_main(["admin", "--url", url, "--key", "", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


@pytest.mark.parametrize("args,change", CLI_SETTINGS, ids=[a[0].lstrip("-") for a, _ in CLI_SETTINGS])
def test_cli_set_changes_only_the_setting_it_names(api: Api, make_topic, capsys, args: list[str],
                                                   change: Callable[[dict[str, Any]], None]) -> None:
    topic, g = make_topic(1), unique()
    before = expect(api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic], **FULL}), 201)
    code, after, err = cli(capsys, api.urls[0], "consumers", "set", g, *args)
    assert code == 0, err
    want = settings_of(before)
    change(want)
    assert settings_of(after) == want
    assert settings_of(expect(api.http.get(api.url(f"/admin/consumers/{g}")), 200)) == want


def test_cli_set_refuses_what_would_change_nothing(api: Api, make_topic, capsys) -> None:
    topic, g = make_topic(1), unique()
    expect(api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic]}), 201)
    code, _, err = cli(capsys, api.urls[0], "consumers", "set", g)
    assert code == 2 and "nothing to change" in err
    # a burst needs a rate to go with: said, not dropped
    code, _, err = cli(capsys, api.urls[0], "consumers", "set", g, "--burst", "5")
    assert code == 1 and "invalid_rate_limit" in err
    code, _, err = cli(capsys, api.urls[0], "consumers", "register", unique(), "--topic", topic,
                       "--burst", "5")
    assert code == 1 and "invalid_rate_limit" in err
    assert expect(api.http.get(api.url(f"/admin/consumers/{g}")), 200)["rateLimit"] is None


@pytest.mark.parametrize("patch,change", [
    ({"retry": {"maxAttempts": 9}}, lambda v: v["retry"].update(maxAttempts=9)),
    ({"retry": {"deadLetterTopic": None}}, lambda v: v["retry"].pop("deadLetterTopic")),
    ({"retry": None}, lambda v: v.update(retry=None)),
    ({"retry": {}}, lambda v: None),
    ({"alerts": {"oldestAgeMs": None}}, lambda v: v["alerts"].pop("oldestAgeMs")),
    ({"alerts": {"backlogMessages": 3}}, lambda v: v["alerts"].update(backlogMessages=3)),
    ({"rateLimit": {"burst": None}}, lambda v: v["rateLimit"].update(burst=50)),  # the default
    ({"rateLimit": {"messagesPerSecond": 2}}, lambda v: v["rateLimit"].update(messagesPerSecond=2.0)),
], ids=["retry-one", "retry-null-one", "retry-null", "retry-empty", "alerts-null-one", "alerts-one",
        "burst-null", "rate-one"])
def test_patch_merges_inside_objects(api: Api, make_topic, patch: dict[str, Any],
                                     change: Callable[[dict[str, Any]], None]) -> None:
    """PATCH is a JSON merge patch, inside rateLimit, retry and alerts too."""
    topic, g = make_topic(1), unique()
    before = expect(api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic], **FULL}), 201)
    want = settings_of(before)
    change(want)
    assert settings_of(expect(api.http.patch(api.url(f"/admin/consumers/{g}"), json=patch), 200)) == want


def test_a_retry_policy_is_a_schedule_or_exponential_not_both(api: Api, make_topic) -> None:
    topic, g = make_topic(1), unique()
    url = api.url(f"/admin/consumers/{g}")
    mixed = {"topics": [topic], "retry": {"delaysMs": [1000], "initialDelayMs": 500}}
    expect(api.http.put(url, json=mixed), 400, "conflicting_retry")
    exponential = {"initialDelayMs": 500, "multiplier": 3}
    expect(api.http.put(url, json={"topics": [topic], "retry": exponential}), 201)
    # a PATCH that would leave both is refused too; nulling the others switches
    expect(api.http.patch(url, json={"retry": {"delaysMs": [1000]}}), 400, "conflicting_retry")
    body = expect(api.http.patch(url, json={"retry": {"delaysMs": [1000], "initialDelayMs": None,
                                                      "multiplier": None}}), 200)
    assert body["retry"] == {"delaysMs": [1000]}


INTERNAL = ["mqgw.delay.1000ms", "mqgw.retry.g.t.0123456789", "__consumer_offsets", "__transaction_state"]


@pytest.mark.parametrize("internal", INTERNAL)
def test_internal_topics_are_refused_wherever_a_topic_is_named(api: Api, make_topic, internal: str) -> None:
    topic, g, p = make_topic(1), unique(), unique("p")
    url = api.url(f"/admin/consumers/{g}")
    for bad in ({"topics": [topic, internal]}, {"topics": [topic], "retry": {"deadLetterTopic": internal}}):
        expect(api.http.put(url, json=bad), 403, "internal_topic")
    expect(api.http.put(url, json={"topics": [topic]}), 201)
    expect(api.http.patch(url, json={"retry": {"deadLetterTopic": internal}}), 403, "internal_topic")
    expect(api.http.patch(url, json={"topics": [internal]}), 403, "internal_topic")
    expect(api.http.put(api.url(f"/admin/producers/{p}"), json={"topics": [internal]}), 403, "internal_topic")
    expect(api.http.post(api.url(f"/admin/consumers/{g}/reset"), json={"topic": internal, "to": "latest"}),
           403, "internal_topic")
    expect(api.http.post(api.url("/produce"), json={"topic": internal, "value": "x"}), 403, "internal_topic")
    expect(api.message(consumer=unique(), topic=internal), 403, "internal_topic")
    # nothing of it was kept
    view = expect(api.http.get(url), 200)
    assert view["topics"] == [topic] and view["retry"] is None


def test_redrive_passes_over_dead_letters_that_name_an_internal_origin(api: Api, make_topic) -> None:
    """A dead letter's origin comes from its header; one naming an internal topic (written to
    the dead-letter topic by hand) is not sent there."""
    topic, dlq, g = make_topic(1), make_topic(1), unique()
    api.config(g, retry={"deadLetterTopic": dlq})
    for origin in ("mqgw.delay.1000ms", "__consumer_offsets"):
        api.produce(dlq, ["forged"], headers=[["mqgw-origin-topic", origin], ["mqgw-consumer", g]])
    api.produce(dlq, ["real"], headers=[["mqgw-origin-topic", topic], ["mqgw-consumer", g]])
    page = expect(api.http.get(api.url(f"/admin/consumers/{g}/dead-letters")), 200)
    assert page["count"] == 3
    r = expect(api.http.post(api.url(f"/admin/consumers/{g}/dead-letters/redrive"), json={"target": "topic"}),
               200)
    assert r["redriven"] == 1
    assert expect(api.http.get(api.url(f"/admin/consumers/{g}/dead-letters")), 200)["count"] == 0
    reader = unique()
    api.config(reader, start="earliest")
    back = api.message(consumer=reader, topic=topic, wait_ms=5000).json()
    assert [m["value"] for m in back["messages"]] == ["real"], back


# -- open mode: names never seen -------------------------------------------------------------------

def test_views_of_names_never_seen_are_404(api: Api, make_topic) -> None:
    ghost = unique("typo")
    for path in (f"/admin/consumers/{ghost}", f"/consumers/{ghost}/queues", f"/consumers/{ghost}/clients",
                 f"/consumers/{ghost}/clients/c1/queues", f"/admin/consumers/{ghost}/dead-letters"):
        expect(api.http.get(api.url(path)), 404, "unknown_consumer")
    expect(api.http.get(api.url("/admin/backlog"), params={"consumer": ghost}), 404, "unknown_consumer")
    expect(api.http.post(api.url(f"/admin/consumers/{ghost}/dead-letters/redrive")), 404, "unknown_consumer")
    # looking made nothing
    names = {c["consumer"] for c in expect(api.http.get(api.url("/admin/consumers")), 200)["consumers"]}
    assert ghost not in names
    # a consumer that only fetched (open mode, no settings) is known, and shown
    topic, g = make_topic(1), unique()
    expect(api.message(consumer=g, topic=topic), 200)
    view = expect(api.http.get(api.url(f"/admin/consumers/{g}")), 200)
    assert view["registered"] is False and "created" not in view
    assert expect(api.http.get(api.url(f"/consumers/{g}/queues")), 200)["queues"]
    expect(api.http.get(api.url(f"/consumers/{g}/clients/c1/queues")), 404, "unknown_client")


def test_writes_to_names_never_seen_say_they_created_them(api: Api, make_topic, capsys) -> None:
    topic = make_topic(1)
    ghost = unique("typo")
    assert expect(api.http.post(api.url(f"/admin/consumers/{ghost}/pause")), 200) == \
        {"consumer": ghost, "paused": True, "created": True}
    assert expect(api.http.post(api.url(f"/admin/consumers/{ghost}/resume")), 200) == \
        {"consumer": ghost, "paused": False}  # it exists now
    ghost = unique("typo")
    url = api.url(f"/admin/consumers/{ghost}")
    assert expect(api.http.patch(url, json={"maxBatch": 5}), 200)["created"] is True
    assert "created" not in expect(api.http.patch(url, json={"maxBatch": 6}), 200)
    ghost = unique("typo")
    reset = api.http.post(api.url(f"/admin/consumers/{ghost}/reset"), json={"topic": topic, "to": "latest"})
    assert expect(reset, 200)["created"] is True
    # a consumer that fetched is not created by a pause
    g = unique()
    expect(api.message(consumer=g, topic=topic), 200)
    assert "created" not in expect(api.http.post(api.url(f"/admin/consumers/{g}/pause")), 200)
    # and the command line says so
    ghost = unique("typo")
    code, body, err = cli(capsys, api.urls[0], "pause", ghost)
    assert code == 0 and body["created"] is True and "created it" in err and ghost in err
    code, body, err = cli(capsys, api.urls[0], "pause", ghost)
    assert code == 0 and "created" not in body and err == ""


def test_dead_letter_partition_is_a_kafka_partition(api: Api, make_topic) -> None:
    """Beyond int32 it was "must be a non-negative integer" (query) or taken (body)."""
    g = unique()
    api.config(g, start="earliest")
    for raw in ("2147483648", "99999999999999999999999"):
        r = api.http.get(api.url(f"/admin/consumers/{g}/dead-letters"), params={"partition": raw})
        body = expect(r, 400, "invalid_partition")
        assert "2147483647" in body["error"]["message"], body
    r = api.http.post(api.url(f"/admin/consumers/{g}/dead-letters/redrive"), json={"partition": 2**31})
    assert "2147483647" in expect(r, 400, "invalid_partition")["error"]["message"]
    r = api.http.get(api.url(f"/admin/consumers/{g}/dead-letters"), params={"partition": "2147483647"})
    expect(r, 200)


def test_nack_takes_the_request_id_from_the_query_and_nothing_else(api: Api, make_topic) -> None:
    """The spec required requestId in the body, which the server takes from the query too."""
    for op in ("/ack", "/nack", "/unlock"):
        assert spec_allows("post", op, {}) and spec_allows("post", op, {"requestId": None})
        assert not spec_allows("post", op, {"requestId": ""})
    topic, g = make_topic(1), unique()
    api.config(g, start="earliest")
    api.produce(topic, ["a"])
    rid = api.message(consumer=g, topic=topic).json()["requestId"]
    # delayMs in the query was ignored: refused now
    r = api.http.post(api.url("/nack"), params={"requestId": rid, "delayMs": "5000"})
    expect(r, 400, "unknown_parameter")
    r = api.http.post(api.url("/nack"), params={"requestId": rid}, content=b"")
    assert expect(r, 200)["result"] == "committed"


def test_cli_reset_dry_run_moves_nothing(api: Api, make_topic, capsys) -> None:
    topic, g = make_topic(1), unique()
    api.config(g, start="earliest")
    api.produce_exact(topic, ["a", "b"])
    api.ack(api.message(consumer=g, topic=topic, max=10).json()["requestId"])
    code, body, err = cli(capsys, api.urls[0], "reset", g, "--topic", topic, "--to", "earliest",
                          "--dry-run")
    assert code == 0, err
    assert body["dryRun"] is True and [(q["from"], q["to"]) for q in body["queues"]] == [(2, 0)]
    assert api.message(consumer=g, topic=topic).json()["status"] == "empty"  # still at 2
