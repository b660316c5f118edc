"""The chart's part in least privilege: every pod it renders (and every pod its EnginePool has
the operator make) passes the restricted Pod Security Standard, and the operator's replicas
coordinate through a kopf peering object the chart makes, with RBAC for that object alone.

The checker is the operator's own (`interlude_operator.podsecurity`), which its tests check
rule by rule.
"""

from __future__ import annotations

from typing import Any

from .conftest import CASES, NAMESPACE, by_kind, container, env_of, name, pod_specs


def test_operator_replicas_coordinate_through_their_peering_object(render: Any) -> None:
    from interlude_operator.__main__ import parser

    crds = by_kind(render(*CASES["everything"]), "CustomResourceDefinition")
    # kopf finds its peering resources by these names (kopf.dev/v1, as kopf's peering.yaml).
    assert crds["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    for wide, kind, plural in (
        (False, "KopfPeering", "kopfpeerings"),
        (True, "ClusterKopfPeering", "clusterkopfpeerings"),
    ):
        flags = f"operator.enabled=true,operator.clusterWide={str(wide).lower()}"
        docs = render("--set", f"{flags},operator.replicas=2")
        deployment = by_kind(docs, "Deployment")[name("operator")]
        assert deployment["spec"]["replicas"] == 2
        # A rollout's new pod starts (paused, the youngest) before the old one stops.
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {
            "maxSurge": 1,
            "maxUnavailable": 0,
        }
        operator = container(docs, "operator")
        (peering,) = by_kind(docs, kind)
        assert parser().parse_args(operator["args"]).peering == peering  # the one it makes
        assert env_of(operator)["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        role = f"{NAMESPACE}-{name('operator')}" if wide else name("operator")
        rules = by_kind(docs, "ClusterRole" if wide else "Role")[role]["rules"]
        assert [r for r in rules if r["apiGroups"] == ["kopf.dev"]] == [
            {"apiGroups": ["kopf.dev"], "resources": [plural], "verbs": ["list", "watch"]},
            {"apiGroups": ["kopf.dev"], "resources": [plural], "resourceNames": [peering],
             "verbs": ["get", "patch"]},
        ]  # fmt: skip


def test_every_pod_passes_the_restricted_pod_security_standard(render: Any) -> None:
    from interlude_operator.deployment import pod_template
    from interlude_operator.podsecurity import restricted_violations
    from interlude_operator.spec import parse

    for case in CASES:
        docs = render(*CASES[case])
        for workload, spec in pod_specs(docs):
            assert restricted_violations(spec) == [], workload
        for pool in by_kind(docs, "EnginePool").values():  # the pods the operator will make
            made = pod_template(pool["metadata"]["name"], parse(pool["spec"], env={}))["spec"]
            assert restricted_violations(made) == [], case
    # The pool hands the operator the chart's sizes for /dev/shm and a downloaded model.
    sizes = "engine.shmSizeLimit=4Gi,engine.model.hf.cacheSizeLimit=200Gi"
    (pool,) = by_kind(render(*CASES["everything"], "--set", sizes), "EnginePool").values()
    made = pod_template("p", parse(pool["spec"], env={}))["spec"]
    limits = {v["name"]: v["emptyDir"].get("sizeLimit") for v in made["volumes"]}
    assert limits == {"tmp": "8Gi", "cache": "16Gi", "shm": "4Gi", "model": "200Gi"}
