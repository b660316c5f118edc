"""Fixtures of the operator's tests: a real Prometheus (once per session), kmock as the API
server with the EnginePool CRD from the chart declared, the ReplicaSet stand-in, and kopf
running the operator in this event loop (started and stopped at will, to restart it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import kmock
import pytest
import pytest_asyncio
import yaml
from operator_fakes import Emulator, ReplicaSets
from operator_kit import CRD, NAMESPACE, PEERINGS, POOLS, Operator, free_port
from operator_prom import Prometheus

from interlude_operator import VERSION, handlers

# Imported for its kopf handlers, which register with kopf's default registry.
assert handlers.TICK_S > 0


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    try:
        server = Prometheus(tmp_path_factory.mktemp("prometheus"), free_port(), free_port())
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def declare(api: kmock.KubernetesEmulator, namespace: str) -> None:
    """The resources kopf and the operator use, the CRD object and the namespace."""
    crd = yaml.safe_load(CRD.read_text())
    names = crd["spec"]["names"]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    api.resources[POOLS] = kmock.ResourceInfo(
        kind=names["kind"],
        singular=names["singular"],
        shortnames=set(names.get("shortNames", ())),
        categories=set(names.get("categories", ())),
        subresources=set(version["subresources"]),
        verbs=verbs,
        namespaced=True,
    )
    for res, kind, namespaced in (
        ("apps/v1/deployments", "Deployment", True),
        ("v1/pods", "Pod", True),
        ("v1/events", "Event", True),
        ("v1/namespaces", "Namespace", False),
        ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False),
        # kopf's peering objects (their CRDs are in the chart's crds/).
        (PEERINGS, "KopfPeering", True),
    ):
        api.resources[res] = kmock.ResourceInfo(kind=kind, verbs=verbs, namespaced=namespaced)
    api.objects[
        "apiextensions.k8s.io/v1/customresourcedefinitions", None, crd["metadata"]["name"]
    ] = crd
    api.objects["v1/namespaces", None, namespace] = {"metadata": {"name": namespace}}


@pytest_asyncio.fixture
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Emulator]:
    async with Emulator() as emulator, kmock.Server(emulator):
        declare(emulator, NAMESPACE)
        # The operator logs in as it does outside a pod: with the kubeconfig.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": str(emulator.url)}}],
            "users": [{"name": "test", "user": {"token": "test"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
            "current-context": "kmock",
        }
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        yield emulator


@pytest_asyncio.fixture
async def operator() -> AsyncIterator[Operator]:
    """The operator, not started yet: a test starts it once its stand-ins are in place."""
    op = Operator(NAMESPACE)
    try:
        yield op
    finally:
        await op.stop()


@pytest.fixture
def port(prometheus: Prometheus) -> int:
    """The engines' port (each engine has its own loopback address)."""
    return prometheus.engine_port


@pytest_asyncio.fixture
async def replicasets(
    api: Emulator, prometheus: Prometheus, port: int
) -> AsyncIterator[Callable[[str], Awaitable[ReplicaSets]]]:
    """Starts the ReplicaSet stand-in for a Deployment."""
    started: list[tuple[ReplicaSets, asyncio.Task[None]]] = []

    async def start(deployment: str) -> ReplicaSets:
        rs = ReplicaSets(str(api.url), NAMESPACE, port)
        started.append((rs, asyncio.create_task(rs.run(deployment))))
        return rs

    try:
        yield start
    finally:
        for rs, task in started:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            rs.stop()
