"""The operator end to end: kopf runs it against kmock (an API emulator, not a cluster), and it
reads the engines through a real Prometheus that scrapes real metrics endpoints.

Windows are short (up after 2 s, down after 3 s, a pass a second) so each test takes seconds.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import aiohttp
import pytest
from operator_fakes import Emulator, ReplicaSets
from operator_kit import (
    NAMESPACE,
    POOLS,
    Operator,
    condition,
    create,
    events,
    eventually,
    free_port,
    get,
    history,
    patch,
    pool,
    replicas,
    status,
)
from operator_prom import Prometheus

from interlude.api.cluster import DRAINING_LABEL
from interlude_operator.pods import DELETION_COST

pytestmark = pytest.mark.asyncio


async def test_scale_up_under_load(
    api: Emulator, prometheus: Prometheus, operator: Operator, replicasets, port: int
) -> None:
    rs: ReplicaSets = await replicasets("busy-engine")
    rs.load = {"kv": 0.5}
    await operator.start()
    created = await create(api, POOLS, pool("busy", port, prometheus.url))

    dep = await eventually(lambda: get(api, "apps/v1/deployments", "busy-engine"), "the Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    await eventually(
        lambda: status(api, "busy").get("metrics", {}).get("kvUsage") == 0.5,
        "KV usage read through Prometheus",
    )
    # Under its target for longer than the scale-up window: nothing moves.
    await asyncio.sleep(3)
    assert replicas(api, "busy") == 1
    assert not events(api, "ScaledUp")

    rs.load = {"kv": 0.95}
    for engine in rs.engines.values():
        engine.set(kv=0.95)
    await eventually(lambda: replicas(api, "busy") == 3, "a scale-up to maxReplicas", 30)
    await asyncio.sleep(2.5)
    counts = [d["spec"]["replicas"] for d in history(api, "apps/v1/deployments", "busy-engine")]
    assert counts == sorted(counts) and counts[-1] == 3  # up only, never past maxReplicas
    ups = events(api, "ScaledUp")
    assert len(ups) == 2, ups
    assert all("kvUsage" in e["message"] for e in ups)
    assert all(e["involvedObject"]["name"] == "busy" for e in ups)
    st = status(api, "busy")
    assert st["desiredReplicas"] == 3 and st["currentReplicas"] == 3
    assert st["metrics"]["kvUsage"] == pytest.approx(0.95)
    assert st["selector"] == "interlude.dev/enginepool=busy"
    assert condition(api, "busy", "MetricsAvailable")["status"] == "True"
    assert get(api, POOLS, "busy")["spec"]["replicas"] == 3  # what /scale shows


async def _drain_started(api: Emulator, rs: ReplicaSets, name: str) -> tuple[str, str, float]:
    """A pool of 2 under low load whose engines hold paused sessions; returns the engine it
    drains, the one it keeps, and how long after the pool's creation the drain began."""
    begun = time.monotonic()
    await eventually(lambda: len(rs.engines) == 2, "two engines")
    first, second = list(rs.engines)
    rs.engines[first].set(sessions={"awaiting_client": 3, "generating": 1})
    rs.engines[second].set(sessions={"awaiting_tool": 1})
    draining = await eventually(lambda: status(api, name).get("draining"), "a drain", 30)
    after = time.monotonic() - begun
    # kopf posts events from a queue, which an operator stopping drops: wait for this one.
    await eventually(lambda: events(api, "DrainStarted"), "the DrainStarted event")
    return draining[0]["pod"], first, after


async def test_scale_down_drains_before_removing(
    api: Emulator, prometheus: Prometheus, operator: Operator, replicasets, port: int
) -> None:
    rs: ReplicaSets = await replicasets("idle-engine")
    rs.load = {"kv": 0.1}
    await operator.start()
    await create(api, POOLS, pool("idle", port, prometheus.url, replicas=2))
    drained, kept, after = await _drain_started(api, rs, "idle")

    assert drained != kept  # the engine with the fewest unfinished sessions
    assert after >= 3.0  # not before the scale-down window
    # Written into the status first (it must outlive the operator), then onto the pod.
    pod = await eventually(
        lambda: (
            (p := get(api, "v1/pods", drained)) and DRAINING_LABEL in p["metadata"]["labels"] and p
        ),
        "the draining mark on the pod",
    )
    assert pod["metadata"]["labels"][DRAINING_LABEL] == "true"
    assert int(pod["metadata"]["annotations"][DELETION_COST]) < 0
    # Its paused session holds the engine: the Deployment keeps it.
    await asyncio.sleep(2.5)
    assert replicas(api, "idle") == 2 and drained in rs.engines
    assert status(api, "idle")["draining"][0]["pausedSessions"] == 1
    assert status(api, "idle")["currentReplicas"] == 1  # serving engines
    assert condition(api, "idle", "Draining")["status"] == "True"

    rs.engines[drained].set(sessions={"awaiting_tool": 0, "finished": 1})
    await eventually(lambda: replicas(api, "idle") == 1, "the replicas to drop", 15)
    await eventually(lambda: drained in rs.deleted, "the drained pod to go")
    assert kept in rs.engines and len(rs.engines) == 1
    await eventually(lambda: status(api, "idle").get("draining") == [], "the drain to clear")
    [started] = events(api, "DrainStarted")
    [finished] = await eventually(lambda: events(api, "DrainFinished"), "the DrainFinished event")
    assert drained in started["message"] and "sessions are finished" in finished["message"]
    assert condition(api, "idle", "Draining")["status"] == "False"


async def test_restarted_operator_finishes_the_drain(
    api: Emulator, prometheus: Prometheus, operator: Operator, replicasets, port: int
) -> None:
    rs: ReplicaSets = await replicasets("calm-engine")
    rs.load = {"kv": 0.1}
    await operator.start()
    await create(api, POOLS, pool("calm", port, prometheus.url, replicas=2))
    drained, kept, _ = await _drain_started(api, rs, "calm")

    await operator.stop()
    assert [d["pod"] for d in status(api, "calm")["draining"]] == [drained]

    await operator.start()  # a new process: no memory of the drain but the pool's status
    await asyncio.sleep(2.5)
    # Its session still open, the engine stays, draining: not released, not reopened.
    assert replicas(api, "calm") == 2 and drained in rs.engines
    assert [d["pod"] for d in status(api, "calm")["draining"]] == [drained]
    assert get(api, "v1/pods", drained)["metadata"]["labels"][DRAINING_LABEL] == "true"
    rs.engines[drained].set(sessions={})
    await eventually(lambda: replicas(api, "calm") == 1, "the restarted operator's release", 15)
    await eventually(lambda: drained in rs.deleted, "the drained pod to go")
    assert list(rs.engines) == [kept]
    await eventually(lambda: events(api, "DrainFinished"), "the DrainFinished event")
    assert len(events(api, "DrainStarted")) == 1  # it went on with the drain, began no other
    assert not events(api, "DrainCancelled")


async def test_external_scaler_drives_through_spec_replicas(
    api: Emulator, prometheus: Prometheus, operator: Operator, replicasets, port: int
) -> None:
    rs: ReplicaSets = await replicasets("ext-engine")
    rs.load = {"kv": 0.99}
    await operator.start()
    await create(api, POOLS, pool("ext", port, prometheus.url, replicas=2, scaler="external"))
    await eventually(lambda: len(rs.engines) == 2, "two engines")
    await eventually(lambda: status(api, "ext").get("metrics", {}).get("kvUsage"), "metrics")
    # Far over its target for longer than the window: the operator leaves the count alone.
    await asyncio.sleep(3)
    assert replicas(api, "ext") == 2
    assert {p["spec"]["replicas"] for p in history(api, POOLS, "ext")} == {2}
    assert condition(api, "ext", "ScalingActive")["reason"] == "ExternalScaler"

    # KEDA or an HPA writes spec.replicas through /scale; a scale-down still drains first.
    path = f"/apis/interlude.dev/v1alpha1/namespaces/{NAMESPACE}/enginepools/ext"
    await patch(api, path, {"spec": {"replicas": 1}})
    await eventually(lambda: events(api, "DrainStarted"), "a drain")
    await eventually(lambda: replicas(api, "ext") == 1, "the drained engine to go", 15)
    await eventually(lambda: events(api, "DrainFinished"), "the DrainFinished event")


async def test_a_pool_it_cannot_run_is_refused_once_then_run_when_fixed(
    api: Emulator, operator: Operator, replicasets, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INTERLUDE_PROMETHEUS_URL", raising=False)
    rs: ReplicaSets = await replicasets("bad-engine")
    await operator.start()
    body = pool("bad", port, "")
    body["spec"]["metrics"] = {"source": "prometheus", "intervalSeconds": 1}  # which one?
    await create(api, POOLS, body)
    ready = await eventually(
        lambda: (
            condition(api, "bad", "Ready").get("reason") == "InvalidSpec"
            and condition(api, "bad", "Ready")
        ),
        "Ready=False InvalidSpec",
    )
    assert ready["status"] == "False" and "INTERLUDE_PROMETHEUS_URL" in ready["message"]
    await asyncio.sleep(2)  # two more ticks: said once, not every tick
    assert len(events(api, "InvalidSpec")) == 1
    assert get(api, "apps/v1/deployments", "bad-engine") is None

    path = f"/apis/interlude.dev/v1alpha1/namespaces/{NAMESPACE}/enginepools/bad"
    await patch(api, path, {"spec": {"metrics": {"source": "scrape"}}})
    await eventually(lambda: len(rs.engines) == 1, "the engine, once the spec is fixed")
    # Scraping the engine itself now, without Prometheus.
    await eventually(
        lambda: condition(api, "bad", "MetricsAvailable").get("status") == "True",
        "metrics scraped from the engine",
    )
    assert "scrape" in condition(api, "bad", "MetricsAvailable")["message"]


async def test_the_command_runs_the_operator_with_its_liveness_probe(
    api: Emulator, replicasets, port: int, tmp_path
) -> None:
    await replicasets("cli-engine")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    live = free_port()
    # Cluster-wide, as with the chart's clusterWide=true (and kmock lists no namespaces).
    args = ["--all-namespaces", "--log-level=INFO", f"--liveness=http://127.0.0.1:{live}/healthz"]
    log = (tmp_path / "operator.log").open("w")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "interlude_operator", *args, env=env, stdout=log, stderr=log
    )
    try:
        await create(api, POOLS, pool("cli", port, "", metrics={"source": "scrape"}))
        await eventually(lambda: replicas(api, "cli") == 1, "the Deployment", 30)
        async with aiohttp.ClientSession() as http:
            resp = await http.get(f"http://127.0.0.1:{live}/healthz")
            assert resp.status == 200
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 20) == 0  # a clean stop on SIGTERM
        log.close()
