"""The wire format: round trips, and every malformed entry refused with a ProtocolError."""

from __future__ import annotations

import json
from typing import Any

import pytest

from interlude.api.bus import (
    CALL_STREAM,
    PROTOCOL_VERSION,
    ProtocolError,
    ToolCall,
    ToolResult,
    result_stream,
)

TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


def make_call(**overrides: Any) -> ToolCall:
    fields: dict[str, Any] = {
        "call_id": "c1",
        "session_id": "s1",
        "engine_id": "e1",
        "tool": "calculator",
        "arguments": {"expression": "1+2", "nested": [1, {"a": None}]},
        "deadline": 1_700_000_010.5,
        "trace": TRACE,
        "issued_at": 1_700_000_000.25,
    }
    return ToolCall(**{**fields, **overrides})


def body_of(message: ToolCall | ToolResult) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(message.encode()["body"])
    return body


def test_names_are_fixed() -> None:
    assert CALL_STREAM == "interlude:tool-calls"
    assert result_stream("engine-7") == "interlude:tool-results:engine-7"
    with pytest.raises(ValueError):
        result_stream("")


def test_call_round_trip_str_and_bytes() -> None:
    call = make_call()
    fields = call.encode()
    assert set(fields) == {"v", "body"}
    assert fields["v"] == str(PROTOCOL_VERSION)
    assert ToolCall.decode(fields) == call
    # A client without decode_responses hands back bytes keys and values.
    raw = {k.encode(): v.encode() for k, v in fields.items()}
    assert ToolCall.decode(raw) == call


def test_result_round_trip_and_constructors() -> None:
    call = make_call()
    ok = ToolResult.success(call, "3", 1_700_000_001.0)
    bad = ToolResult.failure(call, "tool_error", "ZeroDivisionError: division by zero", 2.0)
    for result in (ok, bad):
        assert ToolResult.decode(result.encode()) == result
        assert result.trace == TRACE
        assert (result.call_id, result.session_id, result.engine_id) == ("c1", "s1", "e1")
    assert ok.ok and ok.error == "" and ok.error_kind == ""
    assert not bad.ok and bad.error_kind == "tool_error" and bad.content == ""


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"call_id": ""}, "call_id"),
        ({"tool": 3}, "tool"),
        ({"arguments": ["x"]}, "arguments"),
        ({"deadline": float("nan")}, "deadline"),
        ({"deadline": True}, "deadline"),
        ({"deadline": 1.0, "issued_at": 2.0}, "deadline"),
        ({"trace": {"traceparent": 1}}, "trace"),
    ],
)
def test_invalid_call_raises_value_error(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_call(**overrides)


def test_result_invariants() -> None:
    call = make_call()
    with pytest.raises(ValueError, match="empty when ok"):
        ToolResult("c", "s", "e", True, "x", "timeout", 1.0)
    with pytest.raises(ValueError, match="must start with one of"):
        ToolResult("c", "s", "e", False, "", "oops: nope", 1.0)
    with pytest.raises(ValueError, match="must start with one of"):
        ToolResult.failure(call, "", "", 1.0)
    with pytest.raises(ValueError, match="ok must be a bool"):
        ToolResult("c", "s", "e", 1, "x", "", 1.0)  # type: ignore[arg-type]


def test_unserializable_arguments_fail_at_encode() -> None:
    with pytest.raises(ValueError, match="JSON"):
        make_call(arguments={"x": object()}).encode()
    with pytest.raises(ValueError, match="JSON"):
        make_call(arguments={"x": float("inf")}).encode()


def test_wrong_version_is_refused() -> None:
    fields = make_call().encode()
    with pytest.raises(ProtocolError, match=r"version '2'.*speaks 1"):
        ToolCall.decode({**fields, "v": "2"})
    with pytest.raises(ProtocolError, match="'v'"):
        ToolCall.decode({"body": fields["body"]})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"v": "1"}, "'body'"),
        ({"v": "1", "body": "{not json"}, "not valid JSON"),
        ({"v": "1", "body": "[1, 2]"}, "JSON object"),
        ({"v": "1", "body": b"\xff\xfe"}, "not valid JSON"),
    ],
)
def test_bad_envelope_is_refused(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        ToolResult.decode(fields)


@pytest.mark.parametrize("missing", ["call_id", "arguments", "deadline", "trace", "issued_at"])
def test_missing_call_field_is_named(missing: str) -> None:
    body = body_of(make_call())
    del body[missing]
    with pytest.raises(ProtocolError, match=f"missing field '{missing}'"):
        ToolCall.decode({"v": "1", "body": json.dumps(body)})


@pytest.mark.parametrize(
    ("field", "value"),
    [("ok", "yes"), ("finished_at", "soon"), ("content", 5), ("trace", "tp"), ("call_id", None)],
)
def test_mistyped_result_field_is_named(field: str, value: Any) -> None:
    body = body_of(ToolResult.success(make_call(), "3", 1.0))
    body[field] = value
    with pytest.raises(ProtocolError, match=f"'{field}'"):
        ToolResult.decode({"v": "1", "body": json.dumps(body)})


def test_invalid_values_in_a_well_formed_body_are_protocol_errors() -> None:
    body = body_of(ToolResult.success(make_call(), "3", 1.0))
    body["error"] = "not a kind"
    with pytest.raises(ProtocolError, match=r"ToolResult\.error"):
        ToolResult.decode({"v": "1", "body": json.dumps(body)})


def test_unknown_body_keys_are_ignored() -> None:
    call = make_call()
    body = {**body_of(call), "priority": 3}
    assert ToolCall.decode({"v": "1", "body": json.dumps(body)}) == call


def test_deleted_entry_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="no fields"):
        ToolCall.decode(None)  # type: ignore[arg-type]
