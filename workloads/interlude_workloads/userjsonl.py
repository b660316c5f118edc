"""Your own traces: one conversation per line of a JSONL file (docs/http-bench.md).

```json
{"id": "c1", "kind": "qa", "arrival_s": 0.4, "prompt_tokens": 120, "segments": [
  {"gen_tokens": 30, "call": {"tool": "search", "delay_s": 0.8, "return_tokens": 60}},
  {"gen_tokens": 25}]}
```

* `id` (string, unique in the file), `kind` (optional: the augmentation type, default "user"),
  `arrival_s` (optional, seconds from the start, for `--arrivals trace`; all lines or none);
* the prompt: `prompt_tokens` (an integer >= 1) or `prompt` (text, counted as
  ceil(chars / 4) tokens, as the InferCept trace reader does);
* `segments`: at least one; each generates `gen_tokens` (>= 1) and all but the last end in a
  `call`: `tool` (a name), `delay_s` (seconds >= 0) and what it returns, `return_tokens` or
  `return_text` (counted like the prompt). The last segment has no call;
* optionally `prefix_group` (a name) and `shared_prefix_tokens` (1 to the prompt's tokens),
  together: the prompt's first tokens are the same in every conversation of the group (a
  system prompt, a tool catalog), which a prefix cache holds once for all of them.

Errors are `TraceError`s naming the file, line, conversation and field. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from interlude_workloads.trace import TraceError, estimate_tokens
from interlude_workloads.types import Segment, TraceCall, TraceRequest


@dataclass(frozen=True)
class UserTrace:
    """The conversations of a JSONL file, in file order, and their arrival times if given."""

    requests: tuple[TraceRequest, ...]
    arrivals: tuple[float, ...] | None  # seconds, one per request; None: the file has none


class _Line:
    def __init__(self, source: str, number: int, cid: str = "") -> None:
        self.where = f"{source}:{number}" + (f": conversation {cid!r}" if cid else "")

    def error(self, field: str, problem: str) -> TraceError:
        return TraceError(f"{self.where}: {field} {problem}")

    def count(self, obj: Mapping[str, object], field: str, minimum: int, name: str) -> int:
        v = obj.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.error(name, f"must be an integer >= {minimum}, got {v!r}")
        return v

    def seconds(self, obj: Mapping[str, object], field: str, name: str) -> float:
        v = obj.get(field)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise self.error(name, f"must be a number of seconds >= 0, got {v!r}")
        return float(v)

    def tokens(self, obj: Mapping[str, object], count: str, text: str, name: str) -> int:
        where = f"{name}." if name else ""
        if (count in obj) == (text in obj):
            raise self.error(f"{where}{count}", f"or {where}{text}: give exactly one")
        if count in obj:
            return self.count(obj, count, 0, f"{where}{count}")
        value = obj[text]
        if not isinstance(value, str):
            raise self.error(f"{where}{text}", f"must be a string, got {type(value).__name__}")
        return estimate_tokens(value)


def _conversation(line: _Line, obj: Mapping[str, object]) -> tuple[TraceRequest, float | None]:
    kind = obj.get("kind", "user")
    if not isinstance(kind, str) or not kind:
        raise line.error("kind", f"must be a non-empty string, got {kind!r}")
    prompt = line.tokens(obj, "prompt_tokens", "prompt", "")
    if prompt < 1:
        raise line.error("prompt", "must have at least one token")
    raw = obj.get("segments")
    if not isinstance(raw, list) or not raw:
        raise line.error("segments", "must be a non-empty list")
    segments = []
    for i, seg in enumerate(raw):
        name = f"segments[{i}]"
        if not isinstance(seg, dict):
            raise line.error(name, "must be an object")
        gen = line.count(seg, "gen_tokens", 1, f"{name}.gen_tokens")
        last = i == len(raw) - 1
        call = seg.get("call")
        if last and call is not None:
            raise line.error(f"{name}.call", "is not allowed on the last segment")
        if not last and not isinstance(call, dict):
            raise line.error(f"{name}.call", "is missing (every segment but the last has one)")
        tool_call = None
        if isinstance(call, dict):
            tool = call.get("tool")
            if not isinstance(tool, str) or not tool:
                raise line.error(f"{name}.call.tool", f"must be a non-empty string, got {tool!r}")
            delay = line.seconds(call, "delay_s", f"{name}.call.delay_s")
            ret = line.tokens(call, "return_tokens", "return_text", f"{name}.call")
            tool_call = TraceCall(tool, delay, ret)
        segments.append(Segment(gen, tool_call))
    arrival = line.seconds(obj, "arrival_s", "arrival_s") if "arrival_s" in obj else None
    cid = str(obj["id"])
    shared, group = _shared_prefix(line, obj, prompt)
    return TraceRequest(cid, kind, prompt, tuple(segments), shared, group), arrival


def _shared_prefix(line: _Line, obj: Mapping[str, object], prompt: int) -> tuple[int, str]:
    """The line's `shared_prefix_tokens` and `prefix_group` (both or neither)."""
    if ("prefix_group" in obj) != ("shared_prefix_tokens" in obj):
        raise line.error("prefix_group", "and shared_prefix_tokens go together: give both or none")
    if "prefix_group" not in obj:
        return 0, ""
    group = obj["prefix_group"]
    if not isinstance(group, str) or not group:
        raise line.error("prefix_group", f"must be a non-empty string, got {group!r}")
    shared = line.count(obj, "shared_prefix_tokens", 1, "shared_prefix_tokens")
    if shared > prompt:
        raise line.error("shared_prefix_tokens", f"must be at most the prompt's {prompt} tokens")
    return shared, group


def parse_jsonl(text: str, source: str = "inline") -> UserTrace:
    """The conversations in JSONL `text` (blank lines skipped); TraceError on the first problem."""
    requests: list[TraceRequest] = []
    arrivals: list[float | None] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        line = _Line(source, number)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{line.where}: not JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{line.where}: a line must be a JSON object")
        cid = obj.get("id")
        if not isinstance(cid, str) or not cid:
            raise line.error("id", f"must be a non-empty string, got {cid!r}")
        if cid in seen:
            raise line.error("id", f"{cid!r} appears twice")
        seen.add(cid)
        request, arrival = _conversation(_Line(source, number, cid), obj)
        requests.append(request)
        arrivals.append(arrival)
    if not requests:
        raise TraceError(f"{source}: no conversations")
    given = [a for a in arrivals if a is not None]
    if given and len(given) != len(arrivals):
        raise TraceError(f"{source}: arrival_s is given on some lines only (all or none)")
    times = tuple(a for a in arrivals if a is not None) if given else None
    return UserTrace(tuple(requests), times)


def load_jsonl(path: str | os.PathLike[str]) -> UserTrace:
    """`parse_jsonl` of a file; TraceError if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc}") from exc
    return parse_jsonl(text, str(path))


__all__ = ["UserTrace", "load_jsonl", "parse_jsonl"]
