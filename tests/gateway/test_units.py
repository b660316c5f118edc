"""The gateway's pure parts: engine choice, routing hints, discovery (API keys: `test_keys.py`)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from interlude.api.names import call_tag, engine_tag, new_call_id
from interlude.api.openai import Unsupported
from interlude.gateway.hint import Hint
from interlude.gateway.roster import (
    EngineRoster,
    EngineState,
    NoEngine,
    StaticDiscovery,
    better,
)


def test_benchmark_mode_comes_from_the_environment_and_is_strict() -> None:
    from interlude.env import load_env

    assert load_env({}).benchmark_mode is False
    assert load_env({"INTERLUDE_BENCHMARK_MODE": "1"}).benchmark_mode is True
    assert load_env({"INTERLUDE_BENCHMARK_MODE": "off"}).benchmark_mode is False
    with pytest.raises(ValueError, match="INTERLUDE_BENCHMARK_MODE"):
        load_env({"INTERLUDE_BENCHMARK_MODE": "sure"})


def _engine(url: str, model: str = "tiny", **load: float) -> EngineState:
    return EngineState(url, ready=True, load={"model": model, "max_num_seqs": 8, **load})


def test_power_of_two_choices_prefers_the_lighter_engine() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    busy, idle = _engine("http://a", kv_usage=0.9, waiting=4), _engine("http://b", kv_usage=0.1)
    pool.engines = {"http://a": busy, "http://b": idle}
    assert all(pool.choose("tiny") is idle for _ in range(3))
    # Sessions routed since the last read count as queued: a burst does not pile up on one.
    assert idle.routed == 3


def test_a_burst_alternates_between_equal_engines() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(1))  # type: ignore[arg-type]
    pool.engines = {u: _engine(u) for u in ("http://a", "http://b")}
    picks = [pool.choose("tiny").url for _ in range(6)]
    assert picks.count("http://a") == picks.count("http://b") == 3


def test_an_engine_much_slower_per_token_gets_new_sessions_only_when_the_other_is_loaded() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(2))  # type: ignore[arg-type]
    # The 2-core stack with both engines on one core: one answered 10x slower, alike loads.
    slow, fast = _engine("http://a", itl_ms=35.0), _engine("http://b", itl_ms=3.5)
    pool.engines = {"http://a": slow, "http://b": fast}
    picks = [pool.choose("tiny").url for _ in range(8)]
    assert picks == ["http://b"] * 8  # 8 routed: (1 + 8/8) x 3.5 < 1 x 35
    fast.routed, fast.load["kv_usage"], fast.load["waiting"] = 0, 1.0, 80
    assert pool.choose("tiny") is slow  # (1 + 1 + 10) x 3.5 > 35: the slow one serves sooner


def test_alike_speeds_leave_placement_to_the_loads() -> None:
    """Under `SLOWER`, speed is noise between alike engines: a burst still alternates, and
    an engine that looks a little faster gets no more than its share."""
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(1))  # type: ignore[arg-type]
    pool.engines = {
        "http://a": _engine("http://a", itl_ms=3.4),
        "http://b": _engine("http://b", itl_ms=4.6),
    }
    picks = [pool.choose("tiny").url for _ in range(6)]
    assert picks.count("http://a") == picks.count("http://b") == 3
    # An engine that has not generated yet reports 0: not known, so not weighed.
    assert better(_engine("http://d", itl_ms=50.0), _engine("http://c", itl_ms=0.0)).url == (
        "http://d"
    )


def test_no_engine_for_a_model_tells_unknown_from_unavailable() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None)  # type: ignore[arg-type]
    pool.engines = {"http://a": _engine("http://a")}
    with pytest.raises(NoEngine) as err:
        pool.choose("gpt-9")
    assert not err.value.known_model
    pool.engines["http://a"].ready = False
    with pytest.raises(NoEngine) as err:
        pool.choose("tiny")
    assert err.value.known_model


def test_draining_engines_get_resumes_but_no_new_session() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    busy, idle = _engine("http://a", kv_usage=0.9, waiting=4), _engine("http://b", kv_usage=0.1)
    idle.draining = True
    pool.engines = {"http://a": busy, "http://b": idle}
    assert all(pool.choose("tiny") is busy for _ in range(4))
    assert pool.is_ready("http://b")  # a paused session on it still resumes there
    busy.draining = True  # every engine draining: refuse (503), not hold up the drain
    with pytest.raises(NoEngine, match="draining") as err:
        pool.choose("tiny")
    assert err.value.known_model


def _role(url: str, role: str, **load: float) -> EngineState:
    e = _engine(url, **load)
    e.load["role"] = role
    return e


def test_prefill_engines_get_no_session_while_another_engine_serves_the_model() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    # The prefill engine looks idlest: placement on load alone would pick it.
    prefill = _role("http://p", "prefill")
    decode = _role("http://d", "decode", kv_usage=0.9, waiting=6)
    pool.engines = {"http://p": prefill, "http://d": decode}
    assert all(pool.choose("tiny") is decode for _ in range(4))
    decode.ready = False  # no other engine: a prefill engine serves whole sessions, as any
    assert pool.choose("tiny") is prefill


def test_the_prefill_engine_is_the_one_of_two_with_fewer_prompt_tokens_queued() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    decode = _role("http://d", "decode")
    busy = _role("http://p1", "prefill", queued_prefill_tokens=5000)
    idle = _role("http://p2", "prefill", queued_prefill_tokens=100)
    pool.engines = {e.url: e for e in (decode, busy, idle)}
    assert pool.choose_prefill(decode, 1000) is idle
    # Prompts sent since the last read count: the next ones go to the other once this one's
    # backlog passes it, not all to the one that looked idlest at the read.
    picks = [pool.choose_prefill(decode, 1000) for _ in range(6)]
    assert picks[:4] == [idle] * 4 and busy in picks
    assert idle.prefill_backlog() == 100 + 1000 * picks.count(idle) + 1000
    # A mixed engine prefills its own sessions; without a ready prefill engine, so does decode.
    assert pool.choose_prefill(_role("http://m", "mixed"), 10) is None
    busy.ready = idle.ready = False
    assert pool.choose_prefill(decode, 10) is None


def test_endpointslice_discovery_lists_ready_endpoints_only() -> None:
    # No Kubernetes API server can run here: the client's list call is answered by a stand-in
    # holding the objects the API returns (kubernetes.client models, real classes).
    from kubernetes.client import (
        V1Endpoint as Endpoint,
    )
    from kubernetes.client import (
        V1EndpointConditions as Conditions,
    )
    from kubernetes.client import (
        V1EndpointSlice,
        V1EndpointSliceList,
        V1ObjectMeta,
    )

    from interlude.gateway.discovery import EndpointSliceDiscovery

    calls: list[tuple[str, str]] = []

    class Api:
        def list_namespaced_endpoint_slice(self, namespace: str, label_selector: str) -> object:
            calls.append((namespace, label_selector))
            eps = [
                Endpoint(addresses=["10.0.0.1"], conditions=Conditions(ready=True)),
                Endpoint(addresses=["10.0.0.2"], conditions=Conditions(ready=False)),
                Endpoint(addresses=["10.0.0.3"]),
            ]
            return V1EndpointSliceList(
                items=[V1EndpointSlice(address_type="IPv4", endpoints=eps, metadata=V1ObjectMeta())]
            )

    d = EndpointSliceDiscovery("llm", "engines", 8100, api=Api())
    urls = asyncio.run(d.urls())
    assert urls == ["http://10.0.0.1:8100", "http://10.0.0.3:8100"]
    assert calls == [("llm", "kubernetes.io/service-name=engines")]


def test_endpointslice_discovery_reports_the_pods_being_drained() -> None:
    from kubernetes.client import (
        V1Endpoint,
        V1EndpointSlice,
        V1EndpointSliceList,
        V1ObjectMeta,
        V1ObjectReference,
        V1Pod,
        V1PodList,
    )
    from kubernetes.client.exceptions import ApiException

    from interlude.gateway.discovery import EndpointSliceDiscovery

    class Slices:
        def list_namespaced_endpoint_slice(self, namespace: str, label_selector: str) -> object:
            eps = [
                V1Endpoint(addresses=[ip], target_ref=V1ObjectReference(kind="Pod", name=name))
                for ip, name in (("10.0.0.1", "engine-a"), ("10.0.0.2", "engine-b"))
            ]
            return V1EndpointSliceList(
                items=[V1EndpointSlice(address_type="IPv4", endpoints=eps, metadata=V1ObjectMeta())]
            )

    selectors: list[str] = []

    class Pods:
        denied = False

        def list_namespaced_pod(self, namespace: str, label_selector: str) -> object:
            if self.denied:
                raise ApiException(status=403, reason="Forbidden")
            selectors.append(label_selector)
            return V1PodList(items=[V1Pod(metadata=V1ObjectMeta(name="engine-b"))])

    pods = Pods()
    d = EndpointSliceDiscovery("llm", "engines", 8100, api=Slices(), pods_api=pods)
    assert asyncio.run(d.urls()) == ["http://10.0.0.1:8100", "http://10.0.0.2:8100"]
    assert d.draining() == {"http://10.0.0.2:8100"}
    assert selectors == ["interlude.dev/draining=true"]
    # Without the permission to list pods, nothing is known to drain; discovery goes on.
    pods.denied = True
    assert len(asyncio.run(d.urls())) == 2 and d.draining() == frozenset()


def _tool_turn(call_id: str) -> bytes:
    return json.dumps(
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function"}]},
                {"role": "tool", "tool_call_id": call_id, "content": "42"},
            ],
        }
    ).encode()


def test_a_continuation_names_the_engine_that_issued_its_calls() -> None:
    tag = engine_tag("engine-7")
    call_id = new_call_id(tag)
    assert call_id.startswith("call_") and len(call_id) == 29  # OpenAI's shape
    assert call_tag(call_id) == tag and call_tag("call_abc") is None
    assert Hint.of(_tool_turn(call_id)) == Hint("tiny", tag)
    assert Hint.of(_tool_turn("toolu_01")).tag is None  # an id we did not issue
    new = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert Hint.of(new.encode()) == Hint("tiny", None)


@pytest.mark.parametrize(
    ("raw", "param"),
    [(b"{not json", "body"), (b"[1]", "body"), (b'{"messages": []}', "model")],
)
def test_a_body_without_a_model_is_refused_by_the_gateway(raw: bytes, param: str) -> None:
    with pytest.raises(Unsupported) as err:
        Hint.of(raw)
    assert err.value.param == param


def test_a_script_passes_the_gateway_only_in_benchmark_mode() -> None:
    body = {"model": "tiny", "messages": [], "interlude_script": [{"tool": "t", "after_tokens": 1}]}
    raw = json.dumps(body).encode()
    with pytest.raises(Unsupported, match="benchmark mode is off") as err:
        Hint.of(raw)
    assert err.value.param == "interlude_script"
    assert Hint.of(raw, benchmark_mode=True) == Hint("tiny", None)
    assert Hint.of(json.dumps({**body, "interlude_script": None}).encode()).model == "tiny"


def test_by_tag_finds_the_ready_engine_draining_or_not() -> None:
    pool = EngineRoster(StaticDiscovery(()), upstream=None)  # type: ignore[arg-type]
    a, b = _engine("http://a"), _engine("http://b")
    a.load["engine_id"], b.load["engine_id"] = "engine-a", "engine-b"
    b.draining = True
    pool.engines = {"http://a": a, "http://b": b}
    assert pool.by_tag(engine_tag("engine-b"), "tiny") is b
    assert pool.by_tag(engine_tag("engine-b"), "other-model") is None
    b.ready = False
    assert pool.by_tag(engine_tag("engine-b"), "tiny") is None  # gone: recomputed elsewhere


def test_keys_run_no_server_side_tool_unless_the_deployment_says_so() -> None:
    from interlude.gateway.config import GatewayConfig

    with_keys = GatewayConfig(engines=("http://e:1",), api_keys_file="keys")
    assert with_keys.tools_by_default == ""  # a key made without --tools runs none
    local = GatewayConfig(engines=("http://e:1",), auth=False)
    assert local.tools_by_default == "*"  # one trusted machine, no keys
    chosen = GatewayConfig(engines=("http://e:1",), api_keys_file="keys", default_tools="a,b")
    assert chosen.tools_by_default == "a,b"
