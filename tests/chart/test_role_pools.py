"""Role pools in the chart (docs/disaggregation.md): a Deployment per prefill or decode pool in
place of the single engine Deployment, each selecting only its own pods, all behind the one
engine Service; refused where they cannot work."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import CHART, DISAGGREGATED, PROD, by_kind, name, run_helm


def args_of(deployment: dict[str, Any]) -> list[str]:
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def test_one_prefill_and_two_decode_pools(render: Any, helm: str) -> None:
    docs = render("-f", str(PROD), "-f", str(DISAGGREGATED))
    deployments = by_kind(docs, "Deployment")
    assert name("engine") not in deployments  # the pools replace the single Deployment
    pools = {p: deployments[f"{name('engine')}-{p}"] for p in ("prefill", "decode-a", "decode-b")}
    assert [d["spec"]["replicas"] for d in pools.values()] == [1, 2, 2]
    for pool, d in pools.items():
        role = "prefill" if pool == "prefill" else "decode"
        assert {"--kv-link", "--kv-link-via=nixl", f"--role={role}"} <= set(args_of(d)), pool
        selector = d["spec"]["selector"]["matchLabels"]
        # Its own pods only (no two Deployments fight over a pod), which carry the label.
        assert selector["interlude.dev/engine-pool"] == pool
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    # The engine Service (the gateway's EndpointSlices) and the PDB take every pool's pods.
    service = by_kind(docs, "Service")[name("engine")]
    for d in pools.values():
        assert (
            service["spec"]["selector"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        )
    out = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(PROD), "-f", str(DISAGGREGATED))
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_single_engine_deployment_keeps_its_selector(render: Any) -> None:
    """Installs without pools upgrade in place: a Deployment's selector cannot change."""
    d = by_kind(render(), "Deployment")[name("engine")]
    assert "interlude.dev/engine-pool" not in d["spec"]["selector"]["matchLabels"]
    assert not any(a.startswith(("--kv-link", "--role")) for a in args_of(d))
    linked = by_kind(render("--set", "engine.kvLink.enabled=true,engine.role=decode"), "Deployment")
    assert {"--kv-link", "--kv-link-via=nixl", "--role=decode"} <= set(
        args_of(linked[name("engine")])
    )


POOL = "engine.rolePools[0].name=p,engine.rolePools[0].role=prefill,engine.rolePools[0].replicas=1"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (POOL, r"kvLink.enabled=true and engine.kvLink.via=nixl"),
        (POOL + ",engine.kvLink.enabled=true,engine.kvLink.via=host", r"share no memory"),
        ("engine.role=prefill", r"role prefill needs engine.kvLink.enabled=true"),
        (
            POOL + ",engine.kvLink.enabled=true,operator.enabled=true,"
            "operator.enginePool.create=true",
            r"EnginePool owns a single engine Deployment",
        ),
        (
            "engine.rolePools[0].name=Bad_Name,engine.rolePools[0].role=decode,"
            "engine.rolePools[0].replicas=1",
            r"name.*pattern|match",
        ),
        ("engine.role=both", r"role.*(enum|one of)"),
    ],
)
def test_pools_that_cannot_work_are_refused(helm: str, setting: str, message: str) -> None:
    out = run_helm(helm, "template", "rel", str(CHART), "--set", setting)
    assert out.returncode != 0
    assert re.search(message, out.stderr, re.DOTALL), out.stderr


def test_engines_with_the_kv_link_may_reach_each_other_past_the_network_policy(
    render: Any,
) -> None:
    def engine_ingress(*args: str) -> list[dict[str, Any]]:
        docs = render("--set", "networkPolicy.enabled=true", *args)
        return list(by_kind(docs, "NetworkPolicy")[name("engine")]["spec"]["ingress"])

    engines = {
        "app.kubernetes.io/name": "interlude",
        "app.kubernetes.io/instance": "rel",
        "app.kubernetes.io/component": "engine",
    }
    peers = {"podSelector": {"matchLabels": engines}}
    assert not any(r.get("from") == [peers] for r in engine_ingress())
    linked = engine_ingress("--set", "engine.kvLink.enabled=true")
    assert {"from": [peers]} in linked  # every port: NIXL's own besides /v1/prefill
    # An operator-run pool with roles: its engines hand KV to each other too.
    pooled = "operator.enabled=true,operator.enginePool.create=true"
    with_roles = engine_ingress("--set", f"{pooled},operator.enginePool.roles.enabled=true")
    assert {"from": [peers]} in with_roles
    assert {"from": [peers]} not in engine_ingress("--set", pooled)


def test_an_operator_pool_with_roles_renders_them_within_the_crd(render: Any) -> None:
    import jsonschema
    import yaml

    settings = (
        "operator.enabled=true,operator.enginePool.create=true,"
        "operator.enginePool.roles.enabled=true,operator.enginePool.roles.prefill=2,"
        "operator.enginePool.roles.flips.windowSeconds=30"
    )
    pool = by_kind(render("--set", settings), "EnginePool")[name("engine")]
    assert pool["spec"]["roles"] == {
        "enabled": True,
        "prefill": 2,
        "kvLinkVia": "nixl",
        "flips": {"enabled": True, "windowSeconds": 30, "idleBelow": 0.1, "minPerRole": 1},
    }
    crd = yaml.safe_load((CHART / "crds" / "enginepools.interlude.dev.yaml").read_text())
    jsonschema.validate(pool, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    plain = render("--set", "operator.enabled=true,operator.enginePool.create=true")
    assert "roles" not in by_kind(plain, "EnginePool")[name("engine")]["spec"]
