"""The user trace format (`userjsonl`): one conversation per JSONL line, errors that point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlude_workloads import TraceError
from interlude_workloads.userjsonl import load_jsonl, parse_jsonl

GOOD = {
    "id": "c1",
    "kind": "qa",
    "prompt_tokens": 120,
    "segments": [
        {"gen_tokens": 30, "call": {"tool": "search", "delay_s": 0.8, "return_tokens": 60}},
        {"gen_tokens": 20, "call": {"tool": "calc", "delay_s": 0, "return_text": "abcdefghi"}},
        {"gen_tokens": 25},
    ],
}


def line(**change: object) -> str:
    obj = {**GOOD, **change}
    if "prompt" in change and "prompt_tokens" not in change:
        del obj["prompt_tokens"]
    return json.dumps(obj)


def test_a_conversation_reads_into_segments_and_calls() -> None:
    trace = parse_jsonl(line() + "\n\n" + line(id="c2", prompt="x" * 9, kind="chat") + "\n")
    first, second = trace.requests
    assert trace.arrivals is None
    assert (first.request_id, first.kind, first.prompt_tokens) == ("c1", "qa", 120)
    assert [s.gen_tokens for s in first.segments] == [30, 20, 25]
    assert [(c.tool, c.duration_s, c.return_tokens) for c in first.calls] == [
        ("search", 0.8, 60),
        ("calc", 0.0, 3),  # 9 characters: ceil(9 / 4) tokens
    ]
    assert second.prompt_tokens == 3 and second.kind == "chat"


def test_a_shared_head_is_read_with_its_group() -> None:
    trace = parse_jsonl(line(prefix_group="agent", shared_prefix_tokens=100) + "\n" + line(id="c2"))
    grouped, alone = trace.requests
    assert (grouped.shared_prefix_tokens, grouped.prefix_group) == (100, "agent")
    assert (alone.shared_prefix_tokens, alone.prefix_group) == (0, "")


def test_arrival_times_come_with_every_line_or_none(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line(arrival_s=0.5) + "\n" + line(id="c2", arrival_s=2) + "\n")
    assert load_jsonl(path).arrivals == (0.5, 2.0)
    with pytest.raises(TraceError, match="all or none"):
        parse_jsonl(line(arrival_s=0.5) + "\n" + line(id="c2"))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "inline:1: not JSON"),
        ("[1, 2]", "inline:1: a line must be a JSON object"),
        (line(id=""), "inline:1: id must be a non-empty string"),
        (line() + "\n" + line(), "inline:2: id 'c1' appears twice"),
        (line(prompt_tokens=0), "conversation 'c1': prompt must have at least one token"),
        (json.dumps({**GOOD, "prompt": "hi"}), "prompt_tokens or prompt: give exactly one"),
        (line(segments=[]), "segments must be a non-empty list"),
        (line(segments=[{"gen_tokens": 0}]), "segments[0].gen_tokens must be an integer >= 1"),
        (line(segments=[{"gen_tokens": 3}, {"gen_tokens": 2}]), "segments[0].call is missing"),
        (
            line(
                segments=[
                    {"gen_tokens": 3, "call": {"tool": "t", "delay_s": 1, "return_tokens": 1}}
                ]
            ),
            "segments[0].call is not allowed on the last segment",
        ),
        (
            line(
                segments=[
                    {"gen_tokens": 3, "call": {"tool": "t", "delay_s": -1, "return_tokens": 1}},
                    {"gen_tokens": 1},
                ]
            ),
            "segments[0].call.delay_s must be a number of seconds >= 0",
        ),
        (
            line(
                segments=[{"gen_tokens": 3, "call": {"tool": "t", "delay_s": 1}}, {"gen_tokens": 1}]
            ),
            "segments[0].call.return_tokens or segments[0].call.return_text: give exactly one",
        ),
        ("\n", "inline: no conversations"),
        (line(prefix_group="agent"), "prefix_group and shared_prefix_tokens go together"),
        (line(prefix_group="", shared_prefix_tokens=5), "prefix_group must be a non-empty"),
        (line(prefix_group="a", shared_prefix_tokens=0), "shared_prefix_tokens must be an integer"),
        (line(prefix_group="a", shared_prefix_tokens=121), "at most the prompt's 120 tokens"),
    ],
)
def test_errors_name_the_line_and_the_field(text: str, words: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_jsonl(text)
    assert words in str(info.value)


def test_an_unreadable_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
