"""Helpers of the operator's end-to-end tests: the emulated API's objects, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest

from interlude.stack.valkey import free_port as free_port  # the stack's, for these tests
from interlude_operator import GROUP, PLURAL, VERSION
from interlude_operator.peering import JITTER, seniority

POOLS = f"{GROUP}/{VERSION}/{PLURAL}"
PEERINGS = "kopf.dev/v1/kopfpeerings"
CRD = Path(__file__).parents[2] / "charts/interlude/crds/enginepools.interlude.dev.yaml"
NAMESPACE = "llm"


def pool(name: str, port: int, prometheus_url: str, **spec: Any) -> dict[str, Any]:
    """An EnginePool with short windows: a pass a second, up after 2 s, down after 3 s."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "EnginePool",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 3,
            "replicas": 1,
            "podLabels": {"app.kubernetes.io/component": "engine"},
            "model": {"source": "tiny"},
            "engine": {"port": port, "gpus": 0},
            "targets": {"kvUsage": 0.85, "contendedWaste": 0.1, "queueDepth": 8},
            "scaleUp": {"stabilizationWindowSeconds": 2},
            "scaleDown": {"stabilizationWindowSeconds": 3},
            "drainTimeoutSeconds": 60,
            "metrics": {
                "source": "prometheus",
                "prometheusUrl": prometheus_url,
                "intervalSeconds": 1,
            },
            **spec,
        },
    }


def get(api: kmock.KubernetesEmulator, resource: str, name: str) -> dict[str, Any] | None:
    """The object's current state, or None if it is not there (never was, or deleted)."""
    try:
        obj = api.objects[resource, NAMESPACE, name]
    except KeyError:
        return None
    return None if obj.deleted else json.loads(json.dumps(obj.raw))


def history(api: kmock.KubernetesEmulator, resource: str, name: str) -> list[dict[str, Any]]:
    """Every state the object went through, oldest first."""
    versions = api.objects[resource, NAMESPACE, name].history
    return [json.loads(json.dumps(dict(v.raw))) for v in versions if v is not None]


def events(api: kmock.KubernetesEmulator, reason: str = "") -> list[dict[str, Any]]:
    """The Kubernetes events posted in the namespace (kopf.event lands here)."""
    res = kmock.resource("v1/events")
    out = []
    for (r, ns, _), obj in api.objects.items():
        if r == res and ns == NAMESPACE and not obj.deleted:
            event = json.loads(json.dumps(obj.raw))
            if not reason or event.get("reason") == reason:
                out.append(event)
    return out


def replicas(api: kmock.KubernetesEmulator, pool_name: str) -> int | None:
    dep = get(api, "apps/v1/deployments", f"{pool_name}-engine")
    return None if dep is None else int(dep["spec"]["replicas"])


def status(api: kmock.KubernetesEmulator, pool_name: str) -> dict[str, Any]:
    obj = get(api, POOLS, pool_name) or {}
    return dict(obj.get("status") or {})


def condition(api: kmock.KubernetesEmulator, pool_name: str, kind: str) -> dict[str, Any]:
    for c in status(api, pool_name).get("conditions") or ():
        if c["type"] == kind:
            return dict(c)
    return {}


async def eventually(
    check: Callable[[], Any], what: str, timeout_s: float = 20.0, every_s: float = 0.1
) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


async def create(
    api: kmock.KubernetesEmulator, resource: str, body: dict[str, Any]
) -> dict[str, Any]:
    group_version, plural = resource.rsplit("/", 1)
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    ns = body["metadata"]["namespace"]
    async with (
        aiohttp.ClientSession(str(api.url)) as http,
        http.post(f"{prefix}/namespaces/{ns}/{plural}", json=body) as resp,
    ):
        assert resp.status < 300, await resp.text()
        return dict(await resp.json())


async def patch(api: kmock.KubernetesEmulator, path: str, body: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with (
        aiohttp.ClientSession(str(api.url)) as http,
        http.patch(path, data=json.dumps(body), headers=headers) as resp,
    ):
        assert resp.status < 300, await resp.text()


class _Everything(Collection[asyncio.Task[Any]]):
    """Every task: kopf leaves them all alone when it stops (see `Operator`)."""

    def __contains__(self, task: object) -> bool:
        return True

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(())

    def __len__(self) -> int:
        return 0


class Operator:
    """kopf running the operator in the test's event loop; `stop` then `start` restarts it.

    `kopf.operator` would, when it stops, cancel every task created while it ran (after a
    5 s grace): the emulator's connection handlers, the ReplicaSet stand-ins, even the
    fixture finalizer that stops it. Run through `spawn_tasks` and `run_tasks` instead, it
    stops only its own.

    With `peering` it runs as a replica of the chart's does (`python -m interlude_operator
    --peering NAME`): through that KopfPeering, its start time as its priority (kopf names
    each start apart there). `memo` is what its handlers keep (its pools, once it has acted).
    """

    def __init__(self, namespace: str, peering: str = "") -> None:
        self.namespace = namespace
        self.peering = peering
        self.task: asyncio.Task[None] | None = None
        self.stop_flag = asyncio.Event()
        self.memo = kopf.Memo()

    async def start(self) -> None:
        self.stop_flag = asyncio.Event()
        self.memo = kopf.Memo()
        ready = asyncio.Event()
        settings = kopf.OperatorSettings()
        # kmock 0.8 cannot parse GET /api/v1/namespaces (the cluster-wide namespace list), so
        # kopf's namespace and CRD scanning is off here: it watches the one namespace given.
        settings.scanning.disabled = True
        tasks = await kopf.spawn_tasks(
            settings=settings,
            standalone=not self.peering,
            peering_name=self.peering or None,
            priority=seniority(time.time_ns(), random.randrange(JITTER)),
            namespaces=[self.namespace],
            stop_flag=self.stop_flag,
            ready_flag=ready,
            memo=self.memo,
        )
        self.task = asyncio.create_task(kopf.run_tasks(tasks, ignored=_Everything()))
        await asyncio.wait_for(ready.wait(), 20)

    async def stop(self) -> None:
        if self.task is None:
            return
        self.stop_flag.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 20)
        self.task = None
