"""One pass over one EnginePool: read, decide, write, report.

A pass runs every `spec.metrics.intervalSeconds`. It makes sure the pool's Deployment exists
and matches the spec, reads the engines (both in `observed`), decides the serving count (this
operator's rule, or `spec.replicas` as an external scaler set it), applies it through
`actions.Writes` and writes the status. `spec.replicas` is the number of *serving* engines;
the Deployment runs that many plus those still draining.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from interlude_operator import deployment as dep
from interlude_operator import telemetry
from interlude_operator.actions import Post, Writes
from interlude_operator.decide import Decision, History, Recommendation, decide
from interlude_operator.kube import Kube, version_of
from interlude_operator.metrics import EngineReading, MetricsSource
from interlude_operator.observed import (
    Load,
    Seen,
    assess,
    ensure_deployment,
    read_engines,
    read_metrics,
)
from interlude_operator.pods import EnginePod, Engines, choose_to_drain, classify, now_utc
from interlude_operator.prom import PrometheusSource
from interlude_operator.roles import HttpEngineCalls, roles_pass
from interlude_operator.scrape import ScrapeSource
from interlude_operator.spec import PoolSpec
from interlude_operator.status import pool_status


@dataclass
class PoolState:
    """What the operator remembers of a pool between passes, in memory only (lost on restart:
    the windows then start over, which only delays a decision; drains live in the status)."""

    history: History = field(default_factory=History)
    last_pass: float = -1e18
    source: MetricsSource | None = None
    source_key: tuple[str, str] = ("", "")
    last_code: str = ""
    metrics_failed: bool = False
    calls: HttpEngineCalls | None = None  # pools with roles: the engines' /v1/load and role
    prefill_want: int = 0  # pools with roles: prefill engines the last pass's rule asked for

    async def close(self) -> None:
        if self.source is not None:
            await self.source.close()
        if self.calls is not None:
            await self.calls.close()


def source_for(spec: PoolSpec, state: PoolState) -> MetricsSource:
    """The pool's metrics reader, made again when the spec points elsewhere."""
    key = (spec.metrics.source, spec.metrics.prometheus_url)
    if state.source is None or state.source_key != key:
        rate_window = max(60.0, 4 * spec.metrics.interval_s)
        state.source = (
            PrometheusSource(spec.metrics.prometheus_url, rate_window=f"{rate_window:.0f}s")
            if spec.metrics.source == "prometheus"
            else ScrapeSource(rate_window_s=rate_window)
        )
        state.source_key = key
    return state.source


async def reconcile(
    body: Mapping[str, Any],
    spec: PoolSpec,
    kube: Kube,
    state: PoolState,
    post: Post,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """One pass if one is due; whether it ran.

    Side effects, in this order: the Deployment created or its template rolled, role flips
    (pools with roles), the metrics read, the pool's spec.replicas (this operator's rule),
    events, pod marks, scaling and drains, released pods deleted, the pool's status, the
    pass's telemetry; `state` keeps the history, the last decision and the metrics failure.
    """
    now = clock()
    if now - state.last_pass < spec.metrics.interval_s:
        return False
    state.last_pass = now
    wall = now_utc()
    meta, status = body["metadata"], body.get("status") or {}
    # Taken before the first await: kopf's body is live, and the pool's writes must be
    # conditional on the version the spec and status at hand came from.
    pool_version = version_of(body)
    ns, name = meta["namespace"], meta["name"]
    deployment = await ensure_deployment(kube, body, spec, post)
    seen = await read_engines(kube, ns, name, deployment, status)
    flipping = await _flip_roles(kube, ns, spec, state, seen.engines, post, wall)
    source = source_for(spec, state)
    readings, failure = await read_metrics(source, ns, spec.port, seen.engines)
    writes = Writes(
        kube, ns, name, post, seen.replicas, seen.drains, version_of(deployment), pool_version
    )
    load = assess(spec, seen.engines, readings, seen.active, state.prefill_want)
    state.prefill_want = load.prefill_want
    decision = _decide(spec, state, load.latest, seen.active, bool(seen.drains), now)
    await _announce(spec, state, writes, decision, seen.active, failure)
    await _scale_and_drain(spec, state, writes, seen, readings, load, flipping, decision, wall)
    await _report(spec, writes, seen, load, decision, failure, meta, status, wall)
    return True


async def _report(
    spec: PoolSpec,
    writes: Writes,
    seen: Seen,
    load: Load,
    decision: Decision,
    failure: str,
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    wall: dt.datetime,
) -> None:
    """Write the pass's outcome: the pool's status (conditional on its version), then the
    pass's telemetry."""
    ns, name = meta["namespace"], meta["name"]
    ready = sum(1 for p in seen.engines.serving if p.ready)
    serving = writes.replicas - len(writes.drains)
    new_status = pool_status(
        spec,
        decision,
        load.obs,
        failure,
        generation=meta.get("generation"),
        selector=dep.selector(name),
        active=seen.active,
        serving=serving,
        ready=ready,
        drains=writes.drains,
        old_conditions=status.get("conditions"),
        at=wall,
    )
    await writes.patch_pool({"status": new_status}, "status")
    telemetry.record_pass(
        ns,
        name,
        desired=decision.desired,
        serving=serving,
        ready=ready,
        draining=len(writes.drains),
        direction=decision.direction,
        observed=load.obs,
        targets=spec.targets,
    )


async def _flip_roles(
    kube: Kube,
    ns: str,
    spec: PoolSpec,
    state: PoolState,
    engines: Engines,
    post: Post,
    wall: dt.datetime,
) -> set[str]:
    """In a pool with roles, the role pass (`roles.roles_pass`: its engine calls, labels,
    annotations and events); the engines draining for a flip. Nothing without roles."""
    if not spec.roles.enabled:
        return set()
    state.calls = state.calls or HttpEngineCalls()
    prefill_target = max(spec.roles.prefill, state.prefill_want)
    return await roles_pass(
        kube,
        ns,
        engines.serving,
        spec.roles,
        state.calls,
        post,
        wall.timestamp(),
        spec.port,
        prefill_target,
    )


async def _announce(
    spec: PoolSpec, state: PoolState, writes: Writes, decision: Decision, active: int, failure: str
) -> None:
    """Make the decision known: the pool's spec.replicas (unless an external scaler sets it),
    a Holding event when a hold's cause changed, a MetricsUnavailable warning when the source
    starts failing. Updates `state.last_code` and `state.metrics_failed`."""
    want = decision.desired
    if not spec.scaling.external and spec.scaling.replicas != want:
        await writes.patch_pool({"spec": {"replicas": want}})
    if decision.code != state.last_code and decision.direction == "hold":
        writes.post("Normal", "Holding", f"{active} serving engines: {decision.reason}")
    state.last_code = decision.code
    if failure and not state.metrics_failed:
        writes.post("Warning", "MetricsUnavailable", failure)
    state.metrics_failed = bool(failure)


async def _scale_and_drain(
    spec: PoolSpec,
    state: PoolState,
    writes: Writes,
    seen: Seen,
    readings: dict[str, EngineReading],
    load: Load,
    flipping: set[str],
    decision: Decision,
    wall: dt.datetime,
) -> None:
    """Carry the decision out through `writes`, in this order: the pods' draining marks,
    scaling up or starting drains, drains that ended, released pods deleted."""
    engines = seen.engines
    await writes.sync_marks(engines, keep=flipping)
    candidates = _drain_candidates(spec, state, engines, flipping, load.prefill)
    await _apply(
        writes, engines, readings, decision.desired, seen.active, decision.reason, wall, candidates
    )
    # A drain lasts at least until the next pass, so the gateway has seen its mark before
    # the engine's sessions are counted out.
    await writes.finish_drains(
        classify(seen.pods, writes.drains, seen.released),
        readings,
        wall,
        spec.scaling.drain_timeout_s,
    )
    for p in engines.released:
        await writes.delete(p.name)


def _drain_candidates(
    spec: PoolSpec, state: PoolState, engines: Engines, flipping: set[str], prefill: set[str]
) -> list[EnginePod]:
    """The serving engines a scale-down may drain (pure)."""
    # An engine draining for a role flip stays: it is about to serve in its new role. In a
    # pool with roles, scale-down takes a prefill engine while there are more than wanted.
    candidates = [p for p in engines.serving if p.name not in flipping]
    if spec.roles.enabled:
        extra_prefill = len(prefill) > state.prefill_want
        candidates = [p for p in candidates if (p.name in prefill) == extra_prefill] or candidates
    return candidates


def _decide(
    spec: PoolSpec,
    state: PoolState,
    latest: Recommendation,
    active: int,
    draining: bool,
    now: float,
) -> Decision:
    s = spec.scaling
    if s.external:
        want = s.clamp(s.replicas if s.replicas is not None else active)
        direction = "up" if want > active else "down" if want < active else "hold"
        return Decision(
            want, direction, f"spec.replicas {want} (set by an external scaler)", "external"
        )
    keep = max(s.up_window_s, s.down_window_s)
    state.history = state.history.add(now, latest.replicas, keep)
    decision = decide(state.history, now, active, latest, s)
    if decision.direction == "down" and draining:
        # One engine at a time: the next drain waits for this one to end.
        return Decision(
            active, "hold", f"{decision.reason}; waiting for the drain in progress", "draining"
        )
    return decision


async def _apply(
    writes: Writes,
    engines: Engines,
    readings: dict[str, EngineReading],
    want: int,
    active: int,
    why: str,
    wall: dt.datetime,
    candidates: list[EnginePod],
) -> None:
    if want > active:
        await writes.cancel_drains(want - active, why)
        if want + len(writes.drains) > writes.replicas:
            await writes.scale(want + len(writes.drains), why)
    elif want < active:
        # Engines the Deployment has not created yet go first: nothing to drain there.
        unborn = active - len(engines.serving)
        if unborn > 0:
            drop = min(unborn, active - want)
            await writes.scale(writes.replicas - drop, f"{why} (pods not created yet)")
            active -= drop
        victims = choose_to_drain(candidates, readings, active - want)
        await writes.start_drains(victims, readings, wall, why)
