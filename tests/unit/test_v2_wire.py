"""The REST v2 wire format (gateway/api/v2_wire.py): media types, produce bodies, instance
requests, records out and the error shape, without a server."""

from __future__ import annotations

import base64

import orjson
import pytest

from gateway.api.errors import ApiError
from gateway.api.http import JSON
from gateway.api.v2_wire import (
    V2,
    RawRecord,
    check_request_type,
    create_request,
    error_response,
    offsets_request,
    parse_produce,
    parse_schema_produce,
    produce_format,
    produced_body,
    records_body,
    records_format,
)
from gateway.broker import BrokerUnavailable, ProduceError, ProduceResult, Record
from gateway.core.errors import Invalid, TooLarge
from gateway.core.fetch import Batch, Fetched, FetchStatus
from gateway.core.instances import Format
from gateway.core.produce import Produced
from gateway.core.schemas import SchemaSpec


def test_the_produce_format_is_the_content_types_embedded_one() -> None:
    assert produce_format("application/vnd.kafka.json.v2+json; charset=utf-8", False) is Format.JSON
    assert produce_format("application/vnd.kafka.binary.v2+json", False) is Format.BINARY
    for bad in (None, "application/json", V2, "application/vnd.kafka.avro.v2+json"):
        with pytest.raises(ApiError) as e:
            produce_format(bad, False)
        assert e.value.status == 415
    # with a schema registry: its formats too
    assert produce_format("application/vnd.kafka.avro.v2+json", True) is Format.AVRO
    assert produce_format("application/vnd.kafka.protobuf.v2+json", True) is Format.PROTOBUF
    assert produce_format("application/vnd.kafka.jsonschema.v2+json", True) is Format.JSONSCHEMA
    with pytest.raises(ApiError):
        produce_format("application/json", True)


def test_consumer_requests_take_any_v2_type_json_or_none() -> None:
    for ok in (None, "", V2, "application/json", "application/vnd.kafka.json.v2+json"):
        check_request_type(ok)
    with pytest.raises(ApiError):
        check_request_type("text/plain")


def test_accept_picks_the_records_format() -> None:
    assert records_format("application/vnd.kafka.binary.v2+json") is Format.BINARY
    assert records_format(V2) is Format.BINARY  # as kafka-rest: plain v2 is binary
    assert records_format("application/vnd.kafka.json.v2+json, */*") is Format.JSON
    assert records_format("*/*") is None and records_format(None) is None
    # the instance decides whether it may: core/instances.py answers format_mismatch (406)
    assert records_format("application/vnd.kafka.avro.v2+json") is Format.AVRO


def test_json_values_are_stored_as_their_json_text_binary_as_bytes() -> None:
    m = parse_produce({"records": [{"key": "k", "value": {"a": 1}, "partition": 2}]}, Format.JSON,
                      None, 10)[0]
    assert (m.key, m.value, m.queue) == (b'"k"', b'{"a":1}', "2")
    m = parse_produce({"records": [{"value": base64.b64encode(b"\x00").decode()}]},
                      Format.BINARY, "1", 10)[0]
    assert (m.key, m.value, m.queue) == (None, b"\x00", "1")  # the path's partition
    m = parse_produce({"records": [{"value": None, "partition": None}], "value_schema_id": 3},
                      Format.JSON, "1", 10)[0]
    assert (m.value, m.queue) == (None, "1")


@pytest.mark.parametrize("body", [[], {"records": []}, {"records": [1]}, {"records": [{"x": 1}]},
                                  {"records": [{"value": 1}], "extra": 1},
                                  {"records": [{"value": 1, "partition": -1}]}])
def test_bad_produce_bodies(body: object) -> None:
    with pytest.raises(Invalid):
        parse_produce(body, Format.JSON, None, 10)


def test_too_many_records() -> None:
    with pytest.raises(TooLarge):
        parse_produce({"records": [{"value": 1}] * 3}, Format.JSON, None, 2)


def test_the_produce_answer_has_an_entry_per_record() -> None:
    body = produced_body(Produced("t", [
        ProduceResult("0", 5), ProduceResult(error_code=ProduceError.UNKNOWN_PARTITION, error="no"),
        ProduceResult(error_code=ProduceError.BROKER_TIMEOUT, error="slow"),
        ProduceResult(error_code=ProduceError.MESSAGE_TOO_LARGE, error="big")]))
    assert body["offsets"] == [
        {"partition": 0, "offset": 5, "error_code": None, "error": None},
        {"partition": None, "offset": None, "error_code": 40402, "error": "no"},
        {"partition": None, "offset": None, "error_code": 50003, "error": "slow"},
        {"partition": None, "offset": None, "error_code": 50002, "error": "big"}]


def test_an_instance_request_in_confluents_and_strimzis_words() -> None:
    args = create_request({"name": "i", "format": "JSON", "auto.offset.reset": "smallest",
                           "enable.auto.commit": False, "max.poll.records": 5,
                           "consumer.request.timeout.ms": "250"})
    assert args == {"name": "i", "fmt": Format.JSON, "reset": "earliest", "auto_commit": False,
                    "wait_ms": 250, "max_records": 5}
    assert create_request({})["fmt"] is Format.BINARY and create_request({})["auto_commit"]
    for bad in ({"format": "xml"}, {"auto.offset.reset": "none"}, {"auto.commit.enable": "yes"},
                {"fetch.min.bytes": 10**9}, {"nmae": "x"}):
        with pytest.raises(Invalid):
            create_request(bad)


def test_offsets_and_partitions_requests() -> None:
    assert offsets_request({}, "offsets") is None
    assert offsets_request({"offsets": [{"topic": "t", "partition": 0, "offset": 4}]},
                           "offsets") == [("t", "0", 4)]
    assert offsets_request({"partitions": [{"topic": "t", "partition": "broker-a.1"}]},
                           "partitions") == [("t", "broker-a.1", -1)]
    for bad in ({"offsets": [{"topic": "t", "partition": 0}]}, {"offsets": 1},
                {"offsets": [{"partition": 0, "offset": 1}]}, {"offsets": [], "x": 1}):
        with pytest.raises(Invalid):
            offsets_request(bad, "offsets")


def _fetched(*values: bytes | None, key: bytes = b'"k"') -> Fetched:
    recs = [Record(i, key, v, (), 0) for i, v in enumerate(values)]
    return Fetched(FetchStatus.OK, "t", Batch("rid", "t", "3", 0, len(recs), len(recs), False,
                                              1000, recs))


def test_records_out_in_either_format() -> None:
    assert orjson.loads(records_body(_fetched(b'{"a":1}', None), Format.JSON)) == [
        {"topic": "t", "key": "k", "value": {"a": 1}, "partition": 3, "offset": 0},
        {"topic": "t", "key": "k", "value": None, "partition": 3, "offset": 1}]
    out = orjson.loads(records_body(_fetched(b"\xff", key=b"k"), Format.BINARY))
    assert out == [{"topic": "t", "key": "aw==", "value": "/w==", "partition": 3, "offset": 0}]
    assert records_body(Fetched(FetchStatus.EMPTY, "t"), Format.JSON) == b"[]"
    with pytest.raises(Invalid) as e:
        records_body(_fetched(b"not json"), Format.JSON)
    assert e.value.code == "json_conversion"
    assert "at t partition 3 offset 0 is not JSON" in str(e.value)  # which of the partitions


def test_the_error_shape_keeps_the_status_table_and_names_the_code() -> None:
    def v2(status: int, code: str, exc: BaseException | None = None) -> tuple[int, dict[str, object]]:
        exc = exc or Exception()
        r = error_response(JSON({"error": {"code": code, "message": "m"}}, status_code=status,
                                headers={"Retry-After": "1"} if status == 503 else None), exc)
        return r.status_code, orjson.loads(bytes(r.body))
    assert v2(404, "unknown_topic") == (404, {"error_code": 40401, "message": "m",
                                              "code": "unknown_topic"})
    assert v2(400, "invalid_records")[0:2] == (422, {"error_code": 422, "message": "m",
                                                     "code": "invalid_records"})
    assert v2(400, "invalid_json")[1]["error_code"] == 400
    assert v2(401, "invalid_api_key")[1]["error_code"] == 40101
    assert v2(503, "unavailable", BrokerUnavailable())[1]["error_code"] == 50302
    assert v2(503, "unavailable")[1]["error_code"] == 50301
    assert v2(500, "internal")[1]["error_code"] == 50002


def test_a_schema_produce_names_its_schemas_by_text_or_id() -> None:
    key, value, raw = parse_schema_produce(
        {"records": [{"key": 1, "value": {"a": 1}, "partition": 2}, {"value": None}],
         "value_schema": '"int"', "key_schema_id": 7}, "0", 10)
    assert key == SchemaSpec(id=7) and value == SchemaSpec(text='"int"')
    assert raw == [RawRecord(1, {"a": 1}, "2"), RawRecord(None, None, "0")]
    assert parse_schema_produce({"records": [{"value": 1}]}, None, 10)[:2] == (None, None)
    for bad in ({"value_schema": '"int"', "value_schema_id": 1}, {"value_schema": 3},
                {"value_schema": " "}, {"key_schema_id": "x"}, {"key_schema_id": -1}):
        with pytest.raises(Invalid) as e:
            parse_schema_produce({"records": [{"value": 1}], **bad}, None, 10)
        assert e.value.code == "invalid_schema"
