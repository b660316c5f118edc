"""One pass over one EnginePool: read, decide, write, report.

A pass runs every `spec.metrics.intervalSeconds`. It makes sure the pool's Deployment exists
and matches the spec, reads the engines, decides the serving count (this operator's rule, or
`spec.replicas` as an external scaler set it), applies it through `actions.Writes` and
writes the status. `spec.replicas` is the number of *serving* engines; the Deployment runs
that many plus those still draining.
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
from interlude_operator.decide import (
    Decision,
    History,
    Recommendation,
    decide,
    recommend,
    recommend_by_role,
)
from interlude_operator.kube import Kube, deployment_path, pod_path, version_of
from interlude_operator.metrics import (
    EngineReading,
    MetricsError,
    MetricsSource,
    Target,
    observe,
)
from interlude_operator.pods import (
    EnginePod,
    Engines,
    choose_to_drain,
    classify,
    now_utc,
    parse_draining,
    parse_pod,
    selects,
)
from interlude_operator.prom import PrometheusSource
from interlude_operator.roles import HttpEngineCalls, roles_pass
from interlude_operator.scrape import ScrapeSource
from interlude_operator.spec import PoolSpec
from interlude_operator.status import (
    Condition,
    conditions,
    decision_status,
    draining_status,
    metrics_status,
)


class OwnershipError(RuntimeError):
    """The Deployment the pool would own exists and belongs to something else."""


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


async def ensure_deployment(
    kube: Kube, body: Mapping[str, Any], spec: PoolSpec, post: Post
) -> dict[str, Any]:
    meta = body["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
    path = deployment_path(ns, dep.name_of(name))
    current = await kube.get(path)
    if current is None:
        start = spec.scaling.clamp(
            spec.scaling.replicas if spec.scaling.replicas is not None else 0
        )
        created = await kube.create(deployment_path(ns), dep.render(name, ns, uid, spec, start))
        post(
            "Normal",
            "DeploymentCreated",
            f"engine Deployment {dep.name_of(name)}: {start} replicas",
        )
        return created or dep.render(name, ns, uid, spec, start)
    owners = current.get("metadata", {}).get("ownerReferences") or []
    if uid and not any(o.get("uid") == uid for o in owners):
        raise OwnershipError(
            f"Deployment {ns}/{dep.name_of(name)} exists and is not this EnginePool's: "
            "rename or delete it"
        )
    template = dep.pod_template(name, spec)
    digest = dep.template_hash(template)
    annotations = dict(current.get("metadata", {}).get("annotations") or {})
    if annotations.get(dep.TEMPLATE_HASH) != digest:
        annotations[dep.TEMPLATE_HASH] = digest
        ops = [
            {"op": "replace", "path": "/spec/template", "value": template},
            {"op": "add", "path": "/metadata/annotations", "value": annotations},
        ]
        # Conditional on the version read: the annotations go back whole, and another writer's
        # since then must not be dropped (a 409 instead, and the next pass reads them).
        current = await kube.patch(path, ops, version_of(current)) or current
        post("Normal", "DeploymentUpdated", "engine pod template changed: rolling the engines")
    return current


async def reconcile(
    body: Mapping[str, Any],
    spec: PoolSpec,
    kube: Kube,
    state: PoolState,
    post: Post,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """One pass if one is due; whether it ran."""
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
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    released = (deployment.get("metadata", {}).get("annotations") or {}).get(dep.RELEASED_POD, "")
    pod_objs = await kube.list(pod_path(ns), dep.selector(name))
    pods = [parse_pod(p) for p in pod_objs if selects(dep.selector(name), p)]
    # A drain whose pod the last release named is over: the replicas dropped already. One
    # whose pod vanished otherwise (evicted, deleted by hand) ends in this pass.
    drains = [d for d in parse_draining(status.get("draining")) if d.pod != released]
    engines = classify(pods, drains, released)
    flipping: set[str] = set()
    if spec.roles.enabled:
        state.calls = state.calls or HttpEngineCalls()
        prefill_target = max(spec.roles.prefill, state.prefill_want)
        flipping = await roles_pass(
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
    targets = [
        Target(p.name, p.ip, spec.port) for p in (*engines.serving, *engines.draining) if p.ip
    ]
    try:
        readings = await source_for(spec, state).read(ns, targets)
        failure = ""
    except MetricsError as exc:
        readings, failure = {}, str(exc)
    reporting = [
        p for p in engines.serving if p.ready and p.name in readings and readings[p.name].reported
    ]
    prefill = {p.name for p in engines.serving if spec.roles.enabled and p.role == "prefill"}
    # A pool with roles scales each role on its own engines (the status shows the others').
    obs = observe([readings[p.name] for p in reporting if p.name not in prefill])
    writes = Writes(kube, ns, name, post, replicas, drains, version_of(deployment), pool_version)
    active = replicas - len(drains)
    starting = max(0, active - len(reporting))
    if spec.roles.enabled:
        prefill_obs = observe([readings[p.name] for p in reporting if p.name in prefill])
        n = len(prefill)
        latest, state.prefill_want = recommend_by_role(
            obs, prefill_obs, spec.targets, active - n, n, starting, spec.roles.prefill
        )
    else:
        latest = recommend(obs, spec.targets, active, starting)

    decision = _decide(spec, state, latest, active, bool(drains), now)
    want = decision.desired
    if not spec.scaling.external and spec.scaling.replicas != want:
        await writes.patch_pool({"spec": {"replicas": want}})
    if decision.code != state.last_code and decision.direction == "hold":
        post("Normal", "Holding", f"{active} serving engines: {decision.reason}")
    state.last_code = decision.code
    if failure and not state.metrics_failed:
        post("Warning", "MetricsUnavailable", failure)
    state.metrics_failed = bool(failure)

    await writes.sync_marks(engines, keep=flipping)
    # An engine draining for a role flip stays: it is about to serve in its new role. In a
    # pool with roles, scale-down takes a prefill engine while there are more than wanted.
    candidates = [p for p in engines.serving if p.name not in flipping]
    if spec.roles.enabled:
        extra_prefill = len(prefill) > state.prefill_want
        candidates = [p for p in candidates if (p.name in prefill) == extra_prefill] or candidates
    await _apply(writes, engines, readings, want, active, decision.reason, wall, candidates)
    # A drain lasts at least until the next pass, so the gateway has seen its mark before
    # the engine's sessions are counted out.
    await writes.finish_drains(
        classify(pods, writes.drains, released), readings, wall, spec.scaling.drain_timeout_s
    )
    for p in engines.released:
        await writes.delete(p.name)

    ready = sum(1 for p in engines.serving if p.ready)
    serving = writes.replicas - len(writes.drains)
    conds = [
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
            bool(writes.drains),
            "EnginesDraining" if writes.drains else "NoDrain",
            ", ".join(d.pod for d in writes.drains) or "no engine is draining",
        ),
    ]
    new_status = {
        "observedGeneration": meta.get("generation"),
        "model": spec.served_name,
        "currentReplicas": serving,
        "readyReplicas": ready,
        "desiredReplicas": want,
        "selector": ",".join(f"{k}={v}" for k, v in dep.selector(name).items()),
        "draining": draining_status(writes.drains),
        "metrics": metrics_status(obs, wall) or None,
        "lastDecision": decision_status(decision, active, wall),
        "conditions": conditions(conds, status.get("conditions"), wall, meta.get("generation")),
    }
    await writes.patch_pool({"status": new_status}, "status")
    telemetry.record_pass(
        ns,
        name,
        desired=want,
        serving=serving,
        ready=ready,
        draining=len(writes.drains),
        direction=decision.direction,
        observed=obs,
        targets=spec.targets,
    )
    return True


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
