"""`bench chaos`: the verdict's rules on made-up results, and a short drill on a real stack (an
engine and the tools worker SIGKILLed, Valkey SIGKILLed and SIGTERMed, under load)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from interlude.bench import chaos_report
from interlude.bench.chaos import ChaosSpec, run_chaos
from interlude.loadgen.client import ConversationResult
from interlude.loadgen.plan import Conversation, Step
from interlude.loadgen.text import TextMaker

CONV = Conversation("c", "k", 0.0, 8, (Step(4, "t", 0.1, 2), Step(3)))


def result(**kw: Any) -> ConversationResult:
    return ConversationResult("c", start=0.0, **kw)


def test_an_outcome_is_finished_a_clear_error_a_cut_or_lost() -> None:
    envelope = json.dumps({"error": {"message": "engine gone", "type": "unavailable"}})
    cases = {
        "finished": result(end=1.0, segment_tokens=[4, 3]),
        "lost": result(end=1.0, segment_tokens=[4]),  # an answer short, no error: silent
        "error": result(error=f"ServerError: HTTP 502: {envelope}"),
        "cut": result(error="RemoteProtocolError: peer closed connection"),
    }
    for want, r in cases.items():
        assert chaos_report.outcome(CONV, "resume", r) == want
    stream = result(error='ServerError: stream error: {"message": "x"}')
    assert chaos_report.outcome(CONV, "resume", stream) == "error"
    # A status without the OpenAI envelope is no error a client can act on.
    assert chaos_report.outcome(CONV, "resume", result(error="ServerError: HTTP 502: <html>")) == (
        "cut"
    )
    assert chaos_report.outcome(CONV, "resume", result()) == "lost"  # still running


def test_the_tally_counts_runs_again_and_the_verdict_names_every_failure() -> None:
    tools = chaos_report.tool_runs(["a", "b", "a", ""], ["a", "b"])
    assert tools == {"calls": 2, "runs": 3, "calls_run_again": 1, "effects": 2}
    engines = [{"url": "e0", "ready": True, "kv_usage": 0.0, "sessions": {}}]
    ok = chaos_report.summarize([("resume", "finished"), ("resume", "error")], tools, engines,
                                [], {})  # fmt: skip
    assert ok["failures"] == [] and ok["outcomes"]["resume"]["error"] == 1
    hung = [{"at_s": 1.0, "what": "SIGSTOP Valkey", "unready": {"e0": 2}, "checks": 5}]
    stalled = chaos_report.summarize([], tools, engines, hung, {})
    assert stalled["failures"] == ["e0 was not ready 2 of 5 times while Valkey hung"]
    leaked = [
        {"url": "e0", "ready": True, "kv_usage": 0.1, "sessions": {"paused": 1}},
        {"url": "e1", "ready": False, "kv_usage": 0.0},  # a starting engine's zero says nothing
    ]
    bad = chaos_report.summarize([("server-tools", "cut")], tools, leaked, [], {})
    assert len(bad["failures"]) == 3 and "leaked" in bad["failures"][1]
    assert "not back" in bad["failures"][2]
    assert "FAILED" in chaos_report.lines(bad)[-1]


def test_the_faults_fall_inside_the_arrivals_and_bad_specs_are_refused() -> None:
    spec = ChaosSpec(duration_s=80.0, pause_s=20.0)
    # A gap of (80 - 20) / 6 = 10 s between faults; the pause takes its 20 s before the next.
    assert spec.schedule() == [(10.0, "valkey-pause"), (40.0, "engine"), (50.0, "valkey-kill"),
                               (60.0, "tools"), (70.0, "valkey-term")]  # fmt: skip
    with pytest.raises(ValueError, match="pause_s"):
        ChaosSpec(duration_s=20.0, pause_s=30.0)
    with pytest.raises(ValueError, match="unknown faults"):
        ChaosSpec(faults=("gateway",))
    with pytest.raises(ValueError, match="horizon_s"):
        ChaosSpec(duration_s=60.0, horizon_s=30.0)


def test_a_short_drill_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    spec = ChaosSpec(
        conversations=16, duration_s=30.0, pause_s=6.0, horizon_s=150.0, client_deadline_s=15.0
    )
    lines: list[str] = []
    out = run_chaos(spec, tmp_path / "run", TextMaker.estimated(), lines.append)
    assert out["failures"] == [], "\n".join(chaos_report.lines(out))
    assert [f["what"].split()[0] for f in out["faults"]] == [
        "SIGSTOP", "SIGKILL", "SIGKILL", "SIGKILL", "SIGTERM"
    ]  # fmt: skip
    hung = out["faults"][0]  # both engines answered /ready all through Valkey's pause
    assert hung["checks"] >= 4 and len(hung["unready"]) == 2
    assert not any(hung["unready"].values())
    # Each killed part started again (and came back, but for the slow engine maybe).
    restarted = [e.split()[0] for e in out["supervisor"] if "starting it again" in e]
    assert {"engine-0", "valkey", "tools"} <= set(restarted), out["supervisor"]
    assert restarted.count("valkey") == 2
    counts = out["outcomes"]
    assert sum(c["finished"] for c in counts.values()) >= 1
    assert set(counts) == {"resume", "server-tools"}
    assert out["tool"]["calls"] >= 1 and out["tool"]["effects"] == out["tool"]["calls"]
