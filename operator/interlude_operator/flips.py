"""Role flips (TetriInfer section 3.5), pure: one engine's load, its flip state and the roles of
its peers in; the next state and what to do out.

An engine whose role has been under `FlipRule.idle_below` of its capacity for `window_s` (the
paper: idle for a minute) changes role: prefill to decode once its queue has drained, decode to
prefill once its sessions have finished or moved. It is drained first (the draining label: the
gateway sends it no new session and no new prefill, and still resumes its paused sessions), then
flipped (`PUT /v1/role` on the engine: no restart), then undrained. A flip never leaves the pool
without a prefill or a decode engine (`min_per_role`), and mixed engines never flip.

The state lives on the pod (`annotations_of` / `state_of`), so an operator that restarts midway
goes on from where the last one was: a drain under way is finished, a window under way keeps
its start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude_operator.metrics import UNFINISHED

FLIP_TO = "interlude.dev/flip-to"  # the role a drain under way ends in
LOW_SINCE = "interlude.dev/low-since"  # when the engine's load went under the threshold (epoch s)
OTHER = {"prefill": "decode", "decode": "prefill"}


@dataclass(frozen=True)
class FlipRule:
    window_s: float = 60.0
    idle_below: float = 0.1  # share of the engine's capacity (`EngineLoad.busy`)
    min_per_role: int = 1

    def __post_init__(self) -> None:
        if self.window_s <= 0 or not 0 < self.idle_below <= 1 or self.min_per_role < 1:
            raise ValueError("FlipRule: window_s > 0, idle_below in (0, 1], min_per_role >= 1")


@dataclass(frozen=True)
class EngineLoad:
    """One engine as its `/v1/load` shows it."""

    role: str
    busy: float  # 0..1: a prefill engine's queued prompt tokens over its step budget, capped;
    # a decode engine's running requests over its batch slots
    drained: bool  # nothing left to finish: no queued prefill / no live session

    @classmethod
    def of(cls, load: Mapping[str, Any], step_tokens: int) -> EngineLoad:
        """From an engine's `/v1/load`; `step_tokens`: the tokens one of its steps computes."""
        role = str(load.get("role", "mixed"))
        queued = float(load.get("queued_prefill_tokens", 0))
        running = float(load.get("running", 0))
        waiting = float(load.get("waiting", 0))
        slots = max(1.0, float(load.get("max_num_seqs", 1)))
        sessions = dict(load.get("sessions") or {})
        live = sum(float(sessions.get(state, 0)) for state in UNFINISHED)
        if role == "prefill":
            return cls(role, min(1.0, queued / max(1, step_tokens)), queued == 0 and running == 0)
        return cls(role, min(1.0, running / slots), live == 0 and running == 0 and waiting == 0)


@dataclass(frozen=True)
class FlipState:
    flip_to: str | None = None  # a drain under way, ending in this role
    low_since: float | None = None


@dataclass(frozen=True)
class FlipStep:
    state: FlipState
    drain: bool  # the engine should carry the draining label
    set_role: str | None = None  # PUT this role on the engine now
    reason: str = ""


def step(
    load: EngineLoad, state: FlipState, roles: Mapping[str, int], now: float, rule: FlipRule
) -> FlipStep:
    """The next step for one engine; `roles`: how many engines hold each role now, counting
    this one, and not counting engines already draining towards another role (a caller
    stepping several engines in one pass lowers the count as each starts a flip, so two idle
    prefill engines do not both leave)."""
    if load.role not in OTHER:
        return FlipStep(FlipState(), drain=False)
    if state.flip_to is not None:
        if load.role == state.flip_to:  # the flip took: serve in the new role
            return FlipStep(FlipState(), drain=False, reason=f"now {load.role}")
        if load.drained:
            return FlipStep(state, drain=True, set_role=state.flip_to, reason="drained")
        return FlipStep(state, drain=True, reason=f"draining to {state.flip_to}")
    if load.busy >= rule.idle_below:
        return FlipStep(FlipState(), drain=False)
    since = now if state.low_since is None else state.low_since
    if now - since < rule.window_s:
        return FlipStep(FlipState(low_since=since), drain=False)
    if roles.get(load.role, 0) - 1 < rule.min_per_role:
        return FlipStep(FlipState(low_since=since), drain=False, reason="last of its role")
    target = OTHER[load.role]
    reason = f"under {rule.idle_below:.0%} for {now - since:.0f} s: draining to {target}"
    return FlipStep(FlipState(flip_to=target), drain=True, reason=reason)


def state_of(annotations: Mapping[str, str]) -> FlipState:
    """The flip state a pod carries (a malformed value reads as absent)."""
    flip_to = annotations.get(FLIP_TO)
    try:
        low_since = float(annotations[LOW_SINCE]) if LOW_SINCE in annotations else None
    except ValueError:
        low_since = None
    return FlipState(flip_to if flip_to in OTHER else None, low_since)


def annotations_of(state: FlipState) -> dict[str, str | None]:
    """The pod annotations that record `state` (None: remove the annotation)."""
    return {
        FLIP_TO: state.flip_to,
        LOW_SINCE: None if state.low_since is None else f"{state.low_since:.3f}",
    }
