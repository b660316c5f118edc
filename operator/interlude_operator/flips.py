"""Role flips in the operator: an engine's `/v1/load` read as a flip's load, and the flip state
kept on its pod. The rule itself is `interlude.policy.flips` (the simulator runs it too).

Here a drain is the draining label (the gateway sends the engine no new session and no new
prefill, and still resumes its paused sessions) and a flip is `PUT /v1/role` on the engine.

The state lives on the pod (`annotations_of` / `state_of`), so an operator that restarts midway
goes on from where the last one was: a drain under way is finished, a window under way keeps
its start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from interlude.policy.flips import OTHER, EngineLoad, FlipState
from interlude_operator.metrics import UNFINISHED

FLIP_TO = "interlude.dev/flip-to"  # the role a drain under way ends in
LOW_SINCE = "interlude.dev/low-since"  # when the engine's load went under the threshold (epoch s)


def load_of(load: Mapping[str, Any]) -> EngineLoad:
    """From an engine's `/v1/load`: its busy share (an engine that does not report one reads
    as busy, so it is never flipped on missing data), and whether it is drained."""
    role = str(load.get("role", "mixed"))
    busy = min(1.0, float(load.get("busy_share", 1.0)))
    queued = float(load.get("queued_prefill_tokens", 0))
    running = float(load.get("running", 0))
    waiting = float(load.get("waiting", 0))
    sessions = dict(load.get("sessions") or {})
    live = sum(float(sessions.get(state, 0)) for state in UNFINISHED)
    if role == "prefill":
        return EngineLoad(role, busy, queued == 0 and running == 0)
    return EngineLoad(role, busy, live == 0 and running == 0 and waiting == 0)


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
