"""Which engine pod is what (serving, draining, released), which to drain, when a drain ends.

Pure: pods come in as the API's JSON, decisions go out as values. The marks on a pod are the
ones the gateway and the ReplicaSet controller read: the `interlude.dev/draining` label (the
gateway sends no new session to an engine carrying it, and still resumes its paused ones) and
`controller.kubernetes.io/pod-deletion-cost` (of the pods a Deployment removes on scale-down,
the ReplicaSet takes those with the lowest cost first).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlude.api.cluster import DRAINING_LABEL
from interlude.policy.flips import FlipState
from interlude_operator.flips import state_of
from interlude_operator.metrics import EngineReading

POOL_LABEL = "interlude.dev/enginepool"  # every engine pod of a pool; the Deployment's selector
ROLE_LABEL = "interlude.dev/role"  # pools with roles: the engine's role as the operator set it
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# The lowest int32, far below the default 0: on scale-down the ReplicaSet takes this pod first.
DRAINING_COST = "-2147483648"


@dataclass(frozen=True)
class EnginePod:
    name: str
    ip: str
    ready: bool
    terminating: bool
    created: str  # RFC 3339, sorts in time order
    draining: bool
    role: str = ""  # ROLE_LABEL; "" until the operator has given the engine its role
    flip: FlipState = field(default_factory=FlipState)  # a role flip under way (flips.py)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a pod must have a name")


def parse_pod(obj: Mapping[str, Any]) -> EnginePod:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return EnginePod(
        name=str(meta.get("name", "")),
        ip=str(status.get("podIP") or ""),
        ready=ready and bool(status.get("podIP")),
        terminating=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        draining=(meta.get("labels") or {}).get(DRAINING_LABEL) == "true",
        role=str((meta.get("labels") or {}).get(ROLE_LABEL) or ""),
        flip=state_of(meta.get("annotations") or {}),
    )


def selects(selector: Mapping[str, str], obj: Mapping[str, Any]) -> bool:
    """Whether a pod's labels match an equality selector (checked here too: an API server
    honours `labelSelector`, but not every emulator does)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class DrainEntry:
    """One `status.draining` item: the engine that gets no new sessions since `since`."""

    pod: str
    since: dt.datetime
    paused: int = 0

    def __post_init__(self) -> None:
        if not self.pod:
            raise ValueError("a drain entry must name its pod")
        if self.since.tzinfo is None:
            raise ValueError("since must be timezone-aware")
        if self.paused < 0:
            raise ValueError(f"paused must be >= 0, got {self.paused}")

    def as_status(self) -> dict[str, Any]:
        return {"pod": self.pod, "since": rfc3339(self.since), "pausedSessions": self.paused}


def parse_draining(items: Sequence[Mapping[str, Any]] | None) -> list[DrainEntry]:
    out = []
    for item in items or ():
        since = item.get("since")
        try:
            when = dt.datetime.fromisoformat(str(since).replace("Z", "+00:00"))
        except ValueError:
            when = now_utc()  # unreadable: the drain restarts its clock rather than end early
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        out.append(DrainEntry(str(item["pod"]), when, int(item.get("pausedSessions", 0))))
    return out


@dataclass(frozen=True)
class Engines:
    """A pool's live pods, split by role."""

    serving: tuple[EnginePod, ...]  # counted by the Deployment, open to new sessions
    draining: tuple[EnginePod, ...]  # counted, closed to new sessions, in status.draining
    released: tuple[EnginePod, ...]  # drained, no longer counted, still to be deleted


def classify(pods: Sequence[EnginePod], drains: Sequence[DrainEntry], released: str) -> Engines:
    """Split the live pods; `released` names the pod the Deployment's last scale-down left
    out (its RELEASED_POD annotation), which may still run for a moment."""
    live = [p for p in pods if not p.terminating]
    names = {d.pod for d in drains} - {released}
    return Engines(
        serving=tuple(p for p in live if p.name not in names and p.name != released),
        draining=tuple(p for p in live if p.name in names),
        released=tuple(p for p in live if p.name == released),
    )


def choose_to_drain(
    serving: Sequence[EnginePod], readings: Mapping[str, EngineReading], n: int
) -> list[EnginePod]:
    """The `n` engines whose drain costs least: not ready ones first (they hold nothing), then
    the fewest unfinished sessions, then the youngest (the coldest prefix cache)."""

    def cost(p: EnginePod) -> tuple[int, int]:
        reading = readings.get(p.name)
        unfinished = reading.unfinished if reading is not None else None
        sessions = unfinished if unfinished is not None else 1 << 30
        return (1, sessions) if p.ready else (0, 0)

    youngest_first = sorted(serving, key=lambda p: p.created, reverse=True)
    return sorted(youngest_first, key=cost)[: max(0, n)]  # stable: ties stay youngest first


def drain_finished(
    entry: DrainEntry,
    pod: EnginePod | None,
    reading: EngineReading | None,
    now: dt.datetime,
    timeout_s: float,
) -> str | None:
    """Why the drain of `entry` is over, or None while it goes on."""
    if pod is None:
        return "the pod is gone"
    if not pod.ready:
        return "the engine is not ready (its sessions cannot resume there)"
    unfinished = reading.unfinished if reading is not None else None
    if unfinished == 0:
        return "its sessions are finished"
    waited = (now - entry.since).total_seconds()
    if waited >= timeout_s:
        left = "unknown" if unfinished is None else str(unfinished)
        return (
            f"the drain timeout ({timeout_s:.0f} s) passed with {left} sessions left "
            "(their next turn recomputes on another engine)"
        )
    return None


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
