"""An EnginePool's status, built from one pass (pure).

Conditions follow the Kubernetes convention (type, status, reason, message, a transition time
that moves only when the status flips): `Ready` (the serving engines wanted are ready),
`MetricsAvailable` (the last read reached at least one engine), `ScalingActive` (this
operator's rule decides, rather than an external scaler through /scale), `Draining`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlude_operator.decide import Decision, Observation
from interlude_operator.pods import DrainEntry, rfc3339
from interlude_operator.spec import PoolSpec


@dataclass(frozen=True)
class Condition:
    type: str
    ok: bool
    reason: str  # CamelCase, as the convention asks
    message: str

    def __post_init__(self) -> None:
        if not self.reason or not self.reason[0].isupper() or " " in self.reason:
            raise ValueError(f"a condition reason is one CamelCase word, got {self.reason!r}")


def conditions(
    new: Sequence[Condition],
    old: Sequence[Mapping[str, Any]] | None,
    now: dt.datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The conditions as the status holds them, keeping each transition time that still holds."""
    before = {c.get("type"): c for c in old or ()}
    out = []
    for c in new:
        status = "True" if c.ok else "False"
        prior = before.get(c.type)
        since = rfc3339(now)
        if prior is not None and prior.get("status") == status:
            since = str(prior.get("lastTransitionTime") or since)
        item: dict[str, Any] = {
            "type": c.type,
            "status": status,
            "reason": c.reason,
            "message": c.message[:32768],
            "lastTransitionTime": since,
        }
        if generation is not None:
            item["observedGeneration"] = generation
        out.append(item)
    return out


def metrics_status(obs: Observation | None, at: dt.datetime | None) -> dict[str, Any]:
    if obs is None or at is None:
        return {}
    out: dict[str, Any] = {"observedAt": rfc3339(at)}
    for key, value in (
        ("kvUsage", obs.kv_usage),
        ("contendedWaste", obs.contended_waste),
        ("queueDepth", obs.queue_depth),
    ):
        if value is not None:
            out[key] = round(value, 4)
    return out


def decision_status(decision: Decision, current: int, at: dt.datetime) -> dict[str, Any]:
    return {
        "direction": decision.direction,
        "from": current,
        "to": decision.desired,
        "reason": decision.reason[:1024],
        "time": rfc3339(at),
    }


def draining_status(entries: Sequence[DrainEntry]) -> list[dict[str, Any]]:
    return [e.as_status() for e in entries]


def pool_status(
    spec: PoolSpec,
    decision: Decision,
    obs: Observation,
    failure: str,
    *,
    generation: int | None,
    selector: Mapping[str, str],
    active: int,
    serving: int,
    ready: int,
    drains: Sequence[DrainEntry],
    old_conditions: Sequence[Mapping[str, Any]] | None,
    at: dt.datetime,
) -> dict[str, Any]:
    """The pool's status after a pass: `active` serving engines when it decided, `serving`
    after its writes, `ready` of them ready; `failure` why the metrics source failed ("")."""
    want = decision.desired
    conds = pool_conditions(spec, want, ready, obs, failure, drains)
    return {
        "observedGeneration": generation,
        "model": spec.served_name,
        "currentReplicas": serving,
        "readyReplicas": ready,
        "desiredReplicas": want,
        "selector": ",".join(f"{k}={v}" for k, v in selector.items()),
        "draining": draining_status(drains),
        "metrics": metrics_status(obs, at) or None,
        "lastDecision": decision_status(decision, active, at),
        "conditions": conditions(conds, old_conditions, at, generation),
    }


def pool_conditions(
    spec: PoolSpec,
    want: int,
    ready: int,
    obs: Observation,
    failure: str,
    drains: Sequence[DrainEntry],
) -> list[Condition]:
    """The four conditions of a pass: Ready, MetricsAvailable, ScalingActive, Draining."""
    return [
        Condition(
            "Ready",
            ready >= min(want, max(1, spec.scaling.min_replicas)),
            "EnginesReady" if ready >= want else "EnginesStarting",
            f"{ready} of {want} serving engines ready",
        ),
        Condition(
            "MetricsAvailable",
            obs.engines > 0,
            "MetricsRead" if obs.engines else ("SourceFailed" if failure else "NoEngineReported"),
            failure or f"{obs.engines} engines reported ({spec.metrics.source})",
        ),
        Condition(
            "ScalingActive",
            not spec.scaling.external,
            "ExternalScaler" if spec.scaling.external else "OperatorRule",
            "spec.replicas is set through /scale by KEDA or an HPA"
            if spec.scaling.external
            else "this operator's rule sets spec.replicas",
        ),
        Condition(
            "Draining",
            bool(drains),
            "EnginesDraining" if drains else "NoDrain",
            ", ".join(d.pod for d in drains) or "no engine is draining",
        ),
    ]
