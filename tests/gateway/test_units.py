"""The gateway's pure parts: API keys, engine choice, routing hints, discovery."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

import pytest

from interlude.api.names import call_tag, engine_tag, new_call_id
from interlude.api.openai import Unsupported
from interlude.gateway.auth import KeyFileError, KeyStore, create_key
from interlude.gateway.hint import Hint
from interlude.gateway.pool import (
    EnginePool,
    EngineState,
    NoEngine,
    StaticDiscovery,
    better,
)


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


def test_keys_are_sha256_digests_and_old_scrypt_lines_still_verify(tmp_path: Path) -> None:
    import base64
    import hashlib

    from interlude.gateway.auth import StoredKey

    key, line = create_key("alice")
    secret = key.split("-", 2)[2]
    assert len(base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))) * 8 >= 192
    assert line.split(":", 2)[2].startswith("sha256$")
    salt = b"0123456789abcdef"
    digest = hashlib.scrypt(b"s3cret", salt=salt, n=2**4, r=8, p=1, dklen=32)
    old = StoredKey("bob", "0badf00d", digest, algo="scrypt", n=2**4, r=8, p=1, salt=salt)
    path = tmp_path / "keys"
    path.write_text(line + "\n" + old.line() + "\n")
    store = KeyStore(path, recheck_s=0.0)
    assert store.verify(key) == "alice" and not store.slow(key)
    assert store.slow("il-0badf00d-s3cret")  # checked off the event loop, once
    assert store.verify("il-0badf00d-s3cret") == "bob"
    assert not store.slow("il-0badf00d-s3cret")
    assert store.verify("il-0badf00d-wrong") is None


def test_a_caller_leaving_during_a_slow_key_check_still_counts_its_failure(
    tmp_path: Path,
) -> None:
    """The chat route cancels a request whose client left; a wrong secret for an old scrypt
    entry, checked in a thread, must count against its address all the same, or a client
    hanging up after each guess would never be blocked."""
    import hashlib

    from interlude.gateway.auth import StoredKey
    from interlude.gateway.guard import FailedAttempts, Guard

    salt = b"0123456789abcdef"
    digest = hashlib.scrypt(b"s3cret", salt=salt, n=2**4, r=8, p=1, dklen=32)
    old = StoredKey("bob", "0badf00d", digest, algo="scrypt", n=2**4, r=8, p=1, salt=salt)
    (tmp_path / "keys").write_text(old.line() + "\n")
    guard = Guard(KeyStore(tmp_path / "keys", recheck_s=0.0), None, FailedAttempts(limit=1))
    wrong = {"authorization": "Bearer il-0badf00d-wrong"}

    async def scenario() -> float:
        admit = asyncio.ensure_future(guard.admit(wrong, "10.0.0.1"))
        await asyncio.sleep(0)  # its check is in the thread now
        admit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admit
        await asyncio.sleep(0.5)  # the thread's check ends
        return guard.failures.blocked("10.0.0.1")

    assert asyncio.run(scenario()) > 0


def test_a_key_carries_the_tools_it_may_run(tmp_path: Path) -> None:
    from starlette.requests import Request

    from interlude.gateway.auth import parse_tools
    from interlude.gateway.guard import Caller, Guard

    calc, calc_line = create_key("calc", frozenset({"calculator"}))
    anything, any_line = create_key("any", parse_tools("*"))
    default, default_line = create_key("default")
    assert calc_line.endswith(":tools=calculator") and any_line.endswith(":tools=*")
    path = tmp_path / "keys"
    path.write_text("\n".join((calc_line, any_line, default_line)) + "\n")
    guard = Guard(KeyStore(path), None, default_tools=frozenset())

    def caller(key: str) -> Caller:
        scope = {
            "type": "http",
            "headers": [(b"authorization", f"Bearer {key}".encode())],
            "client": ("10.0.0.1", 1),
        }
        return asyncio.run(guard(Request(scope)))

    assert caller(calc).tools == {"calculator"}
    assert caller(anything).tools is None  # every published tool
    assert caller(default).tools == frozenset()  # the deployment's default: none
    with pytest.raises(ValueError):
        parse_tools("calc ulator")


def test_a_key_carries_its_caps_and_keys_without_take_the_gateways(tmp_path: Path) -> None:
    from starlette.requests import Request

    from interlude.api.engine import CAPS_HEADER, Caps, caps_of
    from interlude.gateway.auth import StoredKey
    from interlude.gateway.guard import Caller, Guard

    capped, capped_line = create_key("capped", frozenset({"calculator"}), 2, 3)
    half, half_line = create_key("half", sessions=0)  # 0: no cap, whatever the default
    default, default_line = create_key("default")
    assert capped_line.endswith(":tools=calculator:sessions=2:tool_calls=3")
    parsed = StoredKey.parse(capped_line, "x:1")
    assert (parsed.tools, parsed.sessions, parsed.tool_calls) == ({"calculator"}, 2, 3)
    assert parsed.line() == capped_line
    # Options in any order; a repeated, unknown or negative one names the line and the option.
    digest = capped_line.split(":")[2]
    assert StoredKey.parse(f"a:0123abcd:{digest}:tool_calls=1:tools=", "x").tool_calls == 1
    for bad in ("sessions=-1", "sessions=x", "seats=1", "sessions=1:sessions=2"):
        with pytest.raises(KeyFileError, match=r"x:7: .*sessions=N.*" + bad.split("=")[0]):
            StoredKey.parse(f"a:0123abcd:{digest}:{bad}", "x:7")
    path = tmp_path / "keys"
    path.write_text("\n".join((capped_line, half_line, default_line)) + "\n")
    guard = Guard(KeyStore(path), None, default_caps=Caps(sessions=5, tool_calls=7))

    def caller(key: str) -> Caller:
        scope = {"type": "http", "headers": [(b"authorization", f"Bearer {key}".encode())]}
        return asyncio.run(guard(Request({**scope, "client": ("10.0.0.1", 1)})))

    assert caller(capped).caps == Caps(2, 3)
    assert caller(half).caps == Caps(0, 7)  # each cap on its own
    assert caller(default).caps == Caps(5, 7)
    # What the engine reads back: only from the gateway (its token), and only the known caps.
    header = {CAPS_HEADER: Caps(2, 3).header(), "x-interlude-gateway-token": "t"}
    assert header[CAPS_HEADER] == "sessions=2,tool_calls=3"
    assert caps_of(header, "t") == Caps(2, 3) and caps_of(header, "other") == Caps()
    assert caps_of({CAPS_HEADER: "sessions=1,newer=9"}, "") == Caps(sessions=1)
    with pytest.raises(ValueError):
        caps_of({CAPS_HEADER: "sessions=lots"}, "")


def test_benchmark_mode_comes_from_the_environment_and_is_strict() -> None:
    from interlude.env import load_env

    assert load_env({}).benchmark_mode is False
    assert load_env({"INTERLUDE_BENCHMARK_MODE": "1"}).benchmark_mode is True
    assert load_env({"INTERLUDE_BENCHMARK_MODE": "off"}).benchmark_mode is False
    with pytest.raises(ValueError, match="INTERLUDE_BENCHMARK_MODE"):
        load_env({"INTERLUDE_BENCHMARK_MODE": "sure"})


def test_failed_attempts_block_an_address_for_the_rest_of_the_window() -> None:
    from interlude.gateway.guard import FailedAttempts

    f = FailedAttempts(limit=3, window_s=10.0, max_addresses=2)
    for t in (0.0, 1.0, 2.0):
        assert f.blocked("a", now=t) == 0.0
        f.failed("a", now=t)
    assert f.blocked("a", now=3.0) == 7.0  # until the first failure ages out
    assert f.blocked("a", now=10.5) == 0.0
    f.failed("b", now=11.0)
    f.failed("c", now=11.0)  # over max_addresses: the least recent ("a") is forgotten
    assert "a" not in f._by_address and set(f._by_address) == {"b", "c"}


def test_a_malformed_keys_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("alice:12345678:plain$secret\n")
    with pytest.raises(KeyFileError, match=":1"):
        KeyStore(path)
    with pytest.raises(ValueError):
        create_key("has space")


def test_a_bad_edit_of_the_keys_file_keeps_the_last_good_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key, line = create_key("alice")
    path = tmp_path / "keys"
    path.write_text(line + "\n")
    store = KeyStore(path, recheck_s=0.0)
    later = time.time() + 5
    for broken in ("alice:12345678:plain$secret\n", None):  # a typo, then the file gone
        if broken is None:
            path.unlink()
        else:
            path.write_text(line + "\n" + broken)
            os.utime(path, (later, later))
        assert store.verify(key) == "alice"  # not a 500 on every request
    assert sum("stay in use" in r.message for r in caplog.records) == 2  # once per change
    path.write_text("")  # fixed: revoked
    os.utime(path, (later + 5, later + 5))
    assert store.verify(key) is None


def test_two_keys_with_one_id_are_refused(tmp_path: Path) -> None:
    _, line = create_key("alice")
    path = tmp_path / "keys"
    path.write_text(line + "\n" + line.replace("alice", "mallory", 1) + "\n")
    with pytest.raises(KeyFileError, match="appears twice"):
        KeyStore(path)


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


def test_an_engine_much_slower_per_token_gets_new_sessions_only_when_the_other_is_loaded() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(2))  # type: ignore[arg-type]
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
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(1))  # type: ignore[arg-type]
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
    busy.draining = True  # every engine draining: refuse (503), not hold up the drain
    with pytest.raises(NoEngine, match="draining") as err:
        pool.choose("tiny")
    assert err.value.known_model


def _role(url: str, role: str, **load: float) -> EngineState:
    e = _engine(url, **load)
    e.load["role"] = role
    return e


def test_prefill_engines_get_no_session_while_another_engine_serves_the_model() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
    # The prefill engine looks idlest: placement on load alone would pick it.
    prefill = _role("http://p", "prefill")
    decode = _role("http://d", "decode", kv_usage=0.9, waiting=6)
    pool.engines = {"http://p": prefill, "http://d": decode}
    assert all(pool.choose("tiny") is decode for _ in range(4))
    decode.ready = False  # no other engine: a prefill engine serves whole sessions, as any
    assert pool.choose("tiny") is prefill


def test_the_prefill_engine_is_the_one_of_two_with_fewer_prompt_tokens_queued() -> None:
    pool = EnginePool(StaticDiscovery(()), upstream=None, rng=random.Random(0))  # type: ignore[arg-type]
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
    pool = EnginePool(StaticDiscovery(()), upstream=None)  # type: ignore[arg-type]
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


def test_a_hung_rate_limit_store_costs_one_timeout_then_is_skipped(tmp_path: Path) -> None:
    """Valkey stopped (SIGSTOP: connected, silent, as in a partition): one check waits out the
    timeout, the next ones are skipped at once (the guard fails open), and once the pause is
    over and the server is back, requests are counted again."""
    import signal

    from interlude.gateway.ratelimit import RateLimiter, StoreAway
    from interlude.stack.valkey import Valkey

    server = Valkey(tmp_path / "valkey")
    url = server.start()
    assert server.proc is not None
    limiter = RateLimiter("100/minute", url, timeout_s=0.3, pause_s=0.5)

    async def scenario() -> None:
        assert (await limiter.check("k")).allowed
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreAway):
                await limiter.check("k")
            assert time.monotonic() - started < 1.0
            started = time.monotonic()
            with pytest.raises(StoreAway, match="not asked again"):
                await limiter.check("k")
            assert time.monotonic() - started < 0.05
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        await asyncio.sleep(0.6)
        assert (await limiter.check("k")).allowed

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
