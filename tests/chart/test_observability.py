"""Dashboards, traces and the operator's metrics as the chart ships them.

The dashboards are generated (`make dashboards`, interlude.dashboards): the committed JSON must
be what the generator makes, and every metric they query must be one the code exports. Traces
go pods -> collector -> Tempo (or pods -> Tempo), and Grafana finds Tempo and Prometheus through
the data-source ConfigMap: the names, ports and uids on each side must agree.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from .conftest import CASES, CHART, NAMESPACE, ROOT, by_kind, container, env_of, name

DASHBOARDS = CHART / "dashboards"
# What the issue asks the dashboards to show, by the metric that shows it.
REQUIRED = {
    "interlude:gateway_requests_total",  # requests
    "interlude:gateway_request_seconds_bucket",  # latency
    "interlude:gateway_routes_total",  # the gateway's engine choice (affinity, balanced, ...)
    "interlude:chat_ttft_seconds_bucket",  # TTFT, on the engines (the gateway reads no answers)
    "interlude:chat_tokens_total",  # tokens
    "interlude:chat_routes_total",  # session routes: new, resume, fallback
    "interlude:chat_fallbacks_total",  # and why fallbacks happened
    "interlude:paused_requests",  # paused requests by strategy
    "interlude:kv_waste_gb_seconds_total",  # KV waste, raw
    "interlude:kv_waste_contended_gb_seconds_total",  # and contended
    "vllm:kv_cache_usage_perc",  # KV usage
    "interlude_tool_call_seconds_bucket",  # tool latency per tool
    "interlude_tool_stream_lag",  # stream lag
    "interlude_operator_replicas",  # replicas
    "interlude_operator_events_total",  # scaling decisions
    "interlude_operator_decisions_total",
    "interlude:picker_picks_total",  # the endpoint picker (InferencePool path): picks by route
    "interlude:picker_refusals_total",  # its refusals by status
    "interlude:picker_pick_seconds_bucket",  # pick latency
    "interlude:picker_engines",  # engines it sees
    "interlude:picker_streams",  # open ext_proc streams
}


def _exported_metrics() -> set[str]:
    """Metric names the code exports, with prometheus_client's suffixes, plus vLLM's own. A
    name is a string literal or one of the contract constants (`interlude.api.cluster`)."""
    from interlude.api import cluster

    pattern = re.compile(
        r"\b(Counter|Gauge|Histogram)\(\s*(?:\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"|([A-Z_]+_METRIC)\b)"
    )
    suffixes = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for folder in ("services", "tools-svc", "operator"):
        for path in (ROOT / folder).rglob("*.py"):
            for kind, literal, constant in pattern.findall(path.read_text()):
                metric = literal or getattr(cluster, constant)
                names |= {metric + s for s in suffixes[kind]}
    # vLLM's (DESIGN section 3): exported by the engine's /metrics alongside ours.
    return names | {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"}


def _queries(board: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Every PromQL a dashboard runs: (panels' targets and annotations, variables' queries)."""
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", []) if "expr" in t]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    variables = [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs, variables


def test_committed_dashboards_are_the_generated_ones() -> None:
    from interlude.dashboards import render

    generated = render()
    assert sorted(generated) == sorted(p.name for p in DASHBOARDS.glob("*.json"))
    for file, text in generated.items():
        assert (DASHBOARDS / file).read_text() == text, f"{file}: run `make dashboards`"


def test_dashboards_query_only_exported_metrics(render: Any) -> None:
    exported = _exported_metrics()
    assert {"interlude_tool_stream_lag", "interlude_operator_replicas"} <= exported  # scan works
    used_anywhere: set[str] = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        exprs, variables = _queries(board)
        assert exprs, path.name
        found = (re.findall(r"\b(?:interlude|vllm)[a-zA-Z0-9_:]*", e) for e in exprs + variables)
        used = {m for names in found for m in names}
        assert used <= exported, f"{path.name} queries unknown metrics: {used - exported}"
        used_anywhere |= used
        # Every panel and annotation keeps to one release's series (the variables pick it).
        for e in exprs:
            assert 'namespace="$namespace", app_kubernetes_io_instance=~"$release"' in e, e
    assert not REQUIRED - used_anywhere, f"no panel shows {REQUIRED - used_anywhere}"
    maps = by_kind(render(), "ConfigMap")
    shipped = [m for m in maps.values() if m["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert sorted(k for m in shipped for k in m["data"]) == sorted(
        p.name for p in DASHBOARDS.glob("*.json")
    )


def test_dashboards_link_to_traces() -> None:
    board = json.loads((DASHBOARDS / "interlude-overview.json").read_text())
    panels = {p["title"]: p for p in board["panels"]}
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["tempo"]["query"] == "tempo"
    assert variables["datasource"]["query"] == "prometheus"
    latency = panels["Latency (request to last byte)"]
    assert all(t["exemplar"] for t in latency["targets"])  # exemplar dots open traces
    url = latency["links"][0]["url"]
    assert "${tempo}" in url and "interlude-gateway" in url
    (traces,) = [p for p in board["panels"] if p.get("datasource", {}).get("type") == "tempo"]
    assert traces["targets"][0]["queryType"] == "traceql"


def _datasources(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    config = by_kind(docs, "ConfigMap")[name("datasources")]
    assert config["metadata"]["labels"]["grafana_datasource"] == "1"
    (text,) = config["data"].values()
    return {d["type"]: d for d in yaml.safe_load(text)["datasources"]}


def test_tempo_without_collector_takes_the_pods_spans(render: Any) -> None:
    docs = render(*CASES["tempo"])
    tempo = by_kind(docs, "StatefulSet")[name("tempo")]
    ports = {
        p["name"]: p["containerPort"]
        for p in tempo["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    config = yaml.safe_load(by_kind(docs, "ConfigMap")[name("tempo")]["data"]["tempo.yaml"])
    receivers = config["distributor"]["receivers"]["otlp"]["protocols"]
    assert receivers["http"]["endpoint"].endswith(f":{ports['otlp-http']}")
    assert receivers["grpc"]["endpoint"].endswith(f":{ports['otlp-grpc']}")
    assert config["server"]["http_listen_port"] == ports["http"]
    assert config["storage"]["trace"]["backend"] == "local"
    assert tempo["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    service = by_kind(docs, "Service")[name("tempo")]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    for component in ("gateway", "engine", "tools"):
        endpoint = env_of(container(docs, component))["INTERLUDE_OTLP_ENDPOINT"]
        assert endpoint == f"http://{name('tempo')}:{ports['otlp-http']}"
    sources = _datasources(docs)
    assert sources["tempo"]["url"] == f"http://{name('tempo')}.{NAMESPACE}.svc:{ports['http']}"
    (exemplars,) = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert exemplars["datasourceUid"] == sources["tempo"]["uid"]
    assert (
        sources["tempo"]["jsonData"]["serviceMap"]["datasourceUid"] == sources["prometheus"]["uid"]
    )
    rules = by_kind(docs, "NetworkPolicy")[name("tempo")]["spec"]["ingress"]
    assert [sorted(p["port"] for p in r["ports"]) for r in rules] == [[4317, 4318], [3200]]
    assert rules[1]["from"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "grafana"}
    }


def test_collector_forwards_to_the_charts_tempo(render: Any) -> None:
    docs = render(*CASES["everything"])
    config = yaml.safe_load(
        by_kind(docs, "ConfigMap")[name("otel-collector")]["data"]["config.yaml"]
    )
    exporter = config["exporters"]["otlp/tempo"]
    assert exporter == {"endpoint": f"{name('tempo')}:4317", "tls": {"insecure": True}}
    endpoint = env_of(container(docs, "gateway"))["INTERLUDE_OTLP_ENDPOINT"]
    assert endpoint == f"http://{name('otel-collector')}:4318"


def test_no_tempo_and_no_datasources_by_default(render: Any) -> None:
    docs = render()
    assert name("tempo") not in by_kind(docs, "StatefulSet")
    assert name("datasources") not in by_kind(docs, "ConfigMap")
    # An external Tempo: only the data source, pointing at it.
    external = render(
        "--set", "monitoring.grafanaDatasources.enabled=true",
        "--set", "monitoring.grafanaDatasources.tempoUrl=http://tempo.tracing:3200",
    )  # fmt: skip
    assert name("tempo") not in by_kind(external, "StatefulSet")
    assert _datasources(external)["tempo"]["url"] == "http://tempo.tracing:3200"
    assert "tempo" not in _datasources(
        render("--set", "monitoring.grafanaDatasources.enabled=true")
    )


def test_operator_metrics_are_scraped(render: Any) -> None:
    from interlude_operator.__main__ import parser

    docs = render(*CASES["everything"])
    operator = container(docs, "operator")
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    args = parser().parse_args(operator["args"])  # the real command line parser
    assert args.metrics_port == ports["metrics"]
    monitor = by_kind(docs, "PodMonitor")[name("operator")]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_the_gateways_metrics_are_scraped_on_a_port_the_world_cannot_reach(render: Any) -> None:
    from .conftest import MONITORING

    docs = render(*MONITORING, "--set", "networkPolicy.enabled=true")
    gw = container(docs, "gateway")
    assert "--metrics-port=9100" in gw["args"]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in gw["ports"]
    monitor = by_kind(docs, "PodMonitor")[name("gateway")]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    service = by_kind(docs, "Service")[name("gateway")]
    assert [p["port"] for p in service["spec"]["ports"]] == [8000]  # not in the Service
    ingress = by_kind(docs, "NetworkPolicy")[name("gateway")]["spec"]["ingress"]
    metrics_rules = [r for r in ingress if {p["port"] for p in r["ports"]} == {9100}]
    api_rules = [r for r in ingress if {p["port"] for p in r["ports"]} == {8000}]
    assert len(metrics_rules) == 1 and "from" in metrics_rules[0]  # Prometheus only
    assert api_rules and "from" not in api_rules[0]  # the API from anyone, by default
