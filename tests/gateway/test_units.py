"""The gateway's pure parts: conversation keys, resume matching, stop strings, API keys."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

from interlude.api.openai import ChatCompletionRequest, Unsupported
from interlude.gateway.auth import KeyFileError, KeyStore, create_key
from interlude.gateway.conversation import (
    answers_exactly,
    conversation_key,
    engine_messages,
    tool_return,
)
from interlude.gateway.pool import EnginePool, EngineState, NoEngine, StaticDiscovery
from interlude.gateway.sessions import MemoryStore, PausedSession, RedisStore
from interlude.gateway.stops import StopScanner

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _req(messages: list[dict[str, object]], **kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **kw})


def test_text_parts_are_joined_and_developer_is_system() -> None:
    req = _req(
        [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    assert engine_messages(req) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]


def test_an_image_part_is_refused_naming_its_place() -> None:
    req = _req([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(Unsupported) as err:
        engine_messages(req)
    assert err.value.param == "messages[0].content[0].type"


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 2), ("logprobs", True), ("presence_penalty", 0.5), ("modalities", ["audio"])],
)
def test_what_cannot_be_served_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(Unsupported) as err:
        _req([{"role": "user", "content": "hi"}], **{field: value}).check_supported()
    assert err.value.param == field


def test_neutral_values_of_unsupported_features_pass() -> None:
    _req(
        [{"role": "user", "content": "hi"}], n=1, presence_penalty=0, logprobs=False
    ).check_supported()


def test_tool_return_finds_the_results_after_the_last_calls() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    ret = tool_return(msgs)
    assert ret is not None and ret.prefix_len == 2 and ret.results == (("c1", "5"),)
    assert answers_exactly(ret, ["c1"])
    assert not answers_exactly(ret, ["c1", "c2"])
    # A user turn after the results is no plain continuation.
    assert tool_return([*msgs, {"role": "user", "content": "and?"}]) is None
    assert tool_return(msgs[:1]) is None


def test_duplicate_results_do_not_answer_exactly() -> None:
    msgs = [
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c1", "content": "6"},
    ]
    ret = tool_return(msgs)
    assert ret is not None and not answers_exactly(ret, ["c1"])


def test_conversation_key_ignores_null_vs_empty_assistant_content_only() -> None:
    base = [{"role": "user", "content": "q"}]
    a = conversation_key(
        "m", [], [*base, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    )
    b = conversation_key(
        "m", [], [*base, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    )
    assert a == b
    edited = [{"role": "user", "content": "q!"}, {"role": "assistant", "content": None}]
    assert conversation_key("m", [], edited) != a
    assert (
        conversation_key(
            "other", [], [*base, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
        )
        != a
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert (
        conversation_key(
            "m", tools, [*base, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
        )
        != a
    )


@pytest.mark.parametrize(
    ("pieces", "stops", "shown", "stopped"),
    [
        (["hello wor", "ld END tail"], ["END"], "hello world ", True),
        (["ab", "c"], ["xyz"], "abc", False),  # held back, then flushed
        (["a<", "/b> after"], ["</b>"], "a", True),  # a stop split across pieces
        (["no stops"], [], "no stops", False),
    ],
)
def test_stop_scanner(pieces: list[str], stops: list[str], shown: str, stopped: bool) -> None:
    scanner = StopScanner(stops)
    out = "".join(scanner.feed(p) for p in pieces) + scanner.flush()
    assert out == shown
    assert scanner.stopped is stopped


def test_api_keys_verify_by_hash_and_rotate(tmp_path: Path) -> None:
    key, line = create_key("alice")
    other, _ = create_key("bob")
    assert key not in line  # only the hash is stored
    path = tmp_path / "keys"
    path.write_text("# team keys\n" + line + "\n")
    store = KeyStore(path, recheck_s=0.0)
    assert store.verify(key) == "alice"
    assert store.verify(key) == "alice"  # the remembered path
    assert store.verify(other) is None
    assert store.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.verify("not-a-key") is None
    time.sleep(0.01)
    path.write_text("")  # revoked
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert store.verify(key) is None


def test_a_malformed_keys_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("alice:12345678:plain$secret\n")
    with pytest.raises(KeyFileError, match=":1"):
        KeyStore(path)
    with pytest.raises(ValueError):
        create_key("has space")


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_session_store_takes_once_and_expires(kind: str, request: pytest.FixtureRequest) -> None:
    async def scenario() -> None:
        store = (
            MemoryStore()
            if kind == "memory"
            else RedisStore(request.getfixturevalue("redis_server"))
        )
        rec = PausedSession("http://e", "s1", "k1", ("c1",), "m", 10, 2, 0, time.time() + 60)
        await store.put(rec, alias="mine")
        assert await store.take_alias("mine") == rec
        assert await store.take("k1") is None  # taken once
        await store.put(rec)
        assert await store.take("k1") == rec  # by key, without an alias
        gone = PausedSession("http://e", "s2", "k2", ("c1",), "m", 1, 1, 0, time.time() + 0.05)
        await store.put(gone)
        await asyncio.sleep(0.2)
        assert await store.take("k2") is None  # expired
        await store.close()

    asyncio.run(scenario())


def _engine(url: str, model: str = "tiny", **load: float) -> EngineState:
    return EngineState(url, ready=True, load={"model": model, "max_num_seqs": 8, **load})


def test_power_of_two_choices_prefers_the_lighter_engine() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    busy, idle = _engine("http://a", kv_usage=0.9, waiting=4), _engine("http://b", kv_usage=0.1)
    pool.engines = {"http://a": busy, "http://b": idle}
    assert all(pool.choose("tiny") is idle for _ in range(3))
    # Sessions routed since the last read count as queued: a burst does not pile up on one.
    assert idle.routed == 3


def test_a_burst_alternates_between_equal_engines() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(1))  # type: ignore[arg-type]
    pool.engines = {u: _engine(u) for u in ("http://a", "http://b")}
    picks = [pool.choose("tiny").url for _ in range(6)]
    assert picks.count("http://a") == picks.count("http://b") == 3


def test_no_engine_for_a_model_tells_unknown_from_unavailable() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None)  # type: ignore[arg-type]
    pool.engines = {"http://a": _engine("http://a")}
    with pytest.raises(NoEngine) as err:
        pool.choose("gpt-9")
    assert not err.value.known_model
    pool.engines["http://a"].ready = False
    with pytest.raises(NoEngine) as err:
        pool.choose("tiny")
    assert err.value.known_model


def test_draining_engines_get_resumes_but_no_new_session() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    busy, idle = _engine("http://a", kv_usage=0.9, waiting=4), _engine("http://b", kv_usage=0.1)
    idle.draining = True
    pool.engines = {"http://a": busy, "http://b": idle}
    assert all(pool.choose("tiny") is busy for _ in range(4))
    assert pool.is_ready("http://b")  # a paused session on it still resumes there
    busy.draining = True  # every engine draining: serve rather than refuse
    assert pool.choose("tiny").url in ("http://a", "http://b")


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
