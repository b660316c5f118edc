"""What the chaos drill (`bench chaos`) counts, from what its clients, its tool and its engines
saw; pure functions of those, so the verdict is tested without a stack.

A conversation ends one of four ways (`outcome`):
* `finished`: every answer came, with the tokens its script asked for;
* `error`: the client got an error it can retry: an HTTP status with the OpenAI error envelope,
  or a stream's error frame;
* `cut`: the connection broke without either (a stream with no error frame and no [DONE]);
* `lost`: still running at the horizon, or answered with other tokens than asked, silently.
The drill holds when nothing is `cut` or `lost`, no call acted twice, and every engine is back
to an empty KV cache with no session left.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from interlude.loadgen.client import ConversationResult, expected_tokens
from interlude.loadgen.plan import Conversation

OUTCOMES = ("finished", "error", "cut", "lost")


def outcome(conv: Conversation, mode: str, r: ConversationResult) -> str:
    """How one conversation ended (`OUTCOMES`)."""
    if r.error is not None:
        clear = r.error.startswith("ServerError: stream error:") or _enveloped(r.error)
        return "error" if clear else "cut"
    if r.end is None or list(r.segment_tokens) != list(expected_tokens(conv, mode)):
        return "lost"
    return "finished"


def _enveloped(error: str) -> bool:
    """`ServerError: HTTP <status>: <body>` whose body is `{"error": {"message": ...}}`."""
    head = "ServerError: HTTP "
    if not error.startswith(head):
        return False
    _, _, body = error[len(head) :].partition(": ")
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)


def tool_runs(runs_log: Iterable[str], effects: Iterable[str]) -> dict[str, int]:
    """The tally tool's record: calls it ran, runs in all, calls run more than once (a call
    reclaimed from a killed worker), and effects left (one per call at most: idempotent)."""
    runs = Counter(line.strip() for line in runs_log if line.strip())
    return {
        "calls": len(runs),
        "runs": sum(runs.values()),
        "calls_run_again": sum(1 for n in runs.values() if n > 1),
        "effects": len(set(effects)),
    }


def routes(results: Iterable[ConversationResult]) -> dict[str, int]:
    """The route of every answer (its `interlude.route`): new (a session started), resume (a
    parked session went on where it was), fallback (its session was gone: recomputed)."""
    return dict(Counter(route for r in results for route in r.routes))


def errors(results: Iterable[ConversationResult], width: int = 200) -> dict[str, int]:
    """The errors the clients saw, each cut to `width` characters, with how many saw it."""
    return dict(Counter(r.error[:width] for r in results if r.error is not None))


def summarize(
    outcomes: Sequence[tuple[str, str]],
    tools: Mapping[str, int],
    engines: Sequence[Mapping[str, Any]],
    faults: Sequence[Mapping[str, Any]],
    route_counts: Mapping[str, int],
    error_counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The drill's result: outcomes by mode, the tool's record, each engine at the end, the
    faults as injected, and the failures (empty: the drill held)."""
    by_mode: dict[str, dict[str, int]] = {}
    for mode, out in outcomes:
        by_mode.setdefault(mode, dict.fromkeys(OUTCOMES, 0))[out] += 1
    failures = [f"{n} {mode} conversations {out}" for mode, counts in by_mode.items()
                for out, n in counts.items() if out in ("cut", "lost") and n]  # fmt: skip
    for f in faults:
        for url, n in (f.get("unready") or {}).items():
            if n:
                failures.append(f"{url} was not ready {n} of {f['checks']} times while Valkey hung")
    if tools["effects"] > tools["calls"]:
        failures.append(f"{tools['effects']} effects for {tools['calls']} calls")
    for e in engines:
        if not e.get("ready"):
            failures.append(f"{e['url']} was not back (ready) after the drill")
        elif e.get("kv_usage", 1.0) > 0 or e.get("sessions"):
            failures.append(
                f"{e['url']}: KV usage {e.get('kv_usage')} and sessions {e.get('sessions')} "
                "after the drill (blocks or sessions leaked)"
            )
    return {
        "outcomes": by_mode,
        "tool": dict(tools),
        "routes": dict(route_counts),
        "engines": list(engines),
        "faults": list(faults),
        "errors": dict(error_counts or {}),
        "failures": failures,
    }


def lines(result: Mapping[str, Any]) -> list[str]:
    """The drill's result for a terminal."""
    out = ["faults:"]
    for f in result["faults"]:
        unready = f.get("unready")
        tail = f", unready answers {sum(unready.values())}" if unready is not None else ""
        out.append(f"  {f['at_s']:6.1f} s  {f['what']}{tail}")
    out.append("conversations (finished / error the client can retry / cut / lost):")
    for mode, counts in result["outcomes"].items():
        out.append(f"  {mode:13s} " + " / ".join(str(counts[o]) for o in OUTCOMES))
    t = result["tool"]
    out.append(
        f"server-side calls: {t['calls']} run {t['runs']} times ({t['calls_run_again']} again "
        f"after a kill), {t['effects']} effects"
    )
    out.append("answers by route: " + ", ".join(f"{k} {v}" for k, v in result["routes"].items()))
    for e in result["engines"]:
        out.append(
            f"  {e['url']}: ready {e.get('ready')}, KV usage {e.get('kv_usage')}, "
            f"sessions {e.get('sessions') or 0}, "
            f"resumes {e.get('resumes')}"
        )
    out += [f"  {n} x {text}" for text, n in result.get("errors", {}).items()]
    out.append("HELD" if not result["failures"] else "FAILED: " + "; ".join(result["failures"]))
    return out
