"""Read InferCept's mixed-workload trace (DESIGN section 5) into `TraceRequest`s.

The file is `{request_id: [segment, ...]}`. A segment comes in one of two formats:

* token counts: `prompt_tokens`, `completion_tokens` (tokens generated before the call) and, when
  the segment ends in a call, `api_time` (seconds) and `api_token_length` (tokens returned);
* raw text (the ShareGPT-derived chat, image and TTS requests): `prompt`, `completion` and, for a
  call, `api_token` (the text returned) and `api_time`. Text is turned into tokens at
  CHARS_PER_TOKEN = 4 characters per token, rounded up, so any non-empty string counts >= 1.

Facts about the data that shape this parser (checked on the shared file):

* `prompt_tokens` / `prompt` are cumulative: segment j+1's prompt is segment j's prompt plus its
  completion plus its tool result. We therefore take the prompt from the FIRST segment only and
  build everything else from completions and results; the cumulative relation is only checked,
  loosely, to catch a trace in another convention (in the shared file it holds exactly).
* Many last segments still carry a call (every ALFWorld-like, image and TTS request: the final
  action's observation or the human's next turn). Nothing is generated after it, so that
  trailing call is dropped: the request ends when its last generation ends.
* Four ALFWorld-like requests end with a trailing call whose `api_token_length` is -2 (their
  context hit GPT-J's 2048-token window). Since that call is dropped, a negative length is
  accepted there and only there; anywhere else it is an error.
* `api_time` 0 with a return length is still a call (a pause of zero seconds), never merged away.
* A completion of 0 tokens (or empty text) becomes 1 generated token, because an engine turn
  always samples at least one token. The shared file has none.
* The file has no type labels; `classify` infers each request's augmentation type.

Errors are `TraceError` (a ValueError) naming the source, request id, segment index (0-based, as
in the JSON list) and field, so a malformed trace can be fixed without a debugger.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from interlude_workloads.types import Segment, TraceCall, TraceRequest

CHARS_PER_TOKEN = 4  # rough average for English BPE vocabularies; used for text segments only
TRACE_FILENAME = "infercept_mixed_workload.json"
TRACE_ENV = "INTERLUDE_TRACE"  # overrides where default_trace_path() looks
# Mean tool time thresholds separating the token-count types (see `classify`).
MATH_MAX_MEAN_S = 0.01
VENV_MAX_MEAN_S = 0.2
# Cumulative-prompt check: tolerated gap, absolute (tokens, or characters for text) or relative.
_CUMULATIVE_SLACK = {"tokens": 16, "chars": 64}
_CUMULATIVE_REL = 0.10


class TraceError(ValueError):
    """A trace file or object that cannot be read as augmented requests."""


def estimate_tokens(text: str) -> int:
    """Token estimate of raw text: ceil(chars / CHARS_PER_TOKEN); 0 only for ''."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def classify(api_times: Sequence[float], api_texts: Sequence[str] | None = None) -> str:
    """Infer the augmentation type of a request from its calls (the trace has no labels).

    Pass every call of the request, the dropped trailing one included (it is evidence too).
    The types are those of DESIGN section 4's table:

    * text requests (`api_texts` given) are ShareGPT-derived. InferCept made the image and TTS
      variants by inserting a tool instruction ("Generate an image about this.", "Convert this
      to text to speech.") before each human turn, so in those requests the calls alternate
      tool / human and at least half of them mention the tool. We call a request "tts" when at
      least half of its calls mention "speech", "image" likewise for "image", else "chat";
      requiring two or more calls keeps a lone human turn that talks about images (one such
      chat request exists) from being taken for an image request.
    * token requests by mean tool time: < 0.01 s is the calculator ("math", table mean 90 us),
      < 0.2 s the ALFWorld-like virtual environment ("venv", table 0.09 s), else Wikipedia
      "qa" (table 0.69 s). The shared file separates cleanly: venv means are 0.05-0.11 s, qa
      means 0.27-0.97 s; a 0.3 s boundary would take two single-call qa requests (0.275 and
      0.288 s, with qa-like prompts and answers) for venv.
    """
    if api_texts is not None:
        n = len(api_texts)
        for word, kind in (("speech", "tts"), ("image", "image")):
            hits = sum(word in t.lower() for t in api_texts)
            if n >= 2 and 2 * hits >= n:
                return kind
        return "chat"
    mean = sum(api_times) / len(api_times) if api_times else 0.0
    if mean < MATH_MAX_MEAN_S:
        return "math"
    return "venv" if mean < VENV_MAX_MEAN_S else "qa"


@dataclass(frozen=True)
class _Seg:
    """One segment as read: sizes in the segment's unit (tokens, or characters for text)."""

    unit: str  # "tokens" or "chars"
    prompt_size: int
    prompt_tokens: int
    completion_size: int
    gen_tokens: int
    api_time: float | None  # None: no call
    return_size: int
    return_tokens: int
    api_text: str | None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Where:
    """Builds error messages that point at one segment of one request."""

    def __init__(self, source: str, rid: str, index: int) -> None:
        self.prefix = f"{source}: request {rid!r}: segment {index}"

    def error(self, name: str, problem: str) -> TraceError:
        return TraceError(f"{self.prefix}: field {name!r} {problem}")

    def get(self, seg: Mapping[str, object], name: str) -> object:
        if name not in seg:
            raise self.error(name, "is missing")
        return seg[name]

    def count(self, seg: Mapping[str, object], name: str, negative_ok: bool = False) -> int:
        v = self.get(seg, name)
        if isinstance(v, bool) or not isinstance(v, int) or (v < 0 and not negative_ok):
            raise self.error(name, f"must be a non-negative integer, got {_short(v)}")
        return max(0, v)

    def seconds(self, seg: Mapping[str, object], name: str) -> float:
        v = self.get(seg, name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            return float(v)
        raise self.error(name, f"must be a non-negative number of seconds, got {_short(v)}")

    def text(self, seg: Mapping[str, object], name: str) -> str:
        v = self.get(seg, name)
        if not isinstance(v, str):
            raise self.error(name, f"must be a string, got {_short(v)}")
        return v


def _parse_segment(where: _Where, seg: Mapping[str, object], last: bool) -> _Seg:
    if "prompt_tokens" in seg and "prompt" in seg:
        raise where.error("prompt", "is ambiguous: the segment also has 'prompt_tokens'")
    if "prompt_tokens" in seg:
        prompt, done = where.count(seg, "prompt_tokens"), where.count(seg, "completion_tokens")
        api_time, ret = None, 0
        if "api_time" in seg or "api_token_length" in seg:
            api_time = where.seconds(seg, "api_time")
            # Only a dropped trailing call may return a negative length (see module docstring).
            ret = where.count(seg, "api_token_length", negative_ok=last)
        return _Seg(
            unit="tokens", prompt_size=prompt, prompt_tokens=prompt, completion_size=done,
            gen_tokens=max(1, done), api_time=api_time, return_size=ret, return_tokens=ret,
            api_text=None,
        )  # fmt: skip
    if "prompt" not in seg:
        raise where.error("prompt_tokens", "is missing (and so is 'prompt')")
    prompt_text, done_text = where.text(seg, "prompt"), where.text(seg, "completion")
    api_time, api_text = None, None
    if "api_time" in seg or "api_token" in seg:
        api_time = where.seconds(seg, "api_time")
        api_text = where.text(seg, "api_token")
    ret_text = api_text or ""
    return _Seg(
        unit="chars", prompt_size=len(prompt_text), prompt_tokens=estimate_tokens(prompt_text),
        completion_size=len(done_text), gen_tokens=max(1, estimate_tokens(done_text)),
        api_time=api_time, return_size=len(ret_text), return_tokens=estimate_tokens(ret_text),
        api_text=api_text,
    )  # fmt: skip


def _parse_request(source: str, rid: str, raw: object) -> TraceRequest:
    if not isinstance(raw, list):
        raise TraceError(
            f"{source}: request {rid!r}: must be a list of segments, got {_short(raw)}"
        )
    if not raw:
        raise TraceError(f"{source}: request {rid!r}: has no segments")
    segs: list[_Seg] = []
    for i, item in enumerate(raw):
        where = _Where(source, rid, i)
        if not isinstance(item, dict):
            raise TraceError(f"{where.prefix}: must be a JSON object, got {_short(item)}")
        seg = _parse_segment(where, item, last=i == len(raw) - 1)
        prompt_field = "prompt_tokens" if seg.unit == "tokens" else "prompt"
        if segs and seg.unit != segs[0].unit:
            raise where.error(prompt_field, "mixes token counts and raw text in one request")
        if i == 0 and seg.prompt_size == 0:
            raise where.error(prompt_field, "must not be empty in the first segment")
        if segs:
            prev = segs[-1]
            expected = prev.prompt_size + prev.completion_size + prev.return_size
            slack = max(_CUMULATIVE_SLACK[seg.unit], _CUMULATIVE_REL * expected)
            if abs(seg.prompt_size - expected) > slack:
                raise where.error(
                    prompt_field,
                    f"is not cumulative: expected about {expected} {seg.unit} (previous prompt"
                    f" + completion + api result), got {seg.prompt_size}",
                )
        if i < len(raw) - 1 and seg.api_time is None:
            raise where.error("api_time", "is missing (only the last segment may have no call)")
        segs.append(seg)
    times = [s.api_time for s in segs if s.api_time is not None]
    texts = [s.api_text or "" for s in segs if s.api_time is not None]
    kind = classify(times, texts if segs[0].unit == "chars" else None)
    out: list[Segment] = []
    for j, s in enumerate(segs):
        last = j == len(segs) - 1
        # The trailing call of a last segment is dropped: nothing is generated after it.
        call = None if last or s.api_time is None else TraceCall(kind, s.api_time, s.return_tokens)
        out.append(Segment(s.gen_tokens, call))
    try:
        return TraceRequest(rid, kind, segs[0].prompt_tokens, tuple(out))
    except ValueError as exc:  # e.g. an empty request id
        raise TraceError(f"{source}: {exc}") from exc


def parse_trace(obj: object, source: str) -> list[TraceRequest]:
    """Convert a decoded trace (`{request_id: [segment, ...]}`) to requests, in file order.

    `source` names where `obj` came from (a path, "inline", ...) in error messages.
    """
    if not isinstance(obj, dict):
        raise TraceError(
            f"{source}: a trace must be a JSON object mapping request ids to segment lists,"
            f" got {type(obj).__name__}"
        )
    if not obj:
        raise TraceError(f"{source}: the trace has no requests")
    return [_parse_request(source, str(rid), raw) for rid, raw in obj.items()]


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # json would silently keep the last of two equal request ids; a trace with duplicates is
    # almost certainly two files glued together, so refuse it.
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise TraceError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_trace(path: str | os.PathLike[str]) -> list[TraceRequest]:
    """Read and parse a trace file; every problem is a TraceError naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: cannot read trace file: {exc}") from exc
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{p}: not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    except TraceError as exc:
        raise TraceError(f"{p}: {exc}") from exc
    return parse_trace(obj, str(p))


def _find_shared_trace(starts: Iterable[Path]) -> Path | None:
    """The first existing `<root>/../shared/data/<TRACE_FILENAME>` above one of `starts`.

    A repository root is a directory holding `.git` or `pyproject.toml`; every such ancestor is
    tried, because a nested project may carry its own pyproject.toml.
    """
    for start in starts:
        for d in (start, *start.parents):
            if (d / ".git").exists() or (d / "pyproject.toml").exists():
                candidate = d.parent / "shared" / "data" / TRACE_FILENAME
                if candidate.is_file():
                    return candidate
    return None


def default_trace_path() -> Path | None:
    """Where the shared InferCept trace is, or None when this checkout does not have it.

    `$INTERLUDE_TRACE`, when set, is the only place looked at (so a typo shows up as None rather
    than silently falling back). Otherwise the repository root is searched upward from this file
    (editable installs, checkouts) and from the working directory (installed package run from
    a checkout).
    """
    env = os.environ.get(TRACE_ENV)
    if env:
        p = Path(env)
        return p if p.is_file() else None
    return _find_shared_trace([Path(__file__).resolve().parent, Path.cwd().resolve()])
