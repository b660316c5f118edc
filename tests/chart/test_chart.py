"""The Helm chart as Kubernetes will see it: lint, valid manifests, stable selectors, values.

Every render in `CASES` passes `kubernetes-validate --strict` for Kubernetes 1.30 and for the
newest version the package knows; values.schema.json refuses what values.yaml does not allow;
every value is documented; the example EnginePool fits its CRD.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from .conftest import (
    CASES,
    CHART,
    MINIMAL,
    MONITORING,
    PROD,
    RELEASE,
    TEMPO,
    Manifest,
    by_kind,
    run_helm,
)

IMMUTABLE = {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
POOL_LABEL = "interlude.dev/engine-pool"
# Kinds that no Kubernetes release defines; each is checked another way (see the tests below).
CUSTOM_KINDS = {
    "ServiceMonitor", "PodMonitor", "ScaledObject", "EnginePool", "KopfPeering",
    "ClusterKopfPeering", "InferencePool", "HTTPRoute",
}  # fmt: skip
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


# `helm lint` has no --api-versions: the parts that need a CRD API (monitors, KEDA) stay off.
TRACING = (*TEMPO, "--set", "tracing.collector.enabled=true,operator.enabled=true")


@pytest.mark.parametrize(
    "args",
    [(), ("-f", str(PROD)), ("-f", str(MINIMAL)), TEMPO, TRACING],
    ids=["default", "production", "minimal", "tempo", "tempo+collector+operator"],
)
def test_lint_strict(helm: str, args: tuple[str, ...]) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), *args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("case", CASES)
def test_manifests_are_valid_kubernetes(render: Any, case: str) -> None:
    docs = render(*CASES[case])
    assert len(docs) >= 10, "the chart rendered almost nothing"
    failures, unchecked = [], set()
    for version in VERSIONS:
        for d in docs:
            where = f"{version} {d['kind']}/{d['metadata']['name']}"
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                unchecked.add(d["kind"])
    assert not failures, "\n".join(failures)
    assert unchecked <= CUSTOM_KINDS, f"no schema for {unchecked - CUSTOM_KINDS}"


@pytest.mark.parametrize("case", CASES)
def test_selectors_use_only_immutable_labels(render: Any, case: str) -> None:
    selectors: list[tuple[str, dict[str, str], dict[str, str] | None]] = []
    for d in render(*CASES[case]):
        kind, spec = d["kind"], d.get("spec", {})
        where = f"{kind}/{d['metadata']['name']}"
        if kind in ("Deployment", "StatefulSet"):
            pod_labels = spec["template"]["metadata"]["labels"]
            selectors.append((where, spec["selector"]["matchLabels"], pod_labels))
        elif kind == "Service":
            selectors.append((where, spec["selector"], None))
        elif kind in ("PodDisruptionBudget", "ServiceMonitor", "PodMonitor"):
            selectors.append((where, spec["selector"]["matchLabels"], None))
        elif kind == "NetworkPolicy":
            selectors.append((where, spec["podSelector"]["matchLabels"], None))
    assert selectors
    for where, selector, pod_labels in selectors:
        # A role pool's Deployment also selects its pool (fixed for the pool's life: a pool of
        # another name is another Deployment).
        own = {POOL_LABEL} if where.startswith("Deployment/") else set()
        assert IMMUTABLE <= set(selector) <= IMMUTABLE | own, (
            f"{where} selects on {sorted(selector)}"
        )
        if pod_labels is not None:  # a workload's selector must match its own pods
            assert selector.items() <= pod_labels.items(), where


def test_monitors_only_with_the_prometheus_operator(render: Any) -> None:
    kinds = lambda docs: sorted(d["kind"] for d in docs if d["kind"] in CUSTOM_KINDS)  # noqa: E731
    assert kinds(render()) == []
    assert kinds(render(*MONITORING)) == ["PodMonitor", "PodMonitor", "PodMonitor"]
    off = render(*MONITORING, "--set", "monitoring.prometheusOperator=false")
    assert kinds(off) == []


def _upstream_errors(validators: Path, docs: list[Manifest]) -> dict[str, list[str] | None]:
    """kind/name -> errors from the upstream projects' validators (None: no validator)."""
    out = subprocess.run(
        ["node", str(Path(__file__).with_name("crd_validate.mjs")), str(validators)],
        input=json.dumps(docs), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return {f"{r['kind']}/{r['name']}": r["errors"] for r in json.loads(out.stdout)}


@pytest.mark.parametrize(
    "case", ["default+monitoring", "production-gpu+monitoring", "everything", "inference-pool"]
)
def test_custom_resources_fit_their_upstream_api_types(
    render: Any, crd_validators: Path, case: str
) -> None:
    """ServiceMonitor, PodMonitor, ScaledObject and HTTPRoute against validators generated from
    KEDA's, the Prometheus Operator's and Gateway API's Go API types: their CRD YAMLs are on no
    registry we can reach."""
    # CRDs in crds/, and the InferencePool (a transcribed schema), checked apart.
    ours = {"EnginePool", "KopfPeering", "ClusterKopfPeering", "InferencePool"}
    custom = [d for d in render(*CASES[case]) if d["kind"] in CUSTOM_KINDS - ours]
    assert custom
    results = _upstream_errors(crd_validators, custom)
    assert None not in results.values(), f"no validator for {results}"
    assert {k: e for k, e in results.items() if e} == {}


def test_upstream_validators_catch_a_broken_body(render: Any, crd_validators: Path) -> None:
    docs = render(*CASES["everything"])
    (scaled,) = copy.deepcopy(list(by_kind(docs, "ScaledObject").values()))
    scaled["spec"]["minReplicaCount"] = "one"
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 20
    monitor = copy.deepcopy(by_kind(docs, "PodMonitor")[f"{RELEASE}-interlude-engine"])
    monitor["spec"]["podMetricsEndpoints"] = "http"
    errors = _upstream_errors(crd_validators, [scaled, monitor])
    assert any("minReplicaCount" in e for e in errors[f"ScaledObject/{scaled['metadata']['name']}"])
    assert any("threshold" in e for e in errors[f"ScaledObject/{scaled['metadata']['name']}"])
    assert any(
        "podMetricsEndpoints" in e for e in errors[f"PodMonitor/{monitor['metadata']['name']}"]
    )


def _key_lines(node: yaml.Node, path: str = "") -> list[tuple[str, int]]:
    """(dotted key, 0-based line) of every mapping key in a values file, nested ones too."""
    found = []
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            dotted = f"{path}.{key.value}" if path else key.value
            found.append((dotted, key.start_mark.line))
            # A one-line {...} value is documented as a whole, like a scalar.
            if isinstance(value, yaml.MappingNode) and not value.flow_style:
                found += _key_lines(value, dotted)
    return found


def test_every_value_has_a_doc_comment() -> None:
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    undocumented = []
    for key, line in _key_lines(yaml.compose(text)):
        above, i = [], line - 1
        while i >= 0 and lines[i].strip().startswith("#"):
            above.append(lines[i].strip())
            i -= 1
        if not any(c.startswith("# --") for c in above):
            undocumented.append(key)
    assert not undocumented, f"values without a '# --' comment: {undocumented}"


def _schema_holes(schema: dict[str, Any], values: Any, path: str = "") -> list[str]:
    """Schema properties with no value in values.yaml (a value nobody can see the default of)."""
    holes = []
    for key, sub in schema.get("properties", {}).items():
        where = f"{path}.{key}" if path else key
        if not isinstance(values, dict) or key not in values:
            holes.append(where)
        elif "properties" in sub:
            holes += _schema_holes(sub, values[key], where)
    return holes


def test_schema_and_values_cover_each_other() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    assert _schema_holes(schema, values) == []
    # values.yaml itself must fit (helm lint checks this too, with helm's own validator).
    jsonschema.Draft7Validator(schema).validate(values)


def test_schema_takes_digest_key_lines(helm: str) -> None:
    line = "gateway.auth.keys[0]=ci:0123abcd:sha256$" + "A" * 43 + "="
    out = run_helm(helm, "template", "rel", str(CHART), "--set-string", line)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("flag", "setting", "message"),
    [  # helm 4's wording, then helm 3's
        ("--set", "gateway.replicaz=2", r"'replicaz' not allowed|property replicaz is not allowed"),
        ("--set", "sidecar.enabled=true", r"'sidecar' not allowed|property sidecar is not allowed"),
        ("--set-string", "engine.gpus=one", r"got string, want integer|Expected: integer"),
        ("--set", "engine.toolParser=llama3_json", r"toolParser.*must be one of"),
        ("--set", "tools.autoscaling.mode=cron", r"mode.*must be one of"),
        # The request limits moved to the engines, which parse the requests now.
        ("--set", "gateway.maxTokens=10", r"'maxTokens' not allowed|property maxTokens is not"),
        ("--set", "engine.maxMessages=0", r"maxMessages.*minimum|maxMessages.*greater"),
        ("--set", "operator.replicas=0", r"replicas.*minimum|replicas.*greater"),
        ("--set", "gatewayToken.existingSecretKey=", r"existingSecretKey.*minLength|length"),
        # A key line must be a digest, never the key itself.
        ("--set", "gateway.auth.keys[0]=ci:0123abcd:il-0123abcd-s3cret", r"keys.*pattern|match"),
        ("--set-string", "gateway.auth.defaultTools=calc ulator", r"defaultTools.*pattern|match"),
    ],
)
def test_schema_rejects_bad_values(helm: str, flag: str, setting: str, message: str) -> None:
    out = run_helm(helm, "template", "rel", str(CHART), flag, setting)
    assert out.returncode != 0
    assert re.search(message, out.stderr, re.DOTALL), out.stderr


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((CHART / "crds" / "enginepools.interlude.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def _at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    for part in json_path.strip(".").split("."):
        schema = schema["properties"][part]
    return schema


def test_example_enginepool_fits_its_crd() -> None:
    schema = _crd_schema()
    validator = jsonschema.Draft7Validator(schema)
    example = yaml.safe_load((CHART / "examples" / "enginepool.yaml").read_text())
    assert example["kind"] == "EnginePool"
    assert list(validator.iter_errors(example)) == []
    broken = copy.deepcopy(example)
    broken["spec"]["model"]["source"] = "s3"
    broken["spec"]["minReplicas"] = "two"
    broken["spec"]["targets"]["kvUsage"] = 1.5
    broken["spec"]["surprise"] = True
    errors = {e.json_path for e in validator.iter_errors(broken)}
    assert {"$.spec.model.source", "$.spec.minReplicas", "$.spec.targets.kvUsage"} <= errors
    # Structural schemas prune unknown fields, so the CRD must not allow any at the top of spec.
    assert _at(schema, ".spec").get("additionalProperties") is not True


def test_crd_scale_subresource_points_at_real_fields() -> None:
    crd = yaml.safe_load((CHART / "crds" / "enginepools.interlude.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    scale, schema = version["subresources"]["scale"], version["schema"]["openAPIV3Schema"]
    assert _at(schema, scale["specReplicasPath"])["type"] == "integer"
    assert _at(schema, scale["statusReplicasPath"])["type"] == "integer"
    assert _at(schema, scale["labelSelectorPath"])["type"] == "string"
    assert "status" in version["subresources"]
    conditions = _at(schema, ".status.conditions")["items"]["required"]
    assert {"type", "status", "reason", "lastTransitionTime"} <= set(conditions)


def test_rendered_enginepool_fits_its_crd(render: Any) -> None:
    (pool,) = by_kind(render(*CASES["everything"]), "EnginePool").values()
    assert list(jsonschema.Draft7Validator(_crd_schema()).iter_errors(pool)) == []
    assert pool["spec"]["minReplicas"] <= pool["spec"]["replicas"] <= pool["spec"]["maxReplicas"]
