"""The endpoint-picker protocol, case by case, over real gRPC with Envoy's ext_proc messages:
a new conversation, a continuation, its engine gone, every engine draining (503), shedding
(429), the fallback list's order, the proxy's subset, buffered bodies, bad input, the tenant
headers the engines get, and the health service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from prometheus_client import REGISTRY

from interlude.api.engine import GATEWAY_TOKEN_HEADER, TENANT_HEADER, TOOLS_HEADER
from interlude.api.names import engine_tag, new_call_id

from .helpers import (
    Mode,
    chat,
    destination,
    exchange,
    poll,
    removed_headers,
    request,
    running,
    set_headers,
)

IDLE = {"kv_usage": 0.0, "waiting": 0, "max_num_seqs": 8}
BUSY = {"kv_usage": 0.9, "waiting": 6, "max_num_seqs": 8}


def continuation(engine_id: str) -> bytes:
    """A conversation ending with the result of a call the engine `engine_id` issued."""
    call_id = new_call_id(engine_tag(engine_id))
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "18 C"},
    ]
    return json.dumps({"model": "tiny", "messages": messages}).encode()


def picks(route: str) -> float:
    value = REGISTRY.get_sample_value("interlude:picker_picks_total", {"route": route})
    return value or 0.0


def refusal(answers: list[Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, error envelope, headers) of the one immediate answer in `answers`."""
    [answer] = [a for a in answers if a.HasField("immediate_response")]
    im = answer.immediate_response
    named = {h.header.key: h.header.raw_value.decode() for h in im.headers.set_headers}
    return im.status.code, json.loads(im.body)["error"], named


def test_a_new_conversation_goes_to_the_lighter_engine_and_its_body_comes_back_whole(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b", "c") as ([a, b, c], server, stub):
            a.load, b.load, c.load = BUSY, IDLE, {**IDLE, "kv_usage": 0.5}
            await poll(server)
            body = chat(max_tokens=3) * 1  # three chunks
            answers = await exchange(stub, request(body, chunks=3))
            assert [a_.WhichOneof("response") for a_ in answers] == [
                "request_headers",
                "request_body",
            ]
            route = destination(answers[0])
            # Two engines drawn of three: the lighter of them first, then the fallbacks in
            # the order of their scores (b is the lightest of all, so never last).
            assert route[0] in (b.address, c.address) and len(route) == 3
            assert sorted(route) == sorted(e.address for e in (a, b, c))
            rest = route[1:]
            scores = {e.address: i for i, e in enumerate((b, c, a))}
            assert rest == sorted(rest, key=scores.__getitem__)
            sent = answers[1].request_body.response.body_mutation.streamed_response
            assert sent.body == body and sent.end_of_stream
            assert set_headers(answers[0])["content-length"] == str(len(body))

    asyncio.run(main())


def test_the_fallback_list_is_ordered_by_score_and_capped(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b", "c", "d", fallbacks=2) as (engines, server, stub):
            kv = (0.8, 0.1, 0.5, 0.3)
            for e, k in zip(engines, kv, strict=True):
                e.load = {**IDLE, "kv_usage": k}
            await poll(server)
            for _ in range(6):
                route = destination((await exchange(stub, request(chat())))[0])
                assert len(route) == 3
                by = {e.address: k for e, k in zip(engines, kv, strict=True)}
                assert [by[x] for x in route[1:]] == sorted(by[x] for x in route[1:])
                # The fallbacks are the best of the engines not chosen.
                best_others = sorted(k for x, k in by.items() if x != route[0])[:2]
                assert [by[x] for x in route[1:]] == best_others
                await poll(server)  # forget the sessions just counted as sent

    asyncio.run(main())


def test_a_continuation_goes_to_the_engine_holding_its_session(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b") as ([a, b], server, stub):
            a.load, b.load = BUSY, IDLE
            await poll(server)
            before = picks("affinity")
            for _ in range(3):  # busy or not, the session's engine
                answers = await exchange(stub, request(continuation("a")))
                assert destination(answers[0]) == [a.address, b.address]
            assert picks("affinity") == before + 3

    asyncio.run(main())


def test_a_continuation_whose_engine_is_gone_is_placed_anew(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b") as ([a, b], server, stub):
            await poll(server)
            lost, balanced = picks("affinity_lost"), picks("balanced")
            answers = await exchange(stub, request(continuation("gone")))
            assert destination(answers[0])[0] in (a.address, b.address)
            assert picks("affinity_lost") == lost + 1 and picks("balanced") == balanced + 1

    asyncio.run(main())


def test_every_engine_draining_is_a_503_but_sessions_still_resume(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b") as ([_, b], server, stub):
            await poll(server)
            for e in server.pool.engines.values():
                e.draining = True
            status, error, named = refusal(await exchange(stub, request(chat())))
            assert status == 503 and "draining" in error["message"]
            assert error["type"] == "service_unavailable" and named["retry-after"] == "1"
            assert named["content-type"] == "application/json"
            # A paused session resumes where its KV is, draining or not.
            answers = await exchange(stub, request(continuation("b")))
            assert destination(answers[0])[0] == b.address

    asyncio.run(main())


def test_no_ready_engine_is_a_503_and_an_unknown_model_a_404(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a") as ([_a], server, stub):
            await poll(server)
            status, error, _ = refusal(await exchange(stub, request(chat(model="gpt-9"))))
            assert status == 404 and error["code"] == "model_not_found"
            for e in server.pool.engines.values():
                e.ready = False
            status, error, _ = refusal(await exchange(stub, request(chat())))
            assert status == 503 and error["type"] == "service_unavailable"

    asyncio.run(main())


def test_shedding_refuses_new_sessions_with_a_429_never_continuations(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b", shed_queue=2.0) as ([a, b], server, stub):
            a.load = b.load = {**IDLE, "waiting": 16}  # 2 waiting per slot on each
            await poll(server)
            status, error, named = refusal(await exchange(stub, request(chat())))
            assert status == 429 and error["code"] == "overloaded"
            assert named["retry-after"] == "1"
            answers = await exchange(stub, request(continuation("a")))
            assert destination(answers[0])[0] == a.address  # its KV is parked there
            b.load = {**IDLE, "waiting": 15}  # one engine under the limit: served there
            await poll(server)
            answers = await exchange(stub, request(chat()))
            assert destination(answers[0])[0] == b.address

    asyncio.run(main())


def test_only_endpoints_of_the_proxys_subset_are_chosen(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b", "c") as ([a, b, c], server, stub):
            a.load, b.load, c.load = IDLE, BUSY, BUSY
            await poll(server)
            for _ in range(4):
                msgs = request(chat(), subset=[b.address, c.address])
                route = destination((await exchange(stub, msgs))[0])
                assert set(route) == {b.address, c.address}
            # The session's engine outside the subset: placed within it.
            msgs = request(continuation("a"), subset=[c.address])
            assert destination((await exchange(stub, msgs))[0]) == [c.address]
            msgs = request(chat(), subset=["10.9.9.9:8100"])  # nothing of ours in it
            status, _, _ = refusal(await exchange(stub, msgs))
            assert status == 503

    asyncio.run(main())


def test_a_buffered_body_is_routed_in_the_bodys_answer(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with running(free_port, "a") as ([a], server, stub):
            await poll(server)
            msgs = request(chat(), mode=Mode.BUFFERED, chunks=1)
            answers = await exchange(stub, msgs, buffered=True)
            assert answers[0].HasField("request_headers")
            assert not answers[0].request_headers.response.header_mutation.set_headers
            assert answers[1].HasField("request_body")
            assert destination(answers[1]) == [a.address]
            # The proxy forwards its own copy of a buffered body: none comes back.
            assert not answers[1].request_body.response.HasField("body_mutation")

    asyncio.run(main())


def test_a_request_without_a_body_goes_to_any_engine(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b") as ([a, b], server, stub):
            await poll(server)
            answers = await exchange(stub, request(None))
            assert [x.WhichOneof("response") for x in answers] == ["request_headers"]
            assert destination(answers[0])[0] in (a.address, b.address)

    asyncio.run(main())


def test_bad_bodies_get_the_openai_error_envelope(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with running(free_port, "a", max_body_bytes=1000) as (_, server, stub):
            await poll(server)
            cases = {
                b"not json": (400, "body"),
                b'{"messages": []}': (400, "model"),
                chat(interlude_script=[{"tool": "x"}]): (400, "interlude_script"),
                chat(pad="x" * 2000): (413, None),
            }
            for body, (want, param) in cases.items():
                status, error, _ = refusal(await exchange(stub, request(body)))
                assert (status, error["param"]) == (want, param), error
                assert set(error) == {"message", "type", "param", "code"}

    asyncio.run(main())


def test_an_unusable_body_mode_is_refused_with_a_clear_error(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a") as (_, _server, stub):
            msgs = request(chat(), mode=Mode.STREAMED)
            status, error, _ = refusal(await exchange(stub, msgs[:1]))
            assert status == 500 and "FULL_DUPLEX_STREAMED" in error["message"]

    asyncio.run(main())


def test_the_engines_learn_the_tenant_from_the_key_and_nothing_from_the_client(
    free_port: Callable[[], int], tmp_path: Any
) -> None:
    from interlude.gateway.auth import create_key

    key, line = create_key("alice", frozenset({"calculator"}), 2, None)
    keys = tmp_path / "keys"
    keys.write_text(line + "\n")

    async def main() -> None:
        options = {"auth": "keys", "api_keys_file": str(keys), "gateway_token": "s3cret"}
        async with running(free_port, "a", **options) as (_, server, stub):
            await poll(server)
            forged = {
                "authorization": f"Bearer {key}",
                TENANT_HEADER: "mallory",
                TOOLS_HEADER: "*",
                "x-interlude-prefill": "http://evil:1",
            }
            answers = await exchange(stub, request(chat(), named=forged))
            named = set_headers(answers[0])
            assert named[TENANT_HEADER] == "alice" and named[TOOLS_HEADER] == "calculator"
            assert named["x-interlude-caps"] == "sessions=2"
            assert named[GATEWAY_TOKEN_HEADER] == "s3cret"
            assert removed_headers(answers[0]) == ["authorization", "x-interlude-prefill"]
            status, error, _ = refusal(
                await exchange(stub, request(chat(), named={"authorization": "Bearer il-0-nope"}))
            )
            assert status == 401 and error["code"] == "invalid_api_key"
            status, _, _ = refusal(await exchange(stub, request(chat())))
            assert status == 401

    asyncio.run(main())


def test_a_tenant_header_from_the_cluster_gateway_names_the_caller(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        options = {"auth": "header", "tenant_header": "x-client-id"}
        async with running(free_port, "a", **options) as (_, server, stub):
            await poll(server)
            answers = await exchange(stub, request(chat(), named={"x-client-id": "team-7"}))
            assert set_headers(answers[0])[TENANT_HEADER] == "team-7"
            assert TOOLS_HEADER in set_headers(answers[0])  # none by default
            status, _, _ = refusal(await exchange(stub, request(chat())))
            assert status == 401

    asyncio.run(main())


def test_health_serves_once_the_engines_were_read(free_port: Callable[[], int]) -> None:
    async def main() -> None:
        async with running(free_port, "a") as (_, server, _stub):
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
            health = health_pb2_grpc.HealthStub(channel)
            for service in (
                "",
                "liveness",
                "readiness",
                "envoy.service.ext_proc.v3.ExternalProcessor",
            ):
                got = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert got.status == health_pb2.HealthCheckResponse.SERVING, service
            await channel.close()

    asyncio.run(main())


def test_only_the_public_api_is_routed(free_port: Callable[[], int]) -> None:
    """Every routed request carries the gateway token: the engines' internal routes (session
    API, load, prefill, role) must not be reachable through the picker."""

    async def main() -> None:
        async with running(free_port, "a") as ([a], server, stub):
            await poll(server)
            inner = {
                ("PUT", "/v1/role"): 404,
                ("POST", "/v1/prefill"): 404,
                ("GET", "/v1/load"): 404,
                ("POST", "/v1/sessions"): 404,
                ("DELETE", "/v1/chat/completions"): 405,
            }
            for (method, path), want in inner.items():
                msgs = request(chat(), named={":method": method, ":path": path})
                status, error, _ = refusal(await exchange(stub, msgs))
                assert status == want, (method, path)
                assert error["type"] == "invalid_request_error"
            for method, path, body in (
                ("POST", "/v1/chat/completions?x=1", chat()),
                ("GET", "/v1/models/tiny", None),
            ):
                msgs = request(body, named={":method": method, ":path": path})
                assert destination((await exchange(stub, msgs))[0]) == [a.address]

    asyncio.run(main())


def test_a_failure_inside_the_picker_is_a_500_envelope_not_a_reset(
    free_port: Callable[[], int],
) -> None:
    async def main() -> None:
        async with running(free_port, "a", "b") as (_, server, stub):
            await poll(server)
            for e in server.pool.engines.values():
                e.load["max_num_seqs"] = "many"  # a load no score can be made of
            status, error, _ = refusal(await exchange(stub, request(chat())))
            assert status == 500 and error["type"] == "server_error"
            assert "internal error" in error["message"]

    asyncio.run(main())
