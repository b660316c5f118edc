"""The scaling rule, pure: metric means, targets, the serving count and recent history in,
the replica count wanted and why out (a pool with roles: per role, `recommend_by_role`).

Each pass turns the means into a *recommendation* the way Kubernetes' HPA does, per metric
`ceil(current * value / target)`, the largest winning; within a tolerance below the target the
count holds, so a metric hovering at its target does not flap. Recommendations are absolute
counts kept with their time (`History`). The windows then decide as the HPA's stabilization
does: scale up to the *lowest* recommendation of the scale-up window (the load must persist),
down to the *highest* of the scale-down window (it must stay low all along), and only once the
history covers the whole window, so a restarted operator waits a full window before it removes
an engine. Scale-down goes one engine at a time: each one is drained first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from interlude_operator.spec import Scaling, Targets

# Below the target by less than this share, the count holds (the HPA's default tolerance).
TOLERANCE = 0.1


@dataclass(frozen=True)
class Observation:
    """Means over the serving engines that reported (None: no engine reported that metric)."""

    kv_usage: float | None = None
    contended_waste: float | None = None
    queue_depth: float | None = None
    engines: int = 0

    def __post_init__(self) -> None:
        if self.engines < 0:
            raise ValueError(f"engines must be >= 0, got {self.engines}")
        for name in ("kv_usage", "contended_waste", "queue_depth"):
            value = getattr(self, name)
            if value is not None and (value < 0 or math.isnan(value)):
                raise ValueError(f"{name} must be a number >= 0, got {value}")

    def ratios(self, targets: Targets) -> dict[str, float]:
        """Each reported metric over its target (a zero target: any value > 0 passes it)."""
        out: dict[str, float] = {}
        for name, value, target in (
            ("kvUsage", self.kv_usage, targets.kv_usage),
            ("contendedWaste", self.contended_waste, targets.contended_waste),
            ("queueDepth", self.queue_depth, targets.queue_depth),
        ):
            if value is None:
                continue
            out[name] = value / target if target > 0 else (math.inf if value > 0 else 0.0)
        return out


@dataclass(frozen=True)
class Recommendation:
    replicas: int
    reason: str

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")


def recommend(
    obs: Observation, targets: Targets, current: int, starting: int = 0
) -> Recommendation:
    """The count this one observation asks for (not yet clamped nor stabilized).

    `starting`: serving engines that did not report (not ready yet, or not yet created). As
    the HPA does with pods that have no metrics, they count as idle when scaling up (they will
    take load soon: a pool whose engines take minutes to load does not run to its maximum
    meanwhile) and block scaling down.
    """
    ratios = obs.ratios(targets)
    if obs.engines == 0 or not ratios:
        return Recommendation(current, "no engine reported metrics: holding")
    name, top = max(ratios.items(), key=lambda kv: kv[1])
    shown = _show(obs, name)
    if starting > 0:
        spread = top * obs.engines / (obs.engines + starting)
        if top > 1.0 >= spread:
            return Recommendation(
                current, f"{name} {shown} is over its target; {starting} engines still starting"
            )
        if top <= 1.0 - TOLERANCE:
            return Recommendation(
                current, f"under target, but {starting} engines still starting: holding"
            )
        top = spread if top > 1.0 else top
    if top > 1.0:
        n = current + 1 if math.isinf(top) else max(current + 1, math.ceil(current * top))
        return Recommendation(n, f"{name} {shown} is over its target")
    if top > 1.0 - TOLERANCE:
        return Recommendation(current, f"{name} {shown} is at its target")
    return Recommendation(
        math.ceil(current * top), f"all metrics under target (highest {name} {shown})"
    )


def recommend_by_role(
    decode: Observation,
    prefill: Observation,
    targets: Targets,
    decode_count: int,
    prefill_count: int,
    starting: int = 0,
    min_prefill: int = 1,
) -> tuple[Recommendation, int]:
    """A pool with roles: each role's count from its own engines' metrics, summed; and the
    prefill engines wanted (at least `min_prefill`).

    Decode engines hold the sessions and their KV, so every target reads them; a prefill
    engine frees each prompt's KV as the prompt leaves, so only its queue counts (its KV usage
    and waste would read as idle and, mixed into one mean, hide the decode engines' load).
    Engines still starting count with the decode engines: every engine starts as one.
    """
    d = recommend(decode, targets, decode_count, starting)
    queue = Observation(queue_depth=prefill.queue_depth, engines=prefill.engines)
    p = recommend(queue, targets, prefill_count)
    wanted = max(min_prefill, p.replicas)
    reason = f"{d.reason}; prefill engines: {p.reason}"
    return Recommendation(d.replicas + wanted, reason), wanted


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, any monotonic clock
    replicas: int


@dataclass(frozen=True)
class History:
    """Recent recommendations, oldest first; `add` returns a new, trimmed history."""

    samples: tuple[Sample, ...] = ()

    def __post_init__(self) -> None:
        if any(a.at > b.at for a, b in zip(self.samples, self.samples[1:], strict=False)):
            raise ValueError("history samples must be in time order")

    def add(self, at: float, replicas: int, keep_s: float) -> History:
        """Append, then drop what no window of `keep_s` seconds or less can need."""
        samples = (*self.samples, Sample(at, replicas))
        boundary = at - keep_s
        # The newest sample at or before the boundary stays: it was in force at the window's start.
        first = max((i for i, s in enumerate(samples) if s.at <= boundary), default=0)
        return History(samples[first:])

    def window(self, now: float, window_s: float) -> tuple[Sample, ...] | None:
        """The recommendations in force during the last `window_s` seconds, or None if the
        history does not reach back that far."""
        boundary = now - window_s
        older = [s for s in self.samples if s.at <= boundary]
        if not older:
            return None
        return (older[-1], *(s for s in self.samples if s.at > boundary))

    def span(self, now: float) -> float:
        return now - self.samples[0].at if self.samples else 0.0


@dataclass(frozen=True)
class Decision:
    desired: int
    direction: str  # up, down or hold (the CRD's lastDecision.direction)
    reason: str
    code: str  # stable key of the reason, to post an event when it changes, not every pass

    def __post_init__(self) -> None:
        if self.direction not in ("up", "down", "hold"):
            raise ValueError(f"direction must be up, down or hold, got {self.direction!r}")
        if self.desired < 0:
            raise ValueError(f"desired must be >= 0, got {self.desired}")


def decide(
    history: History, now: float, current: int, latest: Recommendation, scaling: Scaling
) -> Decision:
    """What to do now with `current` serving engines, given the history (which already holds
    `latest` at `now`)."""
    if current < scaling.min_replicas:
        return Decision(
            scaling.min_replicas, "up", f"below minReplicas {scaling.min_replicas}", "min"
        )
    if current > scaling.max_replicas:
        return Decision(current - 1, "down", f"above maxReplicas {scaling.max_replicas}", "max")
    clamped = scaling.clamp(latest.replicas)
    up = history.window(now, scaling.up_window_s)
    if up is not None:
        target = scaling.clamp(min(s.replicas for s in up))
        if target > current:
            return Decision(target, "up", latest.reason, "up")
    down = history.window(now, scaling.down_window_s)
    if down is not None:
        target = scaling.clamp(max(s.replicas for s in down))
        if target < current:
            reason = f"{latest.reason} for {scaling.down_window_s:.0f} s; draining one engine"
            return Decision(current - 1, "down", reason, "down")
    if clamped > current:
        waited = min(history.span(now), scaling.up_window_s)
        reason = f"{latest.reason}; scale-up window {waited:.0f} of {scaling.up_window_s:.0f} s"
        return Decision(current, "hold", reason, "wait-up")
    if clamped < current:
        if down is None:
            waited = history.span(now)
            reason = (
                f"{latest.reason}; scale-down window {waited:.0f} of {scaling.down_window_s:.0f} s"
            )
        else:
            reason = f"{latest.reason}, but not for the whole scale-down window"
        return Decision(current, "hold", reason, "wait-down")
    if latest.replicas != clamped:
        bound = "maxReplicas" if latest.replicas > clamped else "minReplicas"
        return Decision(current, "hold", f"{latest.reason}; at {bound} {clamped}", "bound")
    code = "no-metrics" if latest.reason.startswith("no engine") else "steady"
    return Decision(current, "hold", latest.reason, code)


def _show(obs: Observation, name: str) -> str:
    value = {
        "kvUsage": obs.kv_usage,
        "contendedWaste": obs.contended_waste,
        "queueDepth": obs.queue_depth,
    }[name]
    return f"{value:.3g}"
