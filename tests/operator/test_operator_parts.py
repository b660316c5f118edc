"""The operator's parts: the spec, the Deployment it renders, which pod to drain and when a
drain ends, its conditions, and its two metric readers against real HTTP endpoints (the
Prometheus one through a real Prometheus)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import jsonschema
import pytest
import yaml
from operator_fakes import FakeEngine
from operator_kit import CRD, eventually, free_port, pool
from operator_prom import Prometheus

from interlude_operator import deployment as dep
from interlude_operator.metrics import EngineReading, MetricsError, Target, observe
from interlude_operator.pods import (
    DrainEntry,
    EnginePod,
    choose_to_drain,
    classify,
    drain_finished,
    parse_draining,
    parse_pod,
)
from interlude_operator.prom import PrometheusSource
from interlude_operator.scrape import ScrapeSource
from interlude_operator.spec import PoolSpec, Scaling, parse
from interlude_operator.status import Condition, conditions

EXAMPLE = CRD.parents[1] / "examples/enginepool.yaml"


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def test_the_chart_example_parses_and_the_tests_pool_fits_the_crd() -> None:
    spec = parse(example()["spec"], env={})
    assert spec.scaling == Scaling(2, 8, 2, 30.0, 600.0, 300.0, "operator")
    assert spec.metrics.source == "prometheus" and spec.metrics.interval_s == 15
    assert spec.served_name == "meta-llama/Meta-Llama-3-8B-Instruct"
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(pool("p", 8100, "http://prometheus:9090"), schema)


def test_spec_defaults_and_errors_name_the_field() -> None:
    spec = parse({"minReplicas": 0, "maxReplicas": 2, "model": {"source": "tiny"}}, env={})
    assert spec.metrics.source == "scrape" and spec.scaling.down_window_s == 600
    assert spec.targets.kv_usage == 0.85 and spec.port == 8100
    env = {"INTERLUDE_PROMETHEUS_URL": "http://prom:9090/"}
    with_env = {"minReplicas": 1, "maxReplicas": 2, "metrics": {"source": "prometheus"}}
    assert parse({**with_env, "model": {"source": "tiny"}}, env=env).metrics.prometheus_url == (
        "http://prom:9090"
    )
    bad = [
        ({"maxReplicas": 2, "model": {"source": "tiny"}}, "spec.minReplicas is required"),
        ({"minReplicas": 1, "maxReplicas": 2, "model": {"source": "hf"}}, "model.hf.repo"),
        ({**with_env, "model": {"source": "tiny"}}, "INTERLUDE_PROMETHEUS_URL"),
        (
            {
                "minReplicas": 1,
                "maxReplicas": 2,
                "model": {"source": "tiny"},
                "targets": {"kvUsage": 2},
            },
            "targets.kvUsage",
        ),
        (
            {
                "minReplicas": 1,
                "maxReplicas": 2,
                "model": {"source": "tiny"},
                "engine": {"maxTokens": 0},
            },
            "engine.maxTokens",
        ),
        (
            {
                "minReplicas": 1,
                "maxReplicas": 2,
                "model": {"source": "tiny"},
                "engine": {"gatewayTokenSecretRef": {"key": "token"}},
            },
            "engine.gatewayTokenSecretRef",
        ),
    ]
    for body, message in bad:
        with pytest.raises(ValueError, match=message):
            parse(body, env={})


def test_the_deployment_runs_the_engine_as_the_chart_does() -> None:
    spec = parse(example()["spec"], env={})
    d = dep.render("llama", "llm", "uid-1", spec, 2)
    assert d["metadata"]["ownerReferences"][0] == dep.owner_reference("llama", "uid-1")
    assert d["spec"]["replicas"] == 2
    assert d["spec"]["selector"] == {"matchLabels": {"interlude.dev/enginepool": "llama"}}
    assert d["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0  # GPUs: no surge pod
    pod = d["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    (engine,) = pod["spec"]["containers"]
    assert engine["command"] == ["interlude", "engine"]
    assert "--model=/models/meta-llama/Meta-Llama-3-8B-Instruct" in engine["args"]
    assert "--host-blocks=4096" in engine["args"] and "--port=8100" in engine["args"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert engine["readinessProbe"]["httpGet"]["path"] == "/ready"
    (init,) = pod["spec"]["initContainers"]
    token = {"name": "hf-token", "key": "token"}
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": token}} in init["env"]
    names = [e["name"] for e in engine["env"]]
    assert names[:2] == ["POD_NAME", "POD_NAMESPACE"] and "INTERLUDE_ENGINE_ID" in names
    # The engine checks the request limits, and believes the gateway's tenant only with its token.
    assert {"--max-tokens=8192", "--max-messages=1024"} <= set(engine["args"])
    gateway_token = {"name": "interlude-gateway-token", "key": "token"}
    assert {
        "name": "INTERLUDE_GATEWAY_TOKEN",
        "valueFrom": {"secretKeyRef": gateway_token},
    } in engine["env"]
    # The hash moves with the template and only with it.
    assert d["metadata"]["annotations"][dep.TEMPLATE_HASH] == dep.template_hash(pod)
    other = parse({**example()["spec"], "engine": {"image": "x", "gpus": 0}}, env={})
    assert dep.template_hash(dep.pod_template("llama", other)) != dep.template_hash(pod)
    # Unset limits are the engine's defaults; an env entry of the token wins over the reference.
    (bare,) = dep.pod_template("llama", other)["spec"]["containers"]
    assert not [a for a in bare["args"] if a.startswith(("--max-tokens", "--max-messages"))]
    assert "INTERLUDE_GATEWAY_TOKEN" not in [e["name"] for e in bare["env"]]
    own = {"name": "INTERLUDE_GATEWAY_TOKEN", "value": "from-env"}
    engine_spec = {**example()["spec"]["engine"], "env": [own]}
    with_env = parse({**example()["spec"], "engine": engine_spec}, env={})
    (mine,) = dep.pod_template("llama", with_env)["spec"]["containers"]
    assert [e for e in mine["env"] if e["name"] == "INTERLUDE_GATEWAY_TOKEN"] == [own]


def _pod(name: str, created: str, ready: bool = True, terminating: bool = False) -> EnginePod:
    return EnginePod(name, "10.0.0.1", ready, terminating, created, draining=False)


def test_the_cheapest_engine_is_drained() -> None:
    pods = [_pod("a", "1"), _pod("b", "2"), _pod("c", "3"), _pod("d", "4", ready=False)]
    readings = {
        "a": EngineReading(kv_usage=0.1, sessions={"awaiting_client": 2}),
        "b": EngineReading(kv_usage=0.1, sessions={"generating": 1}),
        "c": EngineReading(kv_usage=0.1, sessions={"awaiting_tool": 1, "finished": 9}),
    }
    # A pod not ready holds nothing; then the fewest unfinished sessions, the youngest first.
    assert [p.name for p in choose_to_drain(pods, readings, 3)] == ["d", "c", "b"]
    # An engine that reported nothing counts as busy.
    assert [p.name for p in choose_to_drain([*pods[:2], _pod("e", "5")], readings, 1)] == ["b"]


def test_a_drain_ends_when_its_sessions_do_or_at_the_timeout() -> None:
    since = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    entry = DrainEntry("a", since)
    pod = _pod("a", "1")
    busy = EngineReading(kv_usage=0.2, sessions={"awaiting_client": 1, "finished": 3})
    done = EngineReading(kv_usage=0.0, sessions={"finished": 4})
    later = since + dt.timedelta(seconds=10)
    assert drain_finished(entry, pod, busy, later, 300) is None
    assert drain_finished(entry, pod, None, later, 300) is None  # unread: wait, do not guess
    assert "sessions are finished" in str(drain_finished(entry, pod, done, later, 300))
    timeout = since + dt.timedelta(seconds=300)
    assert "timeout (300 s) passed with 1 sessions" in str(
        drain_finished(entry, pod, busy, timeout, 300)
    )
    assert "gone" in str(drain_finished(entry, None, busy, later, 300))
    assert "not ready" in str(drain_finished(entry, _pod("a", "1", ready=False), busy, later, 300))


def test_pods_split_by_role_and_drains_read_back_from_status() -> None:
    pods = [_pod("a", "1"), _pod("b", "2"), _pod("c", "3"), _pod("x", "0", terminating=True)]
    drains = parse_draining(
        [{"pod": "b", "since": "2026-01-01T00:00:00Z", "pausedSessions": 2}, {"pod": "c"}]
    )
    assert drains[0] == DrainEntry("b", dt.datetime(2026, 1, 1, tzinfo=dt.UTC), 2)
    split = classify(pods, drains, released="c")
    assert [p.name for p in split.serving] == ["a"]
    assert [p.name for p in split.draining] == ["b"]
    assert [p.name for p in split.released] == ["c"]
    raw = {
        "metadata": {"name": "a", "labels": {"interlude.dev/draining": "true"}},
        "status": {"podIP": "10.1.1.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert parse_pod(raw) == EnginePod("a", "10.1.1.1", True, False, "", draining=True)


def test_conditions_keep_their_transition_time_until_they_flip() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(minutes=5)
    first = conditions([Condition("Ready", True, "EnginesReady", "2 of 2")], None, t0, 3)
    again = conditions([Condition("Ready", True, "EnginesReady", "2 of 2")], first, t1, 3)
    flipped = conditions([Condition("Ready", False, "EnginesStarting", "1 of 2")], again, t1, 3)
    assert again[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T00:05:00Z"
    assert flipped[0]["observedGeneration"] == 3
    with pytest.raises(ValueError, match="CamelCase"):
        Condition("Ready", True, "not camel", "")


def test_pool_spec_rejects_a_model_without_its_source() -> None:
    with pytest.raises(ValueError, match=r"model\.pvcClaimName"):
        PoolSpec(scaling=Scaling(1, 2), model={"source": "pvc"})


@pytest.mark.asyncio
async def test_scraping_reads_each_engine_and_rates_the_contended_waste() -> None:
    clock, port = [100.0], free_port()
    # a: 7 sessions parked at tool calls wait in vLLM's queue too, "deferred": not load.
    a = FakeEngine("127.0.0.2", port, "llm", "a", kv=0.4, waiting=3, parked=7.0, pool_gb=20.0)
    b = FakeEngine("127.0.0.3", port, "llm", "b", kv=0.8, waiting=1, sessions={"queued": 2})
    try:
        source = ScrapeSource(rate_window_s=60, clock=lambda: clock[0])
        targets = [Target("a", a.ip, port), Target("b", b.ip, port), Target("c", "127.0.0.4", port)]
        first = await source.read("llm", targets)
        assert set(first) == {"a", "b"}  # c answers nothing: left out, not read as idle
        assert first["a"].contended_waste is None  # one scrape: no rate yet
        # 2 GB x s more in 0.5 s: 4 GB held while requests queued, of a 20 GB pool.
        a.set(contended_total=2.0)
        clock[0] += 0.5
        second = await source.read("llm", targets)
        assert second["a"].contended_waste == pytest.approx(0.2)
        assert second["b"].unfinished == 2 and second["b"].paused == 0
        assert second["a"].queue_depth == 3  # waiting for room, the parked left out
        assert second["b"].queue_depth == 1  # no reasons exported: the whole queue
        obs = observe(list(second.values()))
        assert obs.engines == 2 and obs.kv_usage == pytest.approx(0.6)
        assert obs.queue_depth == pytest.approx(2.0)
        await source.close()
    finally:
        a.stop()
        b.stop()


@pytest.mark.asyncio
async def test_prometheus_reads_the_same_numbers(prometheus: Prometheus, port: int) -> None:
    a = FakeEngine("127.0.0.5", port, "llm", "pa", kv=0.7, waiting=5, parked=4.0, pool_gb=10.0)
    a.set(contended_rate=1.0, sessions={"awaiting_client": 2, "generating": 1})
    # A short window: rate() divides by the whole window, so a half-empty one reads low.
    source = PrometheusSource(prometheus.url, rate_window="4s")
    try:
        targets = [Target("pa", a.ip, port), Target("gone", "127.0.0.6", port)]
        readings = await eventually(
            lambda: _contended(source, targets), "a full rate window of scrapes", 20
        )
        r = readings["pa"]
        assert set(readings) == {"pa"}
        assert r.kv_usage == pytest.approx(0.7) and r.queue_depth == 5
        assert r.contended_waste == pytest.approx(0.1, rel=0.25)  # rate(1 GB/s) / 10 GB
        assert r.paused == 2 and r.unfinished == 3
        # Another namespace's engine of the same name is not this pool's.
        assert await source.read("other", targets) == {}
    finally:
        await source.close()
        a.stop()
    down = PrometheusSource("http://127.0.0.1:9", timeout_s=1)
    with pytest.raises(MetricsError, match="did not answer"):
        await down.read("llm", targets)
    await down.close()


async def _contended(source: PrometheusSource, targets: list[Target]) -> Any:
    readings = await source.read("llm", targets)
    reading = readings.get("pa")
    full = reading is not None and (reading.contended_waste or 0.0) >= 0.075
    return readings if full else None


def test_the_command_line_matches_the_charts_operator_deployment() -> None:
    from interlude_operator.__main__ import parser

    # charts/interlude/templates/operator/operator.yaml passes exactly these.
    args = parser().parse_args(["--namespace=llm", "--log-level=INFO", "--metrics-port=8081"])
    assert args.namespace == ["llm"] and args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.log_level == "info" and args.metrics_port == 8081
    assert parser().parse_args(["-n", "llm"]).metrics_port == 0  # none unless asked
    assert parser().parse_args(["--all-namespaces", "--log-level=debug"]).all_namespaces
    with pytest.raises(SystemExit):
        parser().parse_args(["--log-level=info"])  # one of the two scopes is required


def test_the_operator_exports_what_a_pass_decided() -> None:
    from prometheus_client import REGISTRY

    from interlude_operator import telemetry
    from interlude_operator.decide import Observation
    from interlude_operator.spec import Targets

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"pool_namespace": "ns", "pool": "p", **labels})

    observed = Observation(kv_usage=0.9, queue_depth=2.0, engines=2)  # no contended waste read
    for _ in range(2):
        telemetry.record_pass(
            "ns", "p", desired=3, serving=2, ready=2, draining=1, direction="up",
            observed=observed, targets=Targets(),
        )  # fmt: skip
    telemetry.record_event("ns", "p", "Normal", "ScaledUp")
    assert value("interlude_operator_replicas", state="desired") == 3
    assert value("interlude_operator_replicas", state="draining") == 1
    assert value("interlude_operator_observed", metric="kv_usage") == 0.9
    assert value("interlude_operator_observed", metric="contended_waste") is None
    assert value("interlude_operator_target", metric="kv_usage") == 0.85
    assert value("interlude_operator_decisions_total", direction="up") == 2
    assert value("interlude_operator_events_total", type="Normal", reason="ScaledUp") == 1
    telemetry.forget("ns", "p")  # a deleted pool: its gauges go
    assert value("interlude_operator_replicas", state="desired") is None
