"""Role flips (TetriInfer section 3.5), pure: one engine's load, its flip state and the roles of
its peers in; the next state and what to do out. The operator steps real engines through it
(`interlude_operator.roles`), the simulator's cluster its simulated ones (`sim/cluster.py`).

An engine whose role has been under `FlipRule.idle_below` of its capacity for `window_s` (the
paper: idle for a minute) changes role: prefill to decode once its queue has drained, decode to
prefill once its sessions have finished or moved. It is drained first (the gateway sends it no
new session and no new prefill, and still resumes its paused sessions), then flipped (no
restart: a role is a routing property), then undrained. A flip never leaves the pool without a
prefill or a decode engine (`min_per_role`), and mixed engines never flip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    """One engine's load as a flip reads it (the operator's from `/v1/load`)."""

    role: str
    # 0..1: the share of the recent past (30 s) the engine spent in steps that computed
    # tokens. Not a queue or a count of running requests: a prefill engine that keeps up
    # with short prompts has a short queue at any instant while it computes most of the time,
    # and a decode engine with a few running requests of 256 slots steps without pause; read
    # that way, both looked idle and flipped under load (the simulator's cluster showed it).
    busy: float
    drained: bool  # nothing left to finish: no queued prefill / no live session


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
