"""The engine pods the operator makes: the restricted Pod Security Standard, checked by the
operator's own checker (itself checked rule by rule here), and the allow-list a pool's
`engine.podSpec` goes through, down to the refusal a running operator posts."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from operator_fakes import Emulator
from operator_kit import (
    CRD,
    POOLS,
    Operator,
    condition,
    create,
    events,
    eventually,
    free_port,
    get,
    pool,
)

from interlude_operator import deployment as dep
from interlude_operator.podsecurity import allowed_overrides, restricted_violations
from interlude_operator.spec import parse

EXAMPLE = CRD.parents[1] / "examples/enginepool.yaml"
PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
MODELS: dict[str, dict[str, Any]] = {
    "tiny": {"source": "tiny"},
    "image": {"source": "image", "path": "/opt/model"},
    "pvc": {"source": "pvc", "pvcClaimName": "weights", "path": "llama"},
    "hf": {"source": "hf", "hf": {"repo": "Qwen/Qwen3-8B", "sizeLimit": "200Gi"}},
}


def _pod(model: dict[str, Any], **engine: Any) -> dict[str, Any]:
    spec = parse({"minReplicas": 1, "maxReplicas": 2, "model": model, "engine": engine}, env={})
    return dict(dep.pod_template("p", spec)["spec"])


@pytest.mark.parametrize("source", MODELS)
def test_the_operator_made_pod_passes_the_restricted_standard(source: str) -> None:
    pod = _pod(MODELS[source], podSpec=PLACEMENT, shmSizeLimit="4Gi")
    assert restricted_violations(pod) == []
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    containers = pod["containers"] + pod.get("initContainers", [])
    assert len(containers) == (2 if source == "hf" else 1)
    for c in containers:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    empty = {v["name"]: v["emptyDir"] for v in pod["volumes"] if "emptyDir" in v}
    assert all(e.get("sizeLimit") for e in empty.values()), empty
    assert empty["shm"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    if source == "hf":
        assert empty["model"]["sizeLimit"] == "200Gi"
    # The placement the pool asked for is there, and no other field came with it.
    assert {k: pod[k] for k in PLACEMENT} == PLACEMENT
    # The chart's example, an hf model on GPUs, passes too, with the default sizes.
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    made = dep.pod_template("llama", parse(example, env={}))["spec"]
    assert restricted_violations(made) == []
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in made["volumes"]} == {
        "tmp": "8Gi", "cache": "16Gi", "shm": "2Gi", "model": "64Gi"
    }  # fmt: skip


def _broken(change: str) -> dict[str, Any]:
    """The operator's pod with one rule broken."""
    pod = copy.deepcopy(_pod(MODELS["hf"]))
    engine, init = pod["containers"][0], pod["initContainers"][0]
    if change == "hostNetwork":
        pod["hostNetwork"] = True
    elif change == "hostPID":
        pod["hostPID"] = True
    elif change == "hostIPC":
        pod["hostIPC"] = True
    elif change == "hostPath":
        pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    elif change == "privileged":
        engine["securityContext"]["privileged"] = True
    elif change == "escalation":
        del init["securityContext"]["allowPrivilegeEscalation"]
    elif change == "capabilities":
        engine["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    elif change == "drop":
        engine["securityContext"]["capabilities"]["drop"] = ["NET_RAW"]
    elif change == "root":
        init["securityContext"]["runAsNonRoot"] = False
    elif change == "user0":
        pod["securityContext"]["runAsUser"] = 0
    elif change == "unconfined":
        engine["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    elif change == "noSeccomp":
        del pod["securityContext"]["seccompProfile"]
    elif change == "hostPort":
        engine["ports"][0]["hostPort"] = 8100
    elif change == "procMount":
        engine["securityContext"]["procMount"] = "Unmasked"
    elif change == "sysctl":
        pod["securityContext"]["sysctls"] = [{"name": "kernel.msgmax", "value": "65536"}]
    elif change == "selinux":
        pod["securityContext"]["seLinuxOptions"] = {"user": "system_u"}
    elif change == "apparmor":
        engine["securityContext"]["appArmorProfile"] = {"type": "Unconfined"}
    elif change == "hostProcess":
        pod["securityContext"]["windowsOptions"] = {"hostProcess": True}
    return pod


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("hostNetwork", "hostNetwork is true"),
        ("hostPID", "hostPID is true"),
        ("hostIPC", "hostIPC is true"),
        ("hostPath", "volume 'root' is of type hostPath"),
        ("privileged", "container 'engine' is privileged"),
        ("escalation", "container 'download-model' does not set allowPrivilegeEscalation"),
        ("capabilities", "container 'engine' adds capabilities SYS_ADMIN"),
        ("drop", "container 'engine' does not drop ALL"),
        ("root", "container 'download-model' may run as root"),
        ("user0", "the pod runs as user 0"),
        ("unconfined", "container 'engine' has seccomp profile Unconfined"),
        ("noSeccomp", "container 'engine' has no RuntimeDefault or Localhost seccomp"),
        ("hostPort", "container 'engine' uses hostPort 8100"),
        ("procMount", "container 'engine' has procMount Unmasked"),
        ("sysctl", "sysctl kernel.msgmax is not a safe one"),
        ("selinux", "the pod sets SELinux options"),
        ("apparmor", "container 'engine' has AppArmor profile Unconfined"),
        ("hostProcess", "the pod is a Windows host process"),
    ],
)
def test_the_checker_catches_each_restricted_rule(change: str, said: str) -> None:
    violations = restricted_violations(_broken(change))
    assert any(v.startswith(said) for v in violations), violations


def test_the_checker_allows_what_restricted_allows() -> None:
    pod = _broken("")
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    pod["securityContext"]["sysctls"] = [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]
    pod["securityContext"]["seLinuxOptions"] = {"type": "container_t", "level": "s0:c1"}
    pod["volumes"].append({"name": "conf", "configMap": {"name": "c"}})
    # runAsNonRoot on every container and no pod-level one is as good as the pod's.
    del pod["securityContext"]["runAsNonRoot"]
    assert restricted_violations(pod) == []


def test_pod_spec_overrides_go_through_the_allow_list() -> None:
    allowed = {
        **PLACEMENT,
        "affinity": {"nodeAffinity": {}},
        "topologySpreadConstraints": [],
        "priorityClassName": "inference",
        "imagePullSecrets": [{"name": "registry"}],
        "terminationGracePeriodSeconds": 120,
    }
    assert allowed_overrides(allowed) == allowed
    refused: dict[str, Any] = {
        "hostNetwork": True,
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
        "securityContext": {"runAsUser": 0},
        "serviceAccountName": "interlude-operator",
        "automountServiceAccountToken": True,
        "containers": [{"name": "engine", "securityContext": {"privileged": True}}],
        "hostPID": True,
        "runtimeClassName": "nvidia",
    }
    base = {"minReplicas": 1, "maxReplicas": 2, "model": {"source": "tiny"}}
    for key, value in refused.items():
        with pytest.raises(ValueError, match=rf"^engine\.podSpec\.{key} is not allowed"):
            parse({**base, "engine": {"podSpec": {**PLACEMENT, key: value}}}, env={})
    wrong: list[tuple[dict[str, Any], str]] = [
        ({"nodeSelector": ["gpu"]}, r"engine\.podSpec\.nodeSelector must be a mapping"),
        ({"terminationGracePeriodSeconds": True}, r"terminationGracePeriodSeconds must be an"),
        ({"terminationGracePeriodSeconds": -1}, r"terminationGracePeriodSeconds must be >= 0"),
    ]
    for bad, message in wrong:
        with pytest.raises(ValueError, match=message):
            allowed_overrides(bad)
    with pytest.raises(ValueError, match=r"engine\.podSpec must be a mapping"):
        parse({**base, "engine": {"podSpec": ["hostNetwork"]}}, env={})


def _refused(api: Emulator, name: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        ready = condition(api, name, "Ready")
        return ready if ready.get("reason") == "InvalidSpec" else None

    return check


@pytest.mark.asyncio
async def test_a_pool_asking_for_the_host_is_refused_and_a_placed_one_runs(
    api: Emulator, operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kopf.objects")
    port = free_port()
    await operator.start()
    scrape = {"source": "scrape", "intervalSeconds": 1}
    asks: dict[str, tuple[dict[str, Any], str]] = {
        "hostnet": ({"hostNetwork": True}, "engine.podSpec.hostNetwork"),
        "hostpath": (
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "engine.podSpec.volumes",
        ),
    }
    for name, (pod_spec, _) in asks.items():
        body = pool(name, port, "", metrics=scrape)
        body["spec"]["engine"]["podSpec"] = {**PLACEMENT, **pod_spec}
        await create(api, POOLS, body)
    placed = pool("placed", port, "", metrics=scrape)
    placed["spec"]["engine"]["podSpec"] = PLACEMENT
    await create(api, POOLS, placed)

    made = await eventually(
        lambda: get(api, "apps/v1/deployments", "placed-engine"), "the placed pool's Deployment"
    )
    template = made["spec"]["template"]["spec"]
    assert {k: template[k] for k in PLACEMENT} == PLACEMENT
    assert restricted_violations(template) == []
    for name, (_, field) in asks.items():
        ready = await eventually(_refused(api, name), f"{name} refused")
        # The pool's status says why, naming the field; no Deployment, no pod.
        assert ready["status"] == "False" and field in ready["message"], ready
        assert get(api, "apps/v1/deployments", f"{name}-engine") is None
        # The event is posted after the status: on a busy machine, a moment later.
        refusal = await eventually(
            lambda n=name: [
                e for e in events(api, "InvalidSpec") if e["involvedObject"]["name"] == n
            ],
            f"{name}'s InvalidSpec event",
        )
        assert len(refusal) == 1 and field in refusal[0]["message"]
        # And kopf got a permanent error, not one to retry.
        failed = [r.getMessage() for r in caplog.records if "failed permanently" in r.getMessage()]
        assert any(field in m for m in failed), failed
