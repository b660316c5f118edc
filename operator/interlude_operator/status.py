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
