"""Role flips, pure (interlude.policy.flips, and the operator's reading of an engine in
operator/interlude_operator/flips.py): TetriInfer's transition watcher as a
state machine over an engine's load, carried on the pod so a restart goes on from it."""

from __future__ import annotations

import pytest

from interlude.policy.flips import EngineLoad, FlipRule, FlipState, step
from interlude_operator.flips import FLIP_TO, LOW_SINCE, annotations_of, load_of, state_of

RULE = FlipRule(window_s=60.0, idle_below=0.1)
PAIR = {"prefill": 2, "decode": 1}


def idle(role: str, drained: bool = False) -> EngineLoad:
    return EngineLoad(role, busy=0.02, drained=drained)


def test_an_idle_prefill_engine_drains_then_flips_to_decode() -> None:
    s = step(idle("prefill"), FlipState(), PAIR, now=0.0, rule=RULE)
    assert s.state == FlipState(low_since=0.0) and not s.drain
    s = step(idle("prefill"), s.state, PAIR, now=59.0, rule=RULE)
    assert s.state.flip_to is None  # the window has not passed
    s = step(idle("prefill"), s.state, PAIR, now=61.0, rule=RULE)
    assert s.state == FlipState(flip_to="decode") and s.drain and s.set_role is None
    s = step(idle("prefill"), s.state, PAIR, now=62.0, rule=RULE)  # its queue still drains
    assert s.drain and s.set_role is None
    s = step(idle("prefill", drained=True), s.state, PAIR, now=63.0, rule=RULE)
    assert s.drain and s.set_role == "decode"
    s = step(idle("decode"), s.state, {"prefill": 1, "decode": 2}, now=64.0, rule=RULE)
    assert s.state == FlipState() and not s.drain  # serving again, in its new role


def test_load_back_over_the_threshold_restarts_the_window() -> None:
    s = step(idle("decode"), FlipState(low_since=0.0), {"decode": 2}, now=30.0, rule=RULE)
    busy = EngineLoad("decode", busy=0.5, drained=False)
    s = step(busy, s.state, {"decode": 2}, now=31.0, rule=RULE)
    assert s.state == FlipState()
    s = step(idle("decode"), s.state, {"decode": 2, "prefill": 1}, now=70.0, rule=RULE)
    assert s.state == FlipState(low_since=70.0) and not s.drain


def test_the_last_engine_of_a_role_never_flips_and_mixed_engines_never_do() -> None:
    s = step(idle("decode"), FlipState(low_since=0.0), {"decode": 1}, now=600.0, rule=RULE)
    assert s.state.flip_to is None and not s.drain and s.reason == "last of its role"
    s = step(idle("mixed"), FlipState(low_since=0.0), {"mixed": 3}, now=600.0, rule=RULE)
    assert s == step(idle("mixed"), FlipState(), {}, now=0.0, rule=RULE) and not s.drain


def test_a_restarted_operator_goes_on_from_what_the_pod_carries() -> None:
    # Midway through a drain the operator restarts: the new one reads the pod's annotations.
    s = step(idle("prefill"), FlipState(low_since=0.0), PAIR, now=61.0, rule=RULE)
    carried = {k: v for k, v in annotations_of(s.state).items() if v is not None}
    assert carried == {FLIP_TO: "decode"}
    resumed = state_of(carried)
    s = step(idle("prefill", drained=True), resumed, PAIR, now=70.0, rule=RULE)
    assert s.set_role == "decode"
    # A window under way keeps its start across a restart, and junk reads as nothing.
    assert state_of(annotations_of(FlipState(low_since=12.5))) == FlipState(low_since=12.5)
    assert state_of({FLIP_TO: "mixed", LOW_SINCE: "soon"}) == FlipState()


def test_an_engine_s_load_report_reads_as_its_role_sees_it() -> None:
    prefill = {"role": "prefill", "queued_prefill_tokens": 512, "running": 1, "busy_share": 0.4}
    assert load_of(prefill) == EngineLoad("prefill", 0.4, False)
    decode = {"role": "decode", "running": 0, "waiting": 0, "max_num_seqs": 64, "sessions": {}}
    assert load_of(decode | {"busy_share": 0.0}) == EngineLoad("decode", 0.0, True)
    # An engine that reports no busy share is never taken for idle.
    assert load_of(decode).busy == 1.0
    paused = decode | {"sessions": {"awaiting_client": 1}}
    assert load_of(paused).drained is False  # a session still lives
    done = decode | {"sessions": {"finished": 2}}
    assert load_of(done).drained is True  # finished ones hold nothing


@pytest.mark.parametrize("kw", [{"window_s": 0}, {"idle_below": 0}, {"min_per_role": 0}])
def test_a_bad_rule_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="FlipRule"):
        FlipRule(**kw)  # type: ignore[arg-type]
