"""The engine Deployment an EnginePool owns, rendered from its spec (pure).

It mirrors the chart's own engine Deployment (charts/interlude/templates/engine): the same
`interlude engine` flags, probes, writable emptyDirs (each with a size limit, so a runaway
cache evicts its own pod rather than filling the node) under a read-only root, and for `hf`
models an init container that downloads the weights first. Every pod passes the restricted
Pod Security Standard (`podsecurity`); a pool's `engine.podSpec` adds placement, no more.
The selector is the pool's label alone, which never changes (a Deployment's selector is
immutable); `podLabels` go on the pods for the chart's Service, PodDisruptionBudget and
NetworkPolicy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from interlude_operator.pods import POOL_LABEL
from interlude_operator.podsecurity import allowed_overrides
from interlude_operator.spec import PoolSpec

TEMPLATE_HASH = "interlude.dev/template-hash"  # on the Deployment: what the template was made of
RELEASED_POD = (
    "interlude.dev/released-pod"  # on the Deployment: the pod its last scale-down drained
)
GPU_RESOURCE = "nvidia.com/gpu"
# What the engine reads the gateway's shared secret from (interlude.env `gateway_token`).
GATEWAY_TOKEN_ENV = "INTERLUDE_GATEWAY_TOKEN"
DEFAULT_IMAGE = "ghcr.io/interlude-dev/interlude:0.1.0"
# emptyDir size limits, as the chart's engine has them; /dev/shm and an hf model's volume can be
# set per pool (engine.shmSizeLimit, model.hf.sizeLimit): a 70B model outgrows 64Gi.
TMP_SIZE, CACHE_SIZE, SHM_SIZE, MODEL_SIZE = "8Gi", "16Gi", "2Gi", "64Gi"
# The chart's podSecurityContext (values.yaml): the image's user 1000, never root.
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
DOWNLOAD = """import os
from huggingface_hub import snapshot_download
path = snapshot_download(os.environ["MODEL_REPO"], revision=os.environ["MODEL_REVISION"],
                         local_dir=os.environ["MODEL_DIR"])
print("model ready at", path)
"""


def name_of(pool: str) -> str:
    return f"{pool}-engine"


def selector(pool: str) -> dict[str, str]:
    return {POOL_LABEL: pool}


def model_arg(spec: PoolSpec) -> str:
    m = spec.model
    source = m["source"]
    if source == "tiny":
        return "tiny"
    if source == "image":
        return str(m["path"])
    if source == "pvc":
        path = str(m.get("path") or "").strip("/")
        return f"/models/{path}" if path else "/models"
    return f"/models/{m['hf']['repo']}"


def engine_args(spec: PoolSpec) -> list[str]:
    e = spec.engine
    args = [f"--model={model_arg(spec)}"]
    if spec.model.get("servedName") or spec.model["source"] == "hf":
        args.append(f"--served-model-name={spec.served_name}")
    args.append(f"--policy={e.get('policy', 'interlude')}")
    flags = (
        ("profile", "--profile"),
        ("blocks", "--blocks"),
        ("hostBlocks", "--host-blocks"),
        ("maxNumSeqs", "--max-num-seqs"),
        ("toolParser", "--tool-parser"),
        ("clientDeadlineSeconds", "--client-deadline"),
        ("maxTokens", "--max-tokens"),
        ("maxMessages", "--max-messages"),
    )
    args += [f"{flag}={e[key]}" for key, flag in flags if e.get(key) is not None]
    if spec.roles.enabled:
        # Every engine can take either role; the operator sets each at run time (roles.py).
        args += ["--kv-link", f"--kv-link-via={spec.roles.kv_link_via}", "--role=decode"]
    args.append(f"--port={spec.port}")
    args += [str(a) for a in e.get("extraArgs") or ()]
    return args


def _env(spec: PoolSpec) -> list[dict[str, Any]]:
    env = [dict(v) for v in spec.engine.get("env") or ()]
    have = {v.get("name") for v in env}
    # The engine's name on the tool bus is its pod's: a restarted container finds its results.
    # First, so that later values can refer to them as $(POD_NAME).
    refs = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"))
        if name not in have
    ]
    env = refs + env
    if "INTERLUDE_ENGINE_ID" not in have:
        env.append({"name": "INTERLUDE_ENGINE_ID", "value": "$(POD_NAME)"})
    # The gateway's shared secret: the engine believes the caller's tenant only beside it. An
    # explicit env entry (the chart's EnginePool passes one) wins over the reference.
    token = spec.engine.get("gatewayTokenSecretRef")
    if token and GATEWAY_TOKEN_ENV not in have:
        ref = {"name": str(token["name"]), "key": str(token.get("key") or "token")}
        env.append({"name": GATEWAY_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}})
    return env


def _container_security() -> dict[str, Any]:
    """Every container's (a fresh copy: the rendered template is JSON, never shared state)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _resources(spec: PoolSpec) -> dict[str, Any]:
    res = json.loads(json.dumps(spec.engine.get("resources") or {}))
    gpus = int(spec.engine.get("gpus", 1))
    if gpus > 0:
        res.setdefault("limits", {}).setdefault(GPU_RESOURCE, gpus)
    return dict(res)


def _model_volume(spec: PoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and init containers the model needs."""
    m = spec.model
    if m["source"] == "pvc":
        claim = {"claimName": m["pvcClaimName"], "readOnly": True}
        return [{"name": "model", "persistentVolumeClaim": claim}], []
    if m["source"] != "hf":
        return [], []
    hf = m["hf"]
    env: list[dict[str, Any]] = [
        {"name": "MODEL_REPO", "value": str(hf["repo"])},
        {"name": "MODEL_REVISION", "value": str(hf.get("revision", "main"))},
        {"name": "MODEL_DIR", "value": model_arg(spec)},
        {"name": "HF_HUB_OFFLINE", "value": "0"},
        {"name": "HF_HOME", "value": "/cache/huggingface"},
        {"name": "HOME", "value": "/cache"},
    ]
    token = hf.get("tokenSecretRef")
    if token:
        ref = {"name": token["name"], "key": token.get("key", "token")}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    init = {
        "name": "download-model",
        "image": spec.engine.get("image", DEFAULT_IMAGE),
        "command": ["python", "-c", DOWNLOAD],
        "env": env,
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "model", "mountPath": "/models"},
            {"name": "cache", "mountPath": "/cache"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    size = str(hf.get("sizeLimit") or MODEL_SIZE)
    return [{"name": "model", "emptyDir": {"sizeLimit": size}}], [init]


def pod_template(pool: str, spec: PoolSpec) -> dict[str, Any]:
    model_volumes, init = _model_volume(spec)
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": "/cache"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if model_volumes:
        mounts.append({"name": "model", "mountPath": "/models", "readOnly": True})
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container = {
        "name": "engine",
        "image": spec.engine.get("image", DEFAULT_IMAGE),
        "command": ["interlude", "engine"],
        "args": engine_args(spec),
        "env": _env(spec),
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}],
        "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": 120},
        "livenessProbe": {**probe, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 2,
        },
        "resources": _resources(spec),
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }
    shm = str(spec.engine.get("shmSizeLimit") or SHM_SIZE)
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # engines never call the Kubernetes API
        "securityContext": json.loads(json.dumps(POD_SECURITY)),
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
            {"name": "cache", "emptyDir": {"sizeLimit": CACHE_SIZE}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            *model_volumes,
        ],
    }
    if init:
        pod_spec["initContainers"] = init
    # Placement (nodeSelector, tolerations, ...) as the pool gives it; nothing else gets in.
    pod_spec.update(allowed_overrides(spec.engine.get("podSpec")))
    labels = {**spec.pod_labels, **selector(pool)}
    meta: dict[str, Any] = {"labels": labels}
    if spec.pod_annotations:
        meta["annotations"] = dict(spec.pod_annotations)
    return {"metadata": meta, "spec": pod_spec}


def template_hash(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def render(pool: str, namespace: str, uid: str, spec: PoolSpec, replicas: int) -> dict[str, Any]:
    """The whole Deployment, owned by the EnginePool (`uid`), for a create."""
    template = pod_template(pool, spec)
    gpu = int(spec.engine.get("gpus", 1)) > 0
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name_of(pool),
            "namespace": namespace,
            "labels": {**spec.pod_labels, **selector(pool)},
            "annotations": {TEMPLATE_HASH: template_hash(template)},
            "ownerReferences": [owner_reference(pool, uid)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(pool)},
            # One engine at a time; with GPUs no surge pod (a spare GPU is rare, and a surge pod
            # stuck Pending would stall the rollout).
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0 if gpu else 1, "maxUnavailable": 1},
            },
            "template": template,
        },
    }


def owner_reference(pool: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "interlude.dev/v1alpha1",
        "kind": "EnginePool",
        "name": pool,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
