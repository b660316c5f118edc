"""The writes of one pass: scale the Deployment, start, cancel and finish drains.

The order of the writes is what lets an operator killed between any two of them finish the
job when it comes back:

* a drain is written into the pool's `status.draining` *before* its pod is marked, and every
  pass marks the pods listed there again, so a mark lost to a crash comes back;
* a drain ends by lowering the Deployment's replicas together with its `released-pod`
  annotation in one write, then deleting that pod; a pass that finds the annotation naming a
  pod still listed as draining knows the replicas already dropped, and only deletes the pod;
* replicas are only raised directly; they drop only as drains end (or for pods the
  Deployment has not created yet), so no engine ever goes without its drain.

Writes to the Deployment and to the pool carry the resourceVersion this pass read (then the
one each write returned): should another writer have changed the object meanwhile, the write
fails with a 409 and the pass is retried on a fresh read, which the order above makes safe.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from interlude.api.cluster import DRAINING_LABEL
from interlude_operator.deployment import RELEASED_POD, name_of
from interlude_operator.kube import Kube, Patch, deployment_path, pod_path, pool_path, version_of
from interlude_operator.metrics import EngineReading
from interlude_operator.pods import (
    DELETION_COST,
    DRAINING_COST,
    DrainEntry,
    EnginePod,
    Engines,
    drain_finished,
)
from interlude_operator.status import draining_status

# (type, reason, message): posts a Kubernetes event about the pool.
Post = Callable[[str, str, str], None]


@dataclass
class Writes:
    """One pass's writes for one pool (mutable: it tracks the replicas and drains it wrote).

    Side effects: Kubernetes API writes through `kube`; an event through `post` for each.
    """

    kube: Kube
    namespace: str
    pool: str
    post: Post
    replicas: int  # the Deployment's spec.replicas as last read or written
    drains: list[DrainEntry]
    deployment_version: str = ""  # its resourceVersion as last read or written
    pool_version: str = ""  # the pool's

    async def patch_deployment(self, body: Patch) -> None:
        path = deployment_path(self.namespace, name_of(self.pool))
        answer = await self.kube.patch(path, body, self.deployment_version)
        self.deployment_version = version_of(answer) or self.deployment_version

    async def patch_pool(self, body: Patch, sub: str = "") -> None:
        """A write to the pool (`sub`: "status" for its status subresource)."""
        path = pool_path(self.namespace, self.pool, sub)
        answer = await self.kube.patch(path, body, self.pool_version)
        self.pool_version = version_of(answer) or self.pool_version

    async def scale(self, replicas: int, why: str, released: str = "") -> None:
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if released:
            body["metadata"] = {"annotations": {RELEASED_POD: released}}
        await self.patch_deployment(body)
        before, self.replicas = self.replicas, replicas
        reason = "ScaledUp" if replicas > before else "ScaledDown"
        self.post("Normal", reason, f"engine Deployment {before} -> {replicas} replicas: {why}")

    async def save_drains(self) -> None:
        """Write `status.draining` now: the drains must outlive this process."""
        await self.patch_pool({"status": {"draining": draining_status(self.drains)}}, "status")

    async def mark(self, pod: str, draining: bool) -> None:
        """Close (or reopen) an engine to new sessions, and make it the ReplicaSet's first
        pick on scale-down (or not)."""
        meta = {
            "labels": {DRAINING_LABEL: "true" if draining else None},
            "annotations": {DELETION_COST: DRAINING_COST if draining else None},
        }
        # Unconditional: these two keys are the operator's alone, and each pass sets them
        # again from status.draining, so a pod's other changes never make this one stale.
        await self.kube.patch(pod_path(self.namespace, pod), {"metadata": meta})

    async def start_drains(
        self,
        pods: Sequence[EnginePod],
        readings: dict[str, EngineReading],
        now: dt.datetime,
        why: str,
    ) -> None:
        if not pods:
            return
        for p in pods:
            reading = readings.get(p.name)
            self.drains.append(DrainEntry(p.name, now, reading.paused if reading else 0))
        await self.save_drains()
        for p in pods:
            await self.mark(p.name, True)
            reading = readings.get(p.name)
            left = reading.unfinished if reading is not None else None
            self.post(
                "Normal",
                "DrainStarted",
                f"engine {p.name} gets no new sessions ({'unknown' if left is None else left} "
                f"unfinished) and goes once they end: {why}",
            )

    async def cancel_drains(self, n: int, why: str) -> None:
        """Reopen the `n` most recent drains: a draining engine serves again at once."""
        for entry in sorted(self.drains, key=lambda d: d.since, reverse=True)[:n]:
            self.drains.remove(entry)
            await self.save_drains()
            await self.mark(entry.pod, False)
            self.post("Normal", "DrainCancelled", f"engine {entry.pod} serves again: {why}")

    async def sync_marks(self, engines: Engines, keep: AbstractSet[str] = frozenset()) -> None:
        """Marks follow `status.draining`: put back a lost one, take off a stale one, except
        on the engines in `keep` (draining for a role flip: roles.py owns their mark)."""
        for p in engines.draining:
            if not p.draining:
                await self.mark(p.name, True)
        for p in engines.serving:
            if p.draining and p.name not in keep:
                await self.mark(p.name, False)

    async def finish_drains(
        self,
        engines: Engines,
        readings: dict[str, EngineReading],
        now: dt.datetime,
        timeout_s: float,
    ) -> None:
        live = {p.name: p for p in engines.draining}
        for entry in list(self.drains):
            if entry.since >= now:
                continue  # started in this pass
            pod = live.get(entry.pod)
            reading = readings.get(entry.pod)
            if reading is not None:
                index = self.drains.index(entry)
                entry = DrainEntry(entry.pod, entry.since, reading.paused)
                self.drains[index] = entry
            why = drain_finished(entry, pod, reading, now, timeout_s)
            if why is not None:
                await self.release(entry, why)

    async def release(self, entry: DrainEntry, why: str) -> None:
        self.drains.remove(entry)
        await self.scale(max(0, self.replicas - 1), f"engine {entry.pod} drained: {why}", entry.pod)
        await self.save_drains()
        self.post("Normal", "DrainFinished", f"engine {entry.pod} drained: {why}")
        # The ReplicaSet takes the pod with the lowest deletion cost among equally ready
        # ones; should it have taken a starting pod instead, this one goes here.
        await self.delete(entry.pod)

    async def delete(self, pod: str) -> None:
        await self.kube.delete(pod_path(self.namespace, pod))
