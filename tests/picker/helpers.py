"""Helpers for the endpoint picker's tests: real gRPC, in front of stand-in engines.

Each stand-in engine is a real uvicorn server answering `GET /v1/load` with a load the test
sets (the picker's only input from an engine) and any POST with the headers it received.
`picker_at` starts a real `PickerServer` (grpc.aio, health service, engine pool polling those
servers) on a free port; tests speak the endpoint-picker protocol to it with Envoy's own
ext_proc messages (xds-protos), as a proxy does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn
from envoy.config.core.v3 import base_pb2  # type: ignore[import-untyped]
from envoy.extensions.filters.http.ext_proc.v3 import (  # type: ignore[import-untyped]
    processing_mode_pb2,
)
from envoy.service.ext_proc.v3 import (  # type: ignore[import-untyped]
    external_processor_pb2 as ep,
)
from envoy.service.ext_proc.v3 import (
    external_processor_pb2_grpc as ep_grpc,
)

from interlude.gateway.roster import StaticDiscovery
from interlude.picker.config import PickerConfig
from interlude.picker.server import PickerServer

Mode = processing_mode_pb2.ProcessingMode
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(app: Any, port: int) -> AsyncIterator[str]:
    """`app` on a real uvicorn server at `port`; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="critical", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@dataclass
class StandIn:
    """A stand-in engine: `load` is what its `/v1/load` answers (mutable), `url` its address."""

    engine_id: str
    load: dict[str, Any] = field(default_factory=dict)
    url: str = ""

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def app(self) -> Any:
        async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                return
            while (await receive()).get("more_body"):
                pass
            if scope["method"] == "GET":
                body = {"model": "tiny", "engine_id": self.engine_id, "ready": True, **self.load}
            else:
                body = {h.decode(): v.decode() for h, v in scope["headers"]}
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})

        return app


@contextlib.asynccontextmanager
async def stand_ins(free_port: Callable[[], int], *ids: str) -> AsyncIterator[list[StandIn]]:
    """Stand-in engines named `ids`, each serving on a free port."""
    engines = [StandIn(i) for i in ids]
    async with contextlib.AsyncExitStack() as stack:
        for e in engines:
            e.url = await stack.enter_async_context(serving(e.app(), free_port()))
        yield engines


@contextlib.asynccontextmanager
async def picker_at(
    engines: list[StandIn], **options: Any
) -> AsyncIterator[tuple[PickerServer, ep_grpc.ExternalProcessorStub]]:
    """A running picker in front of `engines` (no metrics port unless asked) and a stub."""
    options = {"auth": "none", "metrics_port": 0, "host": "127.0.0.1", "port": 0, **options}
    urls = tuple(e.url for e in engines)
    config = PickerConfig(engines=urls, health_interval_s=0.2, **options)
    server = PickerServer(config, StaticDiscovery(urls))
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, ep_grpc.ExternalProcessorStub(channel)
    finally:
        await channel.close()
        await server.stop(0.5)


async def poll(server: PickerServer) -> None:
    """Read the engines' loads now (the test changed one)."""
    await server.pool.poll()


def headers(end: bool = False, **named: str) -> Any:
    """Request headers; a request without a body is `GET /v1/models` unless `named` says."""
    method, path = ("GET", "/v1/models") if end else ("POST", "/v1/chat/completions")
    pairs = {":method": method, ":path": path, **named}
    return ep.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        ),
        end_of_stream=end,
    )


def request(
    body: bytes | None,
    mode: int = Mode.FULL_DUPLEX_STREAMED,
    chunks: int = 2,
    subset: list[str] | None = None,
    named: dict[str, str] | None = None,
) -> list[Any]:
    """A proxy's messages for one request: headers (with the protocol configuration and the
    subset hint, as Envoy sends them first), then the body in `chunks` pieces."""
    first = ep.ProcessingRequest(
        request_headers=headers(end=body is None, **(named or {})),
        protocol_config=ep.ProtocolConfiguration(request_body_mode=mode),
    )
    if subset is not None:
        first.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
            {"x-gateway-destination-endpoint-subset": subset}
        )
    messages = [first]
    if body is not None:
        size = max(1, -(-len(body) // chunks))
        pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        for i, piece in enumerate(pieces):
            messages.append(
                ep.ProcessingRequest(
                    request_body=ep.HttpBody(body=piece, end_of_stream=i == len(pieces) - 1)
                )
            )
    return messages


async def exchange(stub: Any, messages: list[Any], buffered: bool = False) -> list[Any]:
    """Send `messages` on one stream and collect every answer until the picker is done.
    `buffered`: as a proxy in BUFFERED mode, wait for the headers' answer before the body."""
    call = stub.Process()
    answers: list[Any] = []
    if buffered:
        await call.write(messages[0])
        answers.append(await call.read())
        messages = messages[1:]
    for m in messages:
        await call.write(m)
    await call.done_writing()
    while (answer := await call.read()) is not grpc.aio.EOF:
        answers.append(answer)
    return answers


def set_headers(answer: Any) -> dict[str, str]:
    """The headers an answer sets on the request (headers' or body's answer)."""
    part = answer.request_headers if answer.HasField("request_headers") else answer.request_body
    return {
        h.header.key: h.header.raw_value.decode() for h in part.response.header_mutation.set_headers
    }


def removed_headers(answer: Any) -> list[str]:
    part = answer.request_headers if answer.HasField("request_headers") else answer.request_body
    return list(part.response.header_mutation.remove_headers)


def destination(answer: Any) -> list[str]:
    """The endpoints an answer routes to, checked to be the same in header and metadata."""
    header = set_headers(answer)["x-gateway-destination-endpoint"]
    meta = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert meta["x-gateway-destination-endpoint"].string_value == header
    return header.split(",")


def chat(**extra: Any) -> bytes:
    return json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


@contextlib.asynccontextmanager
async def running(
    free_port: Callable[[], int], *ids: str, **options: Any
) -> AsyncIterator[tuple[list[StandIn], PickerServer, ep_grpc.ExternalProcessorStub]]:
    """Stand-in engines named `ids` and a picker in front of them (`picker_at`)."""
    async with (
        stand_ins(free_port, *ids) as engines,
        picker_at(engines, **options) as (
            server,
            stub,
        ),
    ):
        yield engines, server, stub
