"""The image and tts tools, and the simulated endpoints with the paper's latencies."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from typer.testing import CliRunner

from interlude.api.bus import ToolCall, ToolResult
from interlude_tools import Registry
from interlude_tools.tools.model_endpoints import (
    ImageTool,
    ModelEndpointConfig,
    ModelTool,
    TtsTool,
    model_tools,
)
from interlude_tools.tools.simulated_models import (
    IMAGE,
    TTS,
    Latency,
    ServerThread,
    SimulatedModels,
    cli,
    start_simulated_models,
)

MakeCall = Callable[..., ToolCall]


@pytest.mark.parametrize(("kind", "latency"), [("image", IMAGE), ("tts", TTS)])
def test_the_simulated_latencies_have_the_papers_mean_and_variance(
    kind: str, latency: Latency
) -> None:
    n = 20_000
    models = SimulatedModels(seed=7)
    draws = [models.draw(kind) for _ in range(n)]
    assert draws[0] == SimulatedModels(seed=7).draw(kind) != SimulatedModels(seed=8).draw(kind)
    mean, var = statistics.fmean(draws), statistics.variance(draws)
    # Six standard errors: a correct sampler fails this about once in 500 million seeds.
    # The sample variance's standard error uses the gamma's excess kurtosis, 6/k.
    mean_error = math.sqrt(latency.var / n)
    var_error = latency.var * math.sqrt((2 + 6 / latency.shape) / n)
    assert abs(mean - latency.mean) < 6 * mean_error, (mean, latency.mean)
    assert abs(var - latency.var) < 6 * var_error, (var, latency.var)
    assert min(draws) > 0


def test_a_latency_is_checked_and_its_gamma_matches_its_moments() -> None:
    latency = Latency(20.0, 8.0)
    assert latency.shape * latency.scale == pytest.approx(20.0)
    assert latency.shape * latency.scale**2 == pytest.approx(8.0)
    for mean, var in [(0.0, 1.0), (1.0, -1.0), (math.inf, 1.0)]:
        with pytest.raises(ValueError):
            Latency(mean, var)
    with pytest.raises(ValueError, match="time_scale"):
        SimulatedModels(time_scale=-1)


@pytest.fixture(scope="module")
def simulated() -> Iterator[str]:
    server = start_simulated_models(seed=3, time_scale=0.001)
    try:
        yield server.url
    finally:
        server.stop()


def execute(tool: ModelTool, make_call: MakeCall, arguments: dict[str, Any]) -> ToolResult:
    async def scenario() -> ToolResult:
        try:
            return await Registry([tool]).execute(make_call("c1", tool.name, arguments))
        finally:
            await tool.aclose()

    return asyncio.run(scenario())


def test_image_and_tts_answer_in_one_line_through_the_simulated_endpoints(
    simulated: str, make_call: MakeCall
) -> None:
    image, tts = model_tools(
        ModelEndpointConfig(f"{simulated}/v1/image"), ModelEndpointConfig(f"{simulated}/v1/tts")
    )
    drawn = execute(image, make_call, {"prompt": "a lighthouse at dusk"})
    assert drawn.ok, drawn.error
    assert drawn.content.startswith("image generated: img-") and ", 512x512, " in drawn.content
    assert drawn.content.endswith(".png") and "\n" not in drawn.content
    spoken = execute(tts, make_call, {"text": "one two three four five six seven eight nine ten"})
    assert spoken.ok, spoken.error
    # Ten words at 2.5 words a second.
    assert spoken.content.startswith("audio generated: tts-") and ", 4.0 s, " in spoken.content


def test_arguments_are_checked_before_the_endpoint_is_asked(
    simulated: str, make_call: MakeCall
) -> None:
    tool = ImageTool.from_config(ModelEndpointConfig(f"{simulated}/v1/image", max_concurrency=2))
    assert (tool.name, tool.max_concurrency) == ("image", 2)
    result = execute(tool, make_call, {"prompt": ""})
    assert result.error_kind == "bad_arguments"
    result = execute(
        TtsTool.from_config(ModelEndpointConfig(f"{simulated}/v1/tts")), make_call, {"txt": "hi"}
    )
    assert result.error_kind == "bad_arguments" and "'txt' was unexpected" in result.error


def test_the_simulated_server_sleeps_the_scaled_latency_and_refuses_bad_bodies() -> None:
    with ServerThread(SimulatedModels(seed=5, time_scale=0.01).app()) as server:
        started = time.monotonic()
        answer = httpx.post(f"{server.url}/v1/tts", json={"text": "hello"}, timeout=5)
        elapsed = time.monotonic() - started
        assert answer.status_code == 200
        body = answer.json()
        assert body["duration_s"] == 0.5 and body["id"].startswith("tts-")
        assert elapsed >= body["latency_s"] * 0.01 > 0.05  # it did wait, scaled
        refused = httpx.post(f"{server.url}/v1/image", json={"text": "no prompt"}, timeout=5)
        assert refused.status_code == 400 and "'prompt'" in refused.json()["error"]
        assert httpx.post(f"{server.url}/v1/image", content=b"{", timeout=5).status_code == 400
        assert httpx.get(f"{server.url}/health", timeout=5).json()["ok"] is True


def test_a_malformed_answer_is_a_tool_error(make_call: MakeCall) -> None:
    async def partial(request: Request) -> Response:
        return JSONResponse({"id": "img-1", "width": 512, "url": "u"})  # no height

    async def text(request: Request) -> Response:
        return PlainTextResponse("not json")

    app = Starlette(
        routes=[
            Route("/partial", partial, methods=["POST"]),
            Route("/text", text, methods=["POST"]),
        ]
    )
    with ServerThread(app) as server:
        tool = ImageTool.from_config(ModelEndpointConfig(f"{server.url}/partial"))
        result = execute(tool, make_call, {"prompt": "x"})
        assert result.error_kind == "tool_error"
        assert "the image endpoint's answer has no usable 'height'" in result.error
        tool = ImageTool.from_config(ModelEndpointConfig(f"{server.url}/text"))
        result = execute(tool, make_call, {"prompt": "x"})
        assert "the image endpoint's answer is not JSON" in result.error


def test_the_endpoint_host_must_be_allowed() -> None:
    config = ModelEndpointConfig("http://image.models.svc:8000/v1/image")
    assert config.hosts == ("image.models.svc",)
    with pytest.raises(ValueError, match="not in allowed_hosts"):
        ModelEndpointConfig("http://image.models.svc/v1/image", allowed_hosts=("tts.models.svc",))
    with pytest.raises(ValueError, match="timeout_s"):
        ModelEndpointConfig("http://image.models.svc/v1/image", timeout_s=0)


def test_the_simulated_server_has_a_command_line() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and "--time-scale" in result.output
