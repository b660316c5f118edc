"""What one pass reads of an EnginePool, and what the rule makes of it.

`ensure_deployment` makes the pool's Deployment or rolls its pod template, `read_engines`
lists its engine pods and drains, `read_metrics` reads the engines' numbers; `assess` (pure)
turns those into the observation the rule scales on and its recommendation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude_operator import deployment as dep
from interlude_operator.actions import Post
from interlude_operator.decide import Observation, Recommendation, recommend, recommend_by_role
from interlude_operator.kube import Kube, deployment_path, pod_path, version_of
from interlude_operator.metrics import (
    EngineReading,
    MetricsError,
    MetricsSource,
    Target,
    observe,
)
from interlude_operator.pods import (
    DrainEntry,
    EnginePod,
    Engines,
    classify,
    parse_draining,
    parse_pod,
    selects,
)
from interlude_operator.spec import PoolSpec


class OwnershipError(RuntimeError):
    """The Deployment the pool would own exists and belongs to something else."""


async def ensure_deployment(
    kube: Kube, body: Mapping[str, Any], spec: PoolSpec, post: Post
) -> dict[str, Any]:
    """The pool's engine Deployment as it stands after this call. Side effects: creates it
    when missing, or patches its pod template when the spec's hash changed (conditional on the
    version read), with an event for either; OwnershipError if another owner holds the name."""
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


@dataclass(frozen=True)
class Seen:
    """What a pass read of the pool's Deployment and engine pods."""

    replicas: int  # the Deployment's spec.replicas
    released: str  # the pod its released-pod annotation names ("" for none)
    pods: list[EnginePod]
    drains: list[DrainEntry]  # status.draining, less the drain the last release ended
    engines: Engines

    @property
    def active(self) -> int:
        """The engines counted as serving: the replicas less those draining."""
        return self.replicas - len(self.drains)


async def read_engines(
    kube: Kube, ns: str, name: str, deployment: Mapping[str, Any], status: Mapping[str, Any]
) -> Seen:
    """The Deployment's replicas and released pod, the pool's engine pods and its drains, and
    the engines classified from them. Side effects: one pod list from the API server."""
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    released = (deployment.get("metadata", {}).get("annotations") or {}).get(dep.RELEASED_POD, "")
    pod_objs = await kube.list(pod_path(ns), dep.selector(name))
    pods = [parse_pod(p) for p in pod_objs if selects(dep.selector(name), p)]
    # A drain whose pod the last release named is over: the replicas dropped already. One
    # whose pod vanished otherwise (evicted, deleted by hand) ends in this pass.
    drains = [d for d in parse_draining(status.get("draining")) if d.pod != released]
    return Seen(replicas, released, pods, drains, classify(pods, drains, released))


async def read_metrics(
    source: MetricsSource, ns: str, port: int, engines: Engines
) -> tuple[dict[str, EngineReading], str]:
    """The readings of the serving and draining engines with an address, by pod, and why the
    source failed ("" if it did not; then no readings). Side effects: the source's reads."""
    targets = [Target(p.name, p.ip, port) for p in (*engines.serving, *engines.draining) if p.ip]
    try:
        return await source.read(ns, targets), ""
    except MetricsError as exc:
        return {}, str(exc)


@dataclass(frozen=True)
class Load:
    """What the engines' readings say: the observation the rule scales on, its latest
    recommendation, the prefill engines (empty without roles) and how many prefill engines
    the rule wants (unchanged without roles)."""

    obs: Observation
    latest: Recommendation
    prefill: set[str]
    prefill_want: int


def assess(
    spec: PoolSpec,
    engines: Engines,
    readings: Mapping[str, EngineReading],
    active: int,
    prefill_want: int,
) -> Load:
    """What the rule recommends from the ready serving engines that reported (engines counted
    but not reporting are starting); `prefill_want` is the last pass's (pure)."""
    reporting = [
        p for p in engines.serving if p.ready and p.name in readings and readings[p.name].reported
    ]
    prefill = {p.name for p in engines.serving if spec.roles.enabled and p.role == "prefill"}
    # A pool with roles scales each role on its own engines (the status shows the others').
    obs = observe([readings[p.name] for p in reporting if p.name not in prefill])
    starting = max(0, active - len(reporting))
    if not spec.roles.enabled:
        return Load(obs, recommend(obs, spec.targets, active, starting), prefill, prefill_want)
    prefill_obs = observe([readings[p.name] for p in reporting if p.name in prefill])
    n = len(prefill)
    latest, prefill_want = recommend_by_role(
        obs, prefill_obs, spec.targets, active - n, n, starting, spec.roles.prefill
    )
    return Load(obs, latest, prefill, prefill_want)
