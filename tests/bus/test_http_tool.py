"""HTTP tools against a real local server: bodies, queries, caps, the allow-list, failures.

Every call goes through `Registry.execute`, so what is checked is the result the model sees.
The server is on 127.0.0.1, which a tool reaches only with `allow_private_networks`: the
tools here opt in; what the default refuses is in test_http_tool_ssrf.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from interlude.api.bus import ToolCall, ToolResult
from interlude_tools import Registry
from interlude_tools.tools.http_tool import HttpTool, HttpToolConfig
from interlude_tools.tools.simulated_models import ServerThread

MakeCall = Callable[..., ToolCall]


@dataclass
class Seen:
    """What the test server was sent: the Host and Idempotency-Key headers of every request,
    and hits per path."""

    hosts: list[str] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)


def _app(seen: Seen) -> Starlette:
    async def record(request: Request) -> int:
        seen.hosts.append(request.headers["host"].split(":")[0])
        seen.keys.append(request.headers.get("idempotency-key"))
        seen.hits[request.url.path] = seen.hits.get(request.url.path, 0) + 1
        return seen.hits[request.url.path]

    async def echo(request: Request) -> Response:
        await record(request)
        body = await request.body()
        return JSONResponse(
            {
                "method": request.method,
                "json": (await request.json()) if body else None,
                "query": dict(request.query_params),
                "token": request.headers.get("x-token"),
            }
        )

    async def big(request: Request) -> Response:
        await record(request)
        return PlainTextResponse("é" + "a" * 40_000)

    async def slow(request: Request) -> Response:
        await record(request)
        await asyncio.sleep(float(request.query_params.get("s", "1")))
        return PlainTextResponse("late")

    async def flaky(request: Request) -> Response:
        # 503 on the first hit, 200 after: a backend briefly away.
        if await record(request) == 1:
            return PlainTextResponse("warming up", status_code=503)
        return PlainTextResponse("ok now")

    async def status(request: Request) -> Response:
        await record(request)
        code = int(request.path_params["code"])
        return PlainTextResponse(f"status {code}: no such city " + "x" * 500, status_code=code)

    async def redirect(request: Request) -> Response:
        await record(request)
        target = request.query_params["to"]
        return RedirectResponse(target, status_code=307)

    return Starlette(
        routes=[
            Route("/echo", echo, methods=["GET", "POST"]),
            Route("/big", big, methods=["POST"]),
            Route("/slow", slow, methods=["POST"]),
            Route("/flaky", flaky, methods=["POST"]),
            Route("/status/{code}", status, methods=["POST"]),
            Route("/redirect", redirect, methods=["POST"]),
        ]
    )


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Seen]]:
    seen = Seen()
    with ServerThread(_app(seen)) as thread:
        yield thread.url, seen


@pytest.fixture
def seen(server: tuple[str, Seen]) -> Seen:
    _, record = server
    record.hosts.clear()
    record.keys.clear()
    record.hits.clear()
    return record


@pytest.fixture
def config(server: tuple[str, Seen]) -> Callable[..., HttpToolConfig]:
    """`config(path, **fields)`: a tool on the test server, 127.0.0.1 the only host allowed
    (on purpose: `allow_private_networks`)."""
    url, _ = server

    def make(path: str, **fields: Any) -> HttpToolConfig:
        base = HttpToolConfig(
            name="weather",
            description="the weather in a city",
            url=f"{url}{path}",
            allowed_hosts=("127.0.0.1",),
            parameters={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
            timeout_s=2.0,
            allow_private_networks=True,
        )
        return replace(base, **fields)

    return make


def execute(
    config: HttpToolConfig, make_call: MakeCall, arguments: dict[str, Any], ttl: float = 5.0
) -> ToolResult:
    async def scenario() -> ToolResult:
        tool = HttpTool.from_config(config)
        try:
            return await Registry([tool]).execute(make_call("c1", tool.name, arguments, ttl=ttl))
        finally:
            await tool.aclose()

    return asyncio.run(scenario())


def test_post_sends_the_arguments_as_json_with_the_static_headers(
    config: Callable[..., HttpToolConfig], make_call: MakeCall
) -> None:
    result = execute(config("/echo", headers={"X-Token": "s3cret"}), make_call, {"city": "Oslo"})
    assert result.ok, result.error
    assert '"json":{"city":"Oslo"}' in result.content
    assert '"token":"s3cret"' in result.content and '"method":"POST"' in result.content


def test_get_sends_the_arguments_as_the_query(
    config: Callable[..., HttpToolConfig], make_call: MakeCall
) -> None:
    arguments = {"city": "Oslo", "days": 3, "metric": True}
    result = execute(config("/echo", method="GET"), make_call, arguments)
    assert result.ok, result.error
    assert '"query":{"city":"Oslo","days":"3","metric":"true"}' in result.content
    assert '"json":null' in result.content


def test_arguments_that_do_not_fit_the_schema_are_not_sent(
    config: Callable[..., HttpToolConfig], make_call: MakeCall, seen: Seen
) -> None:
    result = execute(config("/echo"), make_call, {"town": "Oslo"})
    assert result.error_kind == "bad_arguments" and "'city' is a required property" in result.error
    assert seen.hits == {}


def test_a_long_answer_is_cut_and_says_so(
    config: Callable[..., HttpToolConfig], make_call: MakeCall
) -> None:
    result = execute(config("/big", max_response_bytes=1001), make_call, {"city": "Oslo"})
    assert result.ok
    body, note = result.content.split("\n")
    # 1001 bytes: "é" is two of them, then 999 "a".
    assert body == "é" + "a" * 999
    assert note == "[response cut: only its first 1001 bytes are shown]"


def test_a_host_off_the_list_is_refused_when_configured() -> None:
    with pytest.raises(ValueError, match=r"'evil\.example' is not in allowed_hosts"):
        HttpToolConfig("t", "d", "https://evil.example/api", allowed_hosts=("api.example",))
    with pytest.raises(ValueError, match="http:// or https://"):
        HttpToolConfig("t", "d", "file:///etc/passwd", allowed_hosts=("localhost",))
    with pytest.raises(ValueError, match="method"):
        HttpToolConfig(
            "t", "d", "https://api.example/", allowed_hosts=("api.example",), method="PUT"
        )
    with pytest.raises(ValueError, match="must match"):
        HttpToolConfig("no spaces", "d", "https://api.example/", allowed_hosts=("api.example",))
    with pytest.raises(TypeError, match="from_config"):
        HttpTool(HttpToolConfig("t", "d", "https://api.example/", allowed_hosts=("api.example",)))


def test_a_redirect_to_a_host_off_the_list_is_refused_before_it_is_sent(
    server: tuple[str, Seen],
    config: Callable[..., HttpToolConfig],
    make_call: MakeCall,
    seen: Seen,
) -> None:
    url, _ = server
    # Same server, other name: "localhost" is not on the list, so it must never be asked.
    elsewhere = url.replace("127.0.0.1", "localhost") + "/echo"
    result = execute(config(f"/redirect?to={elsewhere}"), make_call, {"city": "Oslo"})
    assert result.error_kind == "tool_error"
    assert "refused to send a request to host 'localhost'" in result.error
    assert seen.hosts == ["127.0.0.1"] and "/echo" not in seen.hits
    # A redirect within the list is followed.
    followed = execute(config(f"/redirect?to={url}/echo"), make_call, {"city": "Oslo"})
    assert followed.ok and '"city":"Oslo"' in followed.content


def test_a_5xx_is_retried_with_the_calls_id_as_its_idempotency_key(
    config: Callable[..., HttpToolConfig], make_call: MakeCall, seen: Seen
) -> None:
    result = execute(config("/flaky"), make_call, {"city": "Oslo"})
    assert result.ok and result.content == "ok now"
    assert seen.hits["/flaky"] == 2
    # `execute` sends the call "c1": both attempts carry its id, so the endpoint can tell
    # the retry is the same call.
    assert seen.keys == ["c1", "c1"]


@pytest.mark.parametrize("code", [503, 429])
def test_a_lasting_5xx_or_429_fails_after_the_retries(
    code: int, config: Callable[..., HttpToolConfig], make_call: MakeCall, seen: Seen
) -> None:
    result = execute(config(f"/status/{code}", retries=1), make_call, {"city": "Oslo"})
    assert result.error_kind == "tool_error"
    assert f"HTTP {code} from 127.0.0.1: status {code}" in result.error
    assert "(after 2 attempts)" in result.error and seen.hits[f"/status/{code}"] == 2


def test_a_4xx_is_not_retried_and_shows_the_start_of_the_body(
    config: Callable[..., HttpToolConfig], make_call: MakeCall, seen: Seen
) -> None:
    result = execute(config("/status/404"), make_call, {"city": "Atlantis"})
    assert result.error_kind == "tool_error"
    assert "HTTP 404 from 127.0.0.1: status 404: no such city" in result.error
    assert len(result.error) < 400  # an excerpt, not the whole body
    assert seen.hits["/status/404"] == 1


def test_the_tools_own_timeout_is_retried_then_reported(
    config: Callable[..., HttpToolConfig], make_call: MakeCall, seen: Seen
) -> None:
    tool = config("/slow?s=1", timeout_s=0.2, retries=1)
    result = execute(tool, make_call, {"city": "Oslo"})
    assert result.error_kind == "tool_error"
    assert "did not answer within 0.2 s (after 2 attempts)" in result.error
    assert seen.hits["/slow"] == 2


def test_the_calls_deadline_is_a_timeout_result(
    config: Callable[..., HttpToolConfig], make_call: MakeCall
) -> None:
    result = execute(config("/slow?s=1"), make_call, {"city": "Oslo"}, ttl=0.3)
    assert result.error_kind == "timeout", result.error


def test_no_server_listening_is_retried_then_reported(
    config: Callable[..., HttpToolConfig], make_call: MakeCall
) -> None:
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tool = replace(config("/"), url=f"http://127.0.0.1:{port}/", retries=1)
    result = execute(tool, make_call, {"city": "Oslo"})
    assert result.error_kind == "tool_error"
    assert "127.0.0.1 unreachable: ConnectError" in result.error
    assert "(after 2 attempts)" in result.error
