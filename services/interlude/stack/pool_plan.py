"""One pass of the local pool controller, pure: the operator's rule over local engines.

`interlude up --min-engines N --engines M` scales its engines between N and M on one machine
with the operator's own decision code (`interlude_operator.decide`: HPA-style recommendations
with stabilization windows; `pods.choose_to_drain` and `pods.drain_finished`), so the rule a
cluster runs can be exercised and shown without Kubernetes. What differs is only the carrying
out (`stack/pool.py`): processes instead of a Deployment, a roster file instead of pod labels.

As in `interlude_operator.reconcile`: engines not yet ready count as starting (idle when
scaling up, blocking a scale-down); scale-down drains one engine at a time, the one whose drain
costs least; a drain lasts at least one pass (the gateway must have read the roster before the
engine's sessions are counted out) and ends when the engine's sessions are finished, when it
is not ready, or at the drain timeout; a scale-up first takes back the most recent drains.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from interlude_operator.decide import Decision, History, Observation, Recommendation, decide
from interlude_operator.decide import recommend as recommend_count
from interlude_operator.metrics import EngineReading, observe
from interlude_operator.pods import DrainEntry, EnginePod, choose_to_drain, drain_finished
from interlude_operator.spec import Scaling, Targets


@dataclass(frozen=True)
class LocalEngine:
    """What the controller knows of one engine process it runs."""

    name: str
    started: dt.datetime  # timezone-aware: the drain's clock and the youngest-first order
    ready: bool
    draining_since: dt.datetime | None = None  # set from the pass that started its drain

    def __post_init__(self) -> None:
        if self.started.tzinfo is None:
            raise ValueError("started must be timezone-aware")

    def pod(self) -> EnginePod:
        """As the operator's pod rules see it."""
        return EnginePod(
            name=self.name,
            ip="127.0.0.1",
            ready=self.ready,
            terminating=False,
            created=self.started.isoformat(),
            draining=self.draining_since is not None,
        )


@dataclass(frozen=True)
class PoolPass:
    """A pass's reading and what to do: start `start` engines, take back the drains of
    `undrain`, start draining `drain`, and stop the engines of `stop` (name, why)."""

    observation: Observation
    recommendation: Recommendation
    decision: Decision
    start: int = 0
    undrain: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    stop: tuple[tuple[str, str], ...] = ()


def plan(
    engines: Sequence[LocalEngine],
    readings: Mapping[str, EngineReading],
    history: History,
    now_s: float,
    wall: dt.datetime,
    scaling: Scaling,
    targets: Targets,
) -> tuple[PoolPass, History]:
    """This pass's actions and the history with its recommendation; `now_s` is a monotonic
    clock for the windows, `wall` the time of day for the drains."""
    serving = [e for e in engines if e.draining_since is None]
    draining = [e for e in engines if e.draining_since is not None]
    reporting = [e for e in serving if e.ready and e.name in readings and readings[e.name].reported]
    obs = observe([readings[e.name] for e in reporting])
    active = len(serving)
    latest = recommend_count(obs, targets, active, active - len(reporting))
    history = history.add(now_s, latest.replicas, max(scaling.up_window_s, scaling.down_window_s))
    decision = decide(history, now_s, active, latest, scaling)
    if decision.direction == "down" and draining:
        decision = Decision(
            active, "hold", f"{decision.reason}; waiting for the drain in progress", "draining"
        )
    start = 0
    undrain: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    if decision.desired > active:
        # The most recent drain first, as the operator cancels them.
        back = sorted(draining, key=lambda e: e.draining_since or wall, reverse=True)
        undrain = tuple(e.name for e in back[: decision.desired - active])
        start = decision.desired - active - len(undrain)
    elif decision.desired < active:
        victims = choose_to_drain([e.pod() for e in serving], readings, active - decision.desired)
        drain = tuple(p.name for p in victims)
    stop = tuple(
        (e.name, why)
        for e in draining
        if e.name not in undrain and (why := _drain_over(e, readings, wall, scaling)) is not None
    )
    return PoolPass(obs, latest, decision, start, undrain, drain, stop), history


def _drain_over(
    e: LocalEngine, readings: Mapping[str, EngineReading], wall: dt.datetime, scaling: Scaling
) -> str | None:
    assert e.draining_since is not None
    entry = DrainEntry(e.name, e.draining_since)
    return drain_finished(entry, e.pod(), readings.get(e.name), wall, scaling.drain_timeout_s)
