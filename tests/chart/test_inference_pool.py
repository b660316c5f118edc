"""The second routing path: an InferencePool over the engines, Interlude's picker as its endpoint
picker, and an HTTPRoute from the cluster's Gateway to the pool.

No registry ships the InferencePool CRD, so the rendered pool is checked against a JSON Schema
transcribed from the upstream Go API types (schemas/inferencepool-v1.schema.json), and the
schema itself is shown to refuse broken pools; the HTTPRoute goes through the validator generated
from Gateway API's types (npm, scripts/get-crd-validators.sh). The picker's flags are read off
the real `interlude picker`.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from .conftest import (
    CASES,
    CHART,
    DISAGGREGATED,
    INFERENCE_POOL,
    MONITORING,
    NAMESPACE,
    PROD,
    Manifest,
    by_kind,
    container,
    env_of,
    name,
    run_helm,
)

SCHEMA = json.loads(
    (Path(__file__).parent / "schemas" / "inferencepool-v1.schema.json").read_text()
)
POOL, PICKER, ENGINE = name("inference-pool"), name("picker"), name("engine")
# The example's Gateway pods (examples/inference-pool-values.yaml).
GATEWAY_PODS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}},
        "podSelector": {
            "matchLabels": {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
        },
    }
]
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
# Enough to render the path (no HTTPRoute, no network policies to name peers for).
ON = ("--set", "picker.enabled=true,inferencePool.enabled=true,networkPolicy.enabled=false")


def _pool(docs: tuple[Manifest, ...]) -> Manifest:
    (pool,) = by_kind(docs, "InferencePool").values()
    return pool


def _errors(doc: Manifest) -> set[str]:
    return {e.json_path for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(doc)}


def _upstream_errors(validators: Path, docs: list[Manifest]) -> dict[str, list[str] | None]:
    out = subprocess.run(
        ["node", str(Path(__file__).with_name("crd_validate.mjs")), str(validators)],
        input=json.dumps(docs), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return {f"{r['kind']}/{r['name']}": r["errors"] for r in json.loads(out.stdout)}


def test_nothing_of_the_path_by_default(render: Any) -> None:
    for case in set(CASES) - {"inference-pool"}:
        docs = render(*CASES[case])
        assert not {"InferencePool", "HTTPRoute"} & {d["kind"] for d in docs}, case
        picker = [d for d in docs if d["metadata"]["name"] == PICKER]
        assert picker == [], f"{case}: {[d['kind'] for d in picker]}"
        assert not any("picker" in json.dumps(d) for d in docs if d["kind"] == "NetworkPolicy")


def _with(pool: Manifest, change: Callable[[dict[str, Any]], object]) -> Manifest:
    """A copy of the pool with `change` applied to its spec."""
    changed = copy.deepcopy(pool)
    change(changed["spec"])
    return changed


REF = "$.spec.endpointPickerRef"


def _ref(spec: dict[str, Any]) -> dict[str, Any]:
    ref: dict[str, Any] = spec["endpointPickerRef"]
    return ref


# How a pool can be wrong, and where the schema must say so.
BROKEN: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    (
        "two ports (v1.0: one)",
        lambda s: s["targetPorts"].append({"number": 81}),
        "$.spec.targetPorts",
    ),
    ("a Service without a port (CEL)", lambda s: _ref(s).pop("port"), REF),
    ("no kind (Service), no port", lambda s: [_ref(s).pop(k) for k in ("kind", "port")], REF),
    ("an unknown failure mode", lambda s: _ref(s).update(failureMode="Open"), f"{REF}.failureMode"),
    ("a typo (pruned by the server)", lambda s: _ref(s).update(failuremode="FailOpen"), REF),
    (
        "a bad label value",
        lambda s: s["selector"]["matchLabels"].update(app="-x"),
        "$.spec.selector.matchLabels.app",
    ),
    ("no labels", lambda s: s["selector"].update(matchLabels={}), "$.spec.selector.matchLabels"),
    ("no picker (required in v1.0)", lambda s: s.pop("endpointPickerRef"), "$.spec"),
]


def test_the_pool_fits_the_v1_schema_and_the_schema_bites(render: Any) -> None:
    pool = _pool(render(*CASES["inference-pool"]))
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert _errors(pool) == set()
    for what, change, where in BROKEN:
        assert where in _errors(_with(pool, change)), what
    # The port is required for a Service only.
    other = _with(pool, lambda s: _ref(s).pop("port"))
    _ref(other["spec"]).update(group="example.com", kind="Picker")
    assert _errors(other) == set()


def _pod_labels(workload: Manifest) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def test_the_pool_selects_the_engine_pods_and_nothing_else(render: Any) -> None:
    from interlude_operator.deployment import pod_template
    from interlude_operator.spec import parse

    docs = render(*CASES["inference-pool"])
    selector = _pool(docs)["spec"]["selector"]["matchLabels"]
    # The same pods as the engine Service, which the gateway and the picker discover them by.
    assert selector == by_kind(docs, "Service")[ENGINE]["spec"]["selector"]
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    selected = [w for w, d in workloads.items() if selector.items() <= _pod_labels(d).items()]
    assert selected == [ENGINE]
    # Role pools: a Deployment per pool, each pool's pods in the InferencePool.
    pools = render("-f", str(PROD), "-f", str(DISAGGREGATED), *ON)
    engines = {w: d for w, d in by_kind(pools, "Deployment").items() if w.startswith(ENGINE)}
    assert len(engines) == 3
    selector = _pool(pools)["spec"]["selector"]["matchLabels"]
    for workload, d in engines.items():
        assert selector.items() <= _pod_labels(d).items(), workload
    # The operator's EnginePool (roles or not): the pods it makes carry the selector too.
    pooled = "operator.enabled=true,operator.enginePool.create=true"
    for roles in ("false", "true"):
        docs = render(*ON, "--set", f"{pooled},operator.enginePool.roles.enabled={roles}")
        (enginepool,) = by_kind(docs, "EnginePool").values()
        made = pod_template(enginepool["metadata"]["name"], parse(enginepool["spec"], env={}))
        selector = _pool(docs)["spec"]["selector"]["matchLabels"]
        assert selector.items() <= made["metadata"]["labels"].items(), roles


def test_the_pool_targets_the_engine_port_and_names_the_pickers_grpc_port(render: Any) -> None:
    docs = render(*CASES["inference-pool"], "--set", "engine.port=8200,picker.port=9102")
    spec = _pool(docs)["spec"]
    engine_ports = container(docs, "engine")["ports"]
    assert (
        spec["targetPorts"]
        == [{"number": 8200}]
        == [{"number": p["containerPort"]} for p in engine_ports]
    )
    ref = spec["endpointPickerRef"]
    assert (ref["group"], ref["kind"], ref["failureMode"]) == ("", "Service", "FailClose")
    service = by_kind(docs, "Service")[ref["name"]]
    (grpc,) = service["spec"]["ports"]  # no metrics port: Prometheus scrapes the pods
    assert grpc == {
        "name": "grpc",
        "port": ref["port"]["number"],
        "targetPort": "grpc",
        "protocol": "TCP",
        "appProtocol": "kubernetes.io/h2c",
    }
    picker = container(docs, "picker")
    ports = {p["name"]: p["containerPort"] for p in picker["ports"]}
    assert ports == {"grpc": 9102, "metrics": 9090}
    deployment = by_kind(docs, "Deployment")[PICKER]
    assert service["spec"]["selector"].items() <= _pod_labels(deployment).items()
    # Health over grpc.health.v1 on that port, by the services the picker registers.
    assert picker["livenessProbe"]["grpc"] == {"port": 9102, "service": "liveness"}
    assert picker["readinessProbe"]["grpc"] == {"port": 9102, "service": "readiness"}
    assert f"--port={ports['grpc']}" in picker["args"]
    assert f"--metrics-port={ports['metrics']}" in picker["args"]
    assert f"--engine-port={engine_ports[0]['containerPort']}" in picker["args"]
    pool = _pool(render(*ON, "--set", "inferencePool.failureMode=FailOpen,inferencePool.name=llm"))
    assert pool["metadata"]["name"] == "llm"
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


def test_the_picker_finds_the_engines_as_the_gateway_does(render: Any) -> None:
    docs = render(*CASES["inference-pool"])
    picker, gateway = container(docs, "picker"), container(docs, "gateway")
    assert f"--engine-service={NAMESPACE}/{ENGINE}" in picker["args"]
    assert env_of(gateway)["INTERLUDE_GATEWAY_ENGINE_SERVICE"] == f"{NAMESPACE}/{ENGINE}"
    roles = {n: by_kind(docs, "Role")[n]["rules"] for n in (PICKER, name("gateway"))}
    assert roles[PICKER] == roles[name("gateway")]
    (binding,) = [
        b for b in by_kind(docs, "RoleBinding").values() if b["metadata"]["name"] == PICKER
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": PICKER, "namespace": NAMESPACE}
    ]
    spec = by_kind(docs, "Deployment")[PICKER]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == PICKER
    # The token the engines believe the tenant headers by: the same Secret for all three.
    token = env_of(picker)["INTERLUDE_GATEWAY_TOKEN"]
    assert token == env_of(gateway)["INTERLUDE_GATEWAY_TOKEN"]
    assert token == env_of(container(docs, "engine"))["INTERLUDE_GATEWAY_TOKEN"]
    pdb = by_kind(docs, "PodDisruptionBudget")[PICKER]
    assert pdb["spec"]["minAvailable"] == 1
    one = render(*ON, "--set", "picker.replicas=1")
    assert PICKER not in by_kind(one, "PodDisruptionBudget")


AUTH_FLAGS = ("--api-keys-file", "--tenant-header", "--no-auth")


def _auth(args: list[str]) -> list[str]:
    return [a for a in args if a.split("=")[0] in AUTH_FLAGS]


def test_picker_auth_modes(render: Any) -> None:
    keys = render(*ON, "--set", "gateway.enabled=false")  # the keys Secret without the gateway
    picker = container(keys, "picker")
    assert _auth(picker["args"]) == ["--api-keys-file=/etc/interlude/keys/keys.txt"]
    volumes = by_kind(keys, "Deployment")[PICKER]["spec"]["template"]["spec"]["volumes"]
    (secret,) = [v["secret"]["secretName"] for v in volumes if "secret" in v]
    assert secret == name("gateway-keys")
    assert "keys.txt" in by_kind(keys, "Secret")[secret]["stringData"]
    assert {"name": "api-keys", "mountPath": "/etc/interlude/keys", "readOnly": True} in picker[
        "volumeMounts"
    ]
    theirs = render(*ON, "--set", "gateway.auth.existingSecret=keys,gateway.auth.secretKey=k")
    assert _auth(container(theirs, "picker")["args"]) == ["--api-keys-file=/etc/interlude/keys/k"]
    assert name("gateway-keys") not in by_kind(theirs, "Secret")
    header = render(*ON, "--set", "picker.auth.mode=header,picker.auth.tenantHeader=x-tenant")
    picker = container(header, "picker")
    assert _auth(picker["args"]) == ["--tenant-header=x-tenant"]
    assert all(m["name"] != "api-keys" for m in picker["volumeMounts"])
    assert name("gateway-keys") in by_kind(header, "Secret")  # the gateway still reads keys
    # Nobody reads keys: no Secret.
    none = render(*ON, "--set", "picker.auth.mode=none,gateway.auth.enabled=false")
    assert _auth(container(none, "picker")["args"]) == ["--no-auth"]
    assert name("gateway-keys") not in by_kind(none, "Secret")


def _help_flags(command: list[str]) -> set[str]:
    """The option names `command --help` lists (typer's rich table, click's or argparse's)."""
    exe = Path(sys.executable).parent / command[0]
    path = str(exe) if exe.exists() else shutil.which(command[0])
    if path is None:
        pytest.fail(f"`{command[0]}` is not installed: pip install -e . first", pytrace=False)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    out = subprocess.run(
        [path, *command[1:], "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    if out.returncode != 0:
        pytest.fail(
            f"`{' '.join(command)} --help` failed: the chart's picker Deployment runs "
            f"`{' '.join(command)}`, which must exist (services/interlude/picker).\n"
            f"{out.stdout}{out.stderr}",
            pytrace=False,
        )
    flags = set()
    for line in out.stdout.splitlines():
        tokens = line.strip(" │|").replace(",", " ").split()
        # An option's row starts with its names; descriptions mentioning a flag do not count.
        for token in tokens:
            if not token.startswith("-"):
                break
            flags.add(token.split("=")[0])
    return flags


def test_picker_args_are_flags_interlude_picker_takes(render: Any) -> None:
    modes = {
        "keys": (),
        "header": ("--set", "picker.auth.mode=header,picker.auth.tenantHeader=x-tenant"),
        "none": ("--set", "picker.auth.mode=none"),
    }
    rendered = {m: container(render(*ON, *extra), "picker") for m, extra in modes.items()}
    command = rendered["keys"]["command"]
    assert command == ["interlude", "picker"]
    known = _help_flags(command)
    assert "--help" in known, "the help text was not read"
    for mode, picker in rendered.items():
        used = {a.split("=")[0] for a in picker["args"]}
        assert used <= known, f"{mode}: `interlude picker` has no {sorted(used - known)}"
        assert len(_auth(picker["args"])) == 1, mode  # exactly one way to name the tenant
    # And its own parser takes the values (types, ranges), where it is a click command.
    from .test_wiring import _cli

    cmd = _cli(command)
    if not cmd.context_settings.get("ignore_unknown_options"):
        for picker in rendered.values():
            assert cmd.make_context("picker", list(picker["args"])).params


def test_the_http_route_fits_gateway_api_and_sends_to_the_pool(
    render: Any, crd_validators: Path
) -> None:
    docs = render(*CASES["inference-pool"])
    (route,) = by_kind(docs, "HTTPRoute").values()
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": POOL}
    ]
    assert _pool(docs)["metadata"]["name"] == POOL
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["timeouts"] == {"request": "600s"}
    assert route["spec"]["parentRefs"] == [
        {"name": "inference-gateway", "namespace": "gateway-system"}
    ]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    no_timeout = by_kind(
        render(*CASES["inference-pool"], "--set", "inferencePool.httpRoute.requestTimeout=0s"),
        "HTTPRoute",
    )[POOL]
    default_timeout = copy.deepcopy(route)
    del default_timeout["spec"]["rules"][0]["timeouts"]
    unset = by_kind(
        render(*CASES["inference-pool"], "--set", "inferencePool.httpRoute.requestTimeout="),
        "HTTPRoute",
    )[POOL]
    assert unset == default_timeout
    broken = copy.deepcopy(route)
    broken["metadata"]["name"] = "broken"
    broken["spec"]["rules"][0]["timeouts"]["request"] = "10 minutes"
    broken["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Prefix"
    assert no_timeout["spec"]["rules"][0]["timeouts"] == {"request": "0s"}  # none: a valid one
    no_timeout["metadata"]["name"] = "no-timeout"
    errors = _upstream_errors(crd_validators, [route, no_timeout, broken])
    assert errors[f"HTTPRoute/{POOL}"] == [] and errors["HTTPRoute/no-timeout"] == []
    assert errors["HTTPRoute/broken"] and any("request" in e for e in errors["HTTPRoute/broken"])
    assert any("type" in e for e in errors["HTTPRoute/broken"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ("inferencePool.enabled=true", r"inferencePool.enabled needs picker.enabled=true"),
        (
            "picker.enabled=true,inferencePool.enabled=true,networkPolicy.enabled=false,"
            "inferencePool.httpRoute.enabled=true",
            r"parentRefs.*(minItems|minimum)",
        ),
        (
            "picker.enabled=true,inferencePool.enabled=true",
            r"name your Gateway's data-plane pods in networkPolicy.inferenceGatewayFrom",
        ),
        (
            "picker.enabled=true,inferencePool.enabled=true,networkPolicy.enabled=false,"
            "gatewayToken.enabled=false",
            r"needs gatewayToken.enabled=true",
        ),
        ("picker.enabled=true,engine.enabled=false", r"set engine.enabled=true"),
        ("picker.auth.mode=header", r"tenantHeader.*(minLength|length)"),
        ("picker.auth.mode=jwt", r"mode.*(enum|one of)"),
        ("picker.auth.tenantHeader=x tenant", r"tenantHeader.*(pattern|match)"),
        ("picker.auth.tenantHeader=X-Interlude-Tenant", r"tenantHeader.*not"),
        ("inferencePool.failureMode=Open", r"failureMode.*(enum|one of)"),
        ("inferencePool.httpRoute.requestTimeout=10min", r"requestTimeout.*(pattern|match)"),
        ("inferencePool.name=Pool_1", r"name.*(pattern|match)"),
        ("picker.shedQueue=-1", r"shedQueue.*(minimum|greater)"),
        ("picker.porrt=1", r"'porrt' not allowed|property porrt is not allowed"),
    ],
)
def test_what_cannot_work_is_refused(helm: str, settings: str, message: str) -> None:
    out = run_helm(helm, "template", "rel", str(CHART), "--set", settings)
    assert out.returncode != 0, settings
    assert re.search(message, out.stderr, re.DOTALL), out.stderr


def _ingress(docs: tuple[Manifest, ...], component: str) -> list[dict[str, Any]]:
    return list(by_kind(docs, "NetworkPolicy")[name(component)]["spec"]["ingress"])


def _peers(component: str) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "interlude",
        "app.kubernetes.io/instance": "rel",
        "app.kubernetes.io/component": component,
    }
    return {"podSelector": {"matchLabels": labels}}


def test_network_policies_of_the_inference_path(render: Any) -> None:
    docs = render(*CASES["inference-pool"])
    (engine_rule,) = [r for r in _ingress(docs, "engine") if r.get("ports")]
    assert engine_rule["ports"] == [{"port": 8100, "protocol": "TCP"}]
    own = [_peers("gateway"), _peers("operator"), PROMETHEUS, _peers("picker")]
    assert engine_rule["from"] == own + GATEWAY_PODS
    grpc, metrics = _ingress(docs, "picker")
    assert grpc == {"from": GATEWAY_PODS, "ports": [{"port": 9002, "protocol": "TCP"}]}
    assert metrics == {"from": [PROMETHEUS], "ports": [{"port": 9090, "protocol": "TCP"}]}
    # The picker alone (no pool): the engines let it read /v1/load; its gRPC port takes nobody.
    alone = render("--set", "picker.enabled=true", "--set-json", _gateway_pods())
    (engine_rule,) = [r for r in _ingress(alone, "engine") if r.get("ports")]
    assert engine_rule["from"] == own
    assert _ingress(alone, "picker") == [metrics]


def _gateway_pods() -> str:
    return f"networkPolicy.inferenceGatewayFrom={json.dumps(GATEWAY_PODS)}"


def test_the_picker_is_scraped_like_the_gateway(render: Any) -> None:
    docs = render(*CASES["inference-pool"])
    monitor = by_kind(docs, "PodMonitor")[PICKER]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert (
        monitor["spec"]["selector"]["matchLabels"]
        == (by_kind(docs, "Service")[PICKER]["spec"]["selector"])
    )
    annotated = render(*ON, "--set", "monitoring.scrapeAnnotations=true")
    template = by_kind(annotated, "Deployment")[PICKER]["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert PICKER not in by_kind(render(*MONITORING), "PodMonitor")


def test_the_example_overlay_lints_and_renders_the_whole_path(helm: str, render: Any) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(INFERENCE_POOL))
    assert out.returncode == 0, out.stdout + out.stderr
    with_prod = render("-f", str(PROD), "-f", str(INFERENCE_POOL))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in with_prod}
    assert {("InferencePool", POOL), ("HTTPRoute", POOL), ("Deployment", PICKER)} <= kinds
    assert ("Deployment", name("gateway")) in kinds  # both paths, in front of the same engines
    assert _errors(_pool(with_prod)) == set()
