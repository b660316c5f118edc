"""Trace parsing: both segment formats, the data quirks, error messages and the shared file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from interlude_workloads import (
    Segment,
    TraceCall,
    TraceError,
    TraceRequest,
    classify,
    default_trace_path,
    estimate_tokens,
    load_trace,
    parse_trace,
)
from interlude_workloads.trace import TRACE_ENV, TRACE_FILENAME, _find_shared_trace

# Token format, cumulative prompts: 100 -> 100+20+5 -> 125+30+0 (api_time 0 still pauses).
TOKEN_REQ: list[dict[str, float]] = [
    {"prompt_tokens": 100, "completion_tokens": 20, "api_time": 0.3, "api_token_length": 5},
    {"prompt_tokens": 125, "completion_tokens": 30, "api_time": 0, "api_token_length": 0},
    {"prompt_tokens": 155, "completion_tokens": 7},
]
P0, C0, A0 = "x" * 10, "y" * 9, "speech result"  # 10, 9 and 13 chars -> 3, 3 and 4 tokens
TEXT_REQ = [
    {"prompt": P0, "completion": C0, "api_token": A0, "api_time": 2.5},
    {"prompt": P0 + C0 + A0, "completion": "z",
     "api_token": "Convert this to speech", "api_time": 1},
    # The last segment still carries a call: it is dropped.
    {"prompt": P0 + C0 + A0 + "z" + "Convert this to speech", "completion": "ok!!!",
     "api_token": "human turn", "api_time": 30.0},
]  # fmt: skip


def test_token_segments_build_from_first_prompt() -> None:
    (req,) = parse_trace({"t1": TOKEN_REQ}, "inline")
    assert req == TraceRequest(
        "t1",
        "venv",  # mean api_time (0.3 + 0) / 2 = 0.15 s
        100,
        (
            Segment(20, TraceCall("venv", 0.3, 5)),
            Segment(30, TraceCall("venv", 0.0, 0)),  # api_time 0 is still a call
            Segment(7, None),
        ),
    )
    assert (req.num_calls, req.total_gen_tokens, req.total_return_tokens) == (2, 57, 5)
    assert req.total_tool_time == pytest.approx(0.3)
    assert req.max_context == 162 == TOKEN_REQ[2]["prompt_tokens"] + 7
    assert req.contexts_at_calls == (120, 155)


def test_text_segments_use_four_chars_per_token_and_drop_trailing_call() -> None:
    (req,) = parse_trace({"c1": TEXT_REQ}, "inline")
    assert req.kind == "tts"  # 2 of the 3 calls (trailing one included) mention "speech"
    assert req.prompt_tokens == 3  # ceil(10 / 4)
    assert [s.gen_tokens for s in req.segments] == [3, 1, 2]  # ceil(9/4), ceil(1/4), ceil(5/4)
    assert [s.call for s in req.segments] == [
        TraceCall("tts", 2.5, 4),  # ceil(13 / 4)
        TraceCall("tts", 1.0, 6),  # ceil(22 / 4)
        None,  # the trailing "human turn" call is gone
    ]


def test_estimate_tokens_rounds_up() -> None:
    assert [estimate_tokens("a" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_zero_completion_still_generates_one_token() -> None:
    seg = [{"prompt_tokens": 10, "completion_tokens": 0}]
    assert parse_trace({"z": seg}, "inline")[0].segments == (Segment(1, None),)
    text = [{"prompt": "hello", "completion": ""}]
    assert parse_trace({"z": text}, "inline")[0].segments == (Segment(1, None),)


def test_negative_length_tolerated_only_on_dropped_trailing_call() -> None:
    last = {"prompt_tokens": 10, "completion_tokens": 4, "api_time": 0.1, "api_token_length": -2}
    (req,) = parse_trace({"v": [last]}, "inline")
    assert req.segments == (Segment(4, None),)
    nxt = {"prompt_tokens": 12, "completion_tokens": 1}
    with pytest.raises(TraceError, match=r"request 'v': segment 0: field 'api_token_length'"):
        parse_trace({"v": [last, nxt]}, "inline")


def test_small_cumulative_mismatch_is_tolerated_large_one_fails() -> None:
    segs = [dict(s) for s in TOKEN_REQ]
    segs[1]["prompt_tokens"] = 127  # 2 tokens off
    assert parse_trace({"t": segs}, "inline")[0].prompt_tokens == 100
    segs[1]["prompt_tokens"] = 20  # not cumulative at all
    with pytest.raises(TraceError, match=r"'t': segment 1: field 'prompt_tokens' is not cumul"):
        parse_trace({"t": segs}, "inline")


BASE = {"prompt_tokens": 5, "completion_tokens": 2, "api_time": 0.1, "api_token_length": 1}
END = {"prompt_tokens": 8, "completion_tokens": 2}


@pytest.mark.parametrize(
    ("segment", "field", "problem"),
    [
        ({**BASE, "completion_tokens": "x"}, "completion_tokens", "non-negative integer, got 'x'"),
        ({**BASE, "completion_tokens": -1}, "completion_tokens", "non-negative integer, got -1"),
        ({**BASE, "completion_tokens": 2.0}, "completion_tokens", "non-negative integer"),
        ({**BASE, "prompt_tokens": True}, "prompt_tokens", "non-negative integer, got True"),
        ({**BASE, "api_time": -0.1}, "api_time", "non-negative number of seconds"),
        ({**BASE, "api_time": "1s"}, "api_time", "non-negative number of seconds"),
        ({k: v for k, v in BASE.items() if k != "api_token_length"}, "api_token_length", "missing"),
        (
            {k: v for k, v in BASE.items() if k != "completion_tokens"},
            "completion_tokens",
            "missing",
        ),
        ({"completion_tokens": 2}, "prompt_tokens", "missing"),
        ({"prompt_tokens": 5, "completion_tokens": 2}, "api_time", "only the last segment"),
        (
            {"prompt": "abc", "completion": 3, "api_token": "", "api_time": 1},
            "completion",
            "string",
        ),
        ({"prompt": "abc", "completion": "d", "api_time": 1}, "api_token", "missing"),
        ({**BASE, "prompt": "text"}, "prompt", "ambiguous"),
        ({**BASE, "prompt_tokens": 0}, "prompt_tokens", "must not be empty"),
    ],
)
def test_malformed_segment_names_request_and_field(
    segment: dict[str, object], field: str, problem: str
) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace({"ok": [END], "abc": [segment, END]}, "trace.json")
    msg = str(info.value)
    assert msg.startswith("trace.json: request 'abc': segment 0: ")
    assert f"field {field!r}" in msg and problem in msg


def test_mixing_formats_in_one_request_fails() -> None:
    text = {"prompt": "a" * 30, "completion": "b"}
    with pytest.raises(TraceError, match=r"request 'm': segment 1: field 'prompt' mixes"):
        parse_trace({"m": [BASE, text]}, "inline")


@pytest.mark.parametrize(
    ("obj", "pattern"),
    [
        ([1, 2], r"^src: a trace must be a JSON object .* got list"),
        ({}, r"^src: the trace has no requests"),
        ({"r9": []}, r"^src: request 'r9': has no segments"),
        ({"r9": {"a": 1}}, r"^src: request 'r9': must be a list of segments"),
        ({"r9": [3]}, r"^src: request 'r9': segment 0: must be a JSON object, got 3"),
    ],
)
def test_malformed_structure(obj: object, pattern: str) -> None:
    with pytest.raises(TraceError, match=pattern):
        parse_trace(obj, "src")


def test_bad_json_missing_file_and_duplicates_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": [', encoding="utf-8")
    with pytest.raises(TraceError, match=r"bad\.json: not valid JSON"):
        load_trace(bad)
    with pytest.raises(TraceError, match=r"nope\.json: cannot read"):
        load_trace(tmp_path / "nope.json")
    dup = tmp_path / "dup.json"
    dup.write_text('{"a": [{"prompt_tokens": 1, "completion_tokens": 1}], "a": []}', "utf-8")
    with pytest.raises(TraceError, match=r"dup\.json: duplicate key 'a'"):
        load_trace(dup)


def test_load_trace_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"t1": TOKEN_REQ, "c1": TEXT_REQ}), encoding="utf-8")
    reqs = load_trace(path)
    assert [r.request_id for r in reqs] == ["t1", "c1"]  # file order is kept
    assert reqs == parse_trace({"t1": TOKEN_REQ, "c1": TEXT_REQ}, "other source")


def test_classify_rules() -> None:
    assert classify([9e-5, 0.0]) == "math"
    assert classify([0.05, 0.11]) == "venv"
    assert classify([0.275]) == "qa"
    assert classify([0.1, 1.5]) == "qa"
    assert classify([1, 2], ["Generate an image about this.", "thanks"]) == "image"
    assert classify([1, 2], ["Convert this to text to speech.", "an image"]) == "tts"
    assert classify([1, 2, 3], ["hi", "an image please", "more"]) == "chat"  # 1 of 3
    assert classify([1], ["for link in image_links"]) == "chat"  # a lone human turn
    assert classify([], []) == "chat"


def test_find_shared_trace_walks_up_to_a_repo_root(tmp_path: Path) -> None:
    repo = tmp_path / "main"
    deep = repo / "a" / "b"
    deep.mkdir(parents=True)
    assert _find_shared_trace([deep]) is None
    (repo / ".git").mkdir()
    assert _find_shared_trace([deep]) is None  # root found, file absent
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    (data / TRACE_FILENAME).write_text("{}", encoding="utf-8")
    assert _find_shared_trace([tmp_path / "elsewhere", deep]) == data / TRACE_FILENAME


def test_env_var_overrides_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "mine.json"
    monkeypatch.setenv(TRACE_ENV, str(target))
    assert default_trace_path() is None  # set but absent: no silent fallback
    target.write_text("{}", encoding="utf-8")
    assert default_trace_path() == target


def test_real_shared_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    path = default_trace_path()
    if path is None:
        pytest.skip("shared InferCept trace (../shared/data) is not present in this checkout")
    reqs = load_trace(path)
    assert len(reqs) == 397
    assert Counter(r.kind for r in reqs) == {
        "math": 99, "chat": 65, "tts": 65, "image": 65, "venv": 54, "qa": 49,
    }  # fmt: skip
    assert len({r.request_id for r in reqs}) == 397
    assert all(r.num_calls >= 1 for r in reqs)
    assert all(c.tool == r.kind for r in reqs for c in r.calls)
    # Zero-second calls exist and are kept as calls.
    assert sum(c.duration_s == 0 for r in reqs for c in r.calls) == 15
    assert max(r.max_context for r in reqs) <= 2100  # GPT-J's 2048 window, plus estimates


@pytest.mark.parametrize(
    ("shared", "group", "words"),
    [
        (5, "", "go together"),
        (0, "g", "go together"),
        (11, "g", "exceeds the prompt's 10 tokens"),
        (-1, "g", "shared_prefix_tokens must be an integer >= 0"),
    ],
)
def test_a_shared_head_needs_its_group_and_fits_the_prompt(
    shared: int, group: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        TraceRequest("r", "k", 10, (Segment(1, None),), shared, group)
