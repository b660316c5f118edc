"""The engine's events on the wire: every event survives `to_json` -> JSON -> `decode` whole,
and a frame that does not fit its event is refused naming the field."""

from __future__ import annotations

import json

import pytest

from interlude.api.events import (
    EVENTS,
    Done,
    Event,
    Failed,
    Paused,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
    ToolResultEvent,
    TurnStart,
    decode,
)

SAMPLES: list[Event] = [
    TextDelta("hello", 2),
    TextDelta("hi", 1, (TokenLogprob("hi", -0.25, (("hi", -0.25), ("ho", -1.5))),)),
    ToolCallEvent("call_1", "calculator", '{"expression": "1+1"}', "server"),
    ToolResultEvent("call_1", False, "", "timeout"),
    TurnStart("s", "swap", 0.012),
    Paused("s", ("call_1", "call_2"), 300.0, 10, 4, 1),
    Done("s", "stop", 10, 20, 3, 1, 2),
    Failed("s", "timeout", "the client did not resume"),
]


def test_every_event_type_has_a_sample() -> None:
    assert {type(e) for e in SAMPLES} == set(EVENTS.values())


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: f"{e.type}-{SAMPLES.index(e)}")
def test_events_round_trip_through_json(event: Event) -> None:
    assert decode(json.loads(json.dumps(event.to_json()))) == event


def test_unknown_types_are_skipped_and_unknown_fields_ignored() -> None:
    assert decode({"type": "heartbeat", "at": 1}) is None
    assert decode({"type": "text", "text": "a", "tokens": 1, "newer_field": 5}) == TextDelta("a", 1)


def test_defaults_fill_fields_an_older_engine_leaves_out() -> None:
    assert decode({"type": "paused", "session_id": "s", "call_ids": [], "deadline_s": 5}) == Paused(
        "s", (), 5, 0, 0, 0
    )


@pytest.mark.parametrize(
    ("frame", "names"),
    [
        ({"type": "text", "text": 7, "tokens": 1}, "text must be str"),
        ({"type": "text", "text": "a"}, "tokens"),
        ({"type": "tool_result", "call_id": "c", "ok": "yes", "content": ""}, "ok must be bool"),
        ({"type": "done", "session_id": "s", "finish_reason": "stop", "prompt_tokens": True,
          "completion_tokens": 1, "tool_tokens": 0, "tool_calls": 0, "turns": 1}, "prompt_tokens"),
        ({"type": "paused", "session_id": "s", "call_ids": [1], "deadline_s": 1.0}, "call_ids"),
        ({"type": "paused", "session_id": "s", "call_ids": "c", "deadline_s": 1.0}, "call_ids"),
    ],
)  # fmt: skip
def test_a_frame_that_does_not_fit_its_event_names_the_field(frame: dict, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        decode(frame)


def test_a_malformed_logprob_entry_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        decode({"type": "text", "text": "a", "tokens": 1, "logprobs": [{"token": "a"}]})
