"""Writers beside the operator: its conditional writes (a write made on a stale read fails with a
409 and is retried on a fresh one, never overwriting), and its replicas, of which kopf's peering
lets only the oldest act.

The API server's side of both is the emulator's (`operator_fakes.Emulator`): kmock 0.8 knows
no resourceVersion preconditions, so the emulator answers a stale one with a 409 as the API
server does; the peering objects are plain kmock objects, as kopf's CRDs make them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from operator_fakes import Emulator
from operator_kit import (
    NAMESPACE,
    PEERINGS,
    POOLS,
    Operator,
    create,
    eventually,
    free_port,
    get,
    patch,
    pool,
    status,
)

from interlude_operator.actions import Writes
from interlude_operator.kube import ApiError, Kube, conditional, version_of
from interlude_operator.peering import JITTER, seniority

DEPLOYMENTS = "apps/v1/deployments"
SCRAPE = {"source": "scrape", "intervalSeconds": 1}
NOTE = "example.com/note"  # what another writer puts on the Deployment


def test_a_patch_carries_the_version_it_was_decided_on() -> None:
    merge = {"spec": {"replicas": 2}, "metadata": {"annotations": {"a": "b"}}}
    assert conditional(merge, "41") == {
        "spec": {"replicas": 2},
        "metadata": {"annotations": {"a": "b"}, "resourceVersion": "41"},
    }
    ops = [{"op": "replace", "path": "/spec/template", "value": {}}]
    assert conditional(ops, "41") == [
        *ops,
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "41"},
    ]
    assert conditional(merge, "") is merge  # nothing read: unconditional
    assert version_of({"metadata": {"resourceVersion": "7"}}) == "7" and version_of(None) == ""
    assert ApiError(409, "changed").conflict and not ApiError(422, "invalid").conflict


def _replicas(api: Emulator) -> int:
    d = get(api, DEPLOYMENTS, "p-engine")
    assert d is not None
    return int(d["spec"]["replicas"])


@pytest.mark.asyncio
async def test_a_write_on_a_stale_read_fails_instead_of_overwriting(api: Emulator) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "p-engine", "namespace": NAMESPACE},
        "spec": {"replicas": 3},
    }
    read = await create(api, DEPLOYMENTS, deployment)
    kube = Kube()
    try:
        writes = Writes(kube, NAMESPACE, "p", lambda *_: None, 3, [], version_of(read))
        # An HPA, a person, another operator: replicas 5 lands after the read, before the write.
        api.interpose(DEPLOYMENTS, "p-engine", {"spec": {"replicas": 5}})
        with pytest.raises(ApiError) as caught:
            await writes.scale(4, "more load")
        assert caught.value.conflict and api.conflicts == ["deployments/p-engine"]
        assert _replicas(api) == 5  # not overwritten
        # On a fresh read the same write goes through, and the next one follows its version.
        writes.deployment_version = version_of(get(api, DEPLOYMENTS, "p-engine"))
        await writes.scale(4, "more load")
        await writes.scale(6, "more load")
        assert _replicas(api) == 6
    finally:
        await kube.close()


@pytest.mark.asyncio
async def test_a_conflicting_write_is_retried_not_overwritten(
    api: Emulator, operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kopf.objects")
    await operator.start()
    await create(api, POOLS, pool("race", free_port(), "", metrics=SCRAPE))
    await eventually(lambda: get(api, DEPLOYMENTS, "race-engine"), "the Deployment")
    # The pool's image changes; the operator reads the Deployment, another writer annotates
    # it, then the operator writes the new template with the annotations it read.
    api.interpose(DEPLOYMENTS, "race-engine", {"metadata": {"annotations": {NOTE: "kept"}}})
    path = f"/apis/interlude.dev/v1alpha1/namespaces/{NAMESPACE}/enginepools/race"
    await patch(api, path, {"spec": {"engine": {"image": "example.com/engine:2"}}})

    def rolled() -> dict[str, Any] | None:
        d = get(api, DEPLOYMENTS, "race-engine")
        image = d and d["spec"]["template"]["spec"]["containers"][0]["image"]
        return d if image == "example.com/engine:2" else None

    d = await eventually(rolled, "the new template, after the conflict")
    assert d["metadata"]["annotations"].get(NOTE) == "kept"  # the other writer's, still there
    # (The pool's status write of a pass under way when its spec changed may conflict too.)
    assert "deployments/race-engine" in api.conflicts
    # kopf was told to retry (a TemporaryError), not that the pool cannot be run.
    said = [r.getMessage() for r in caplog.records]
    assert any("failed temporarily: changed since read" in m for m in said), said
    assert not [m for m in said if "failed permanently" in m]


@pytest.mark.asyncio
async def test_kopf_writes_nothing_racing_a_pass_and_a_deleted_pool_is_forgotten(
    api: Emulator, operator: Operator
) -> None:
    await operator.start()
    await create(api, POOLS, pool("gone", free_port(), "", metrics=SCRAPE))
    await eventually(lambda: (NAMESPACE, "gone") in operator.memo.pools, "a pass")
    path = f"/apis/interlude.dev/v1alpha1/namespaces/{NAMESPACE}/enginepools/gone"
    await patch(api, path, {"spec": {"maxReplicas": 4}})
    await asyncio.sleep(1.5)
    # No kopf diff base (change handlers keep one, written after every spec change).
    body = get(api, POOLS, "gone")
    assert body is not None
    assert not body["metadata"].get("annotations"), body["metadata"]
    async with aiohttp.ClientSession(str(api.url)) as http, http.delete(path) as resp:
        assert resp.status < 300, await resp.text()
    await eventually(lambda: get(api, POOLS, "gone") is None, "kopf to let the pool go")
    await eventually(lambda: (NAMESPACE, "gone") not in operator.memo.pools, "it forgotten")


def test_the_oldest_replica_has_the_highest_priority() -> None:
    t = 1_767_225_600_000_000_000  # 2026-01-01, in ns
    assert seniority(t, 0) > seniority(t + 1_000_000, 0)  # a millisecond older wins
    assert seniority(t, 1) != seniority(t, 2)  # same millisecond: told apart
    assert seniority(t, JITTER - 1) > seniority(t + 1_000_000, 0)  # jitter never reorders
    assert abs(seniority(4_102_444_800 * 10**9, JITTER - 1)) < 2**53  # 2100, still exact
    with pytest.raises(ValueError, match="jitter"):
        seniority(t, JITTER)


def _decided(api: Emulator) -> str:
    """When the pool's last pass decided (its status's lastDecision.time)."""
    return str(status(api, "lead")["lastDecision"]["time"])


def _peers(api: Emulator) -> dict[str, Any]:
    return dict((get(api, PEERINGS, "interlude") or {}).get("status") or {})


@pytest.mark.asyncio
async def test_only_the_oldest_replica_acts_and_the_next_takes_over(api: Emulator) -> None:
    api.objects[PEERINGS, NAMESPACE, "interlude"] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "interlude", "namespace": NAMESPACE},
    }
    first = Operator(NAMESPACE, peering="interlude")
    second = Operator(NAMESPACE, peering="interlude")
    try:
        await first.start()
        await eventually(lambda: len(_peers(api)) == 1, "the first replica's keep-alive")
        (old,) = _peers(api)
        await second.start()  # younger: it stays paused behind the first
        await eventually(lambda: len(_peers(api)) == 2, "the second replica's keep-alive")

        await create(api, POOLS, pool("lead", free_port(), "", metrics=SCRAPE))
        await eventually(lambda: get(api, DEPLOYMENTS, "lead-engine"), "the Deployment")
        for _ in range(30):  # 3 s of one-second passes: every one the first replica's
            assert (NAMESPACE, "lead") in first.memo.pools
            assert second.memo.pools == {}, "the paused replica ran a pass"
            await asyncio.sleep(0.1)

        await first.stop()  # kopf takes its entry out on the way
        await eventually(lambda: old not in _peers(api), "the first replica's entry to go")
        await eventually(
            lambda: (NAMESPACE, "lead") in second.memo.pools, "the second replica to act", 20
        )
        before = _decided(api)
        await eventually(lambda: _decided(api) > before, "a pass of the second replica written")
    finally:
        await second.stop()
        await first.stop()
