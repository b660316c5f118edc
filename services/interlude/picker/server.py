"""The picker's gRPC server: Envoy's `ext_proc` service and the gRPC health service.

Health (the endpoint-picker protocol's "Health Checking"): `liveness` serves while the process
does; `readiness`, `envoy.service.ext_proc.v3.ExternalProcessor` and the server as a whole ("")
serve once the engines have been read once, and stop when the picker is stopping, so that
proxies and the kubelet send it nothing more while open streams finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from http.server import ThreadingHTTPServer

import grpc
from envoy.service.ext_proc.v3 import (  # type: ignore[import-untyped]
    external_processor_pb2_grpc as ep_grpc,
)
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from interlude import telemetry
from interlude.api.engine import Caps
from interlude.gateway.auth import KeyStore, parse_tools
from interlude.gateway.guard import Guard
from interlude.gateway.refusals import Refusal
from interlude.gateway.roster import Discovery, EngineRoster, discover
from interlude.gateway.upstream import Upstream
from interlude.picker import metrics
from interlude.picker.config import PickerConfig
from interlude.picker.decide import Decider
from interlude.picker.protocol import Message, refused
from interlude.picker.stream import Exchange

log = logging.getLogger("interlude.picker")

EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
_READY_WITH = ("", "readiness", EXT_PROC)


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Envoy's ext_proc service: one `Exchange` per stream (per HTTP request)."""

    def __init__(self, decider: Decider) -> None:
        self.decider = decider

    async def Process(
        self, requests: AsyncIterator[Message], context: grpc.aio.ServicerContext[Message, Message]
    ) -> AsyncIterator[Message]:
        exchange = Exchange(self.decider)
        metrics.STREAMS.inc()
        try:
            async for message in requests:
                try:
                    answers = await exchange.on(message)
                except Exception as exc:  # a bug of ours: the client gets a 500, not a reset
                    ref = uuid.uuid4().hex[:12]
                    log.error("internal error %s", ref, exc_info=exc)
                    message_ = f"internal error {ref}; see the endpoint picker's log"
                    metrics.REFUSALS.labels("500").inc()
                    yield refused(Refusal(500, message_, "server_error"))
                    return
                for answer in answers:
                    yield answer
        finally:
            metrics.STREAMS.dec()


def make_decider(config: PickerConfig, pool: EngineRoster) -> Decider:
    keys = KeyStore(config.api_keys_file) if config.auth == "keys" else None
    caps = Caps(config.default_sessions, config.default_tool_calls)
    guard = Guard(keys, None, default_tools=parse_tools(config.tools_by_default), default_caps=caps)
    return Decider(pool, config, guard)


class PickerServer:
    """The gRPC server, its engine pool and its metrics port.

    Side effects: `start` binds `config.port` (0: any free port, then in `port`), starts
    polling the engines and serving `/metrics`; `stop` undoes all of it.
    """

    def __init__(self, config: PickerConfig, discovery: Discovery | None = None) -> None:
        self.config = config
        self.upstream = Upstream(config.connect_timeout_s, config.health_interval_s + 5.0)
        self.pool = EngineRoster(
            discovery or discover(config.engines, config.engine_service, config.engine_port),
            self.upstream,
            config.health_interval_s,
            config.health_failures,
        )
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessor(make_decider(config, self.pool)), self.server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{config.host}:{config.port}")
        self._tasks: list[asyncio.Task[None]] = []
        self._metrics: ThreadingHTTPServer | None = None

    async def start(self) -> None:
        await self._status("liveness", health_pb2.HealthCheckResponse.SERVING)
        for name in _READY_WITH:
            await self._status(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        await self.pool.start()
        if self.config.metrics_port:
            self._metrics = telemetry.serve_metrics(self.config.metrics_port, self.config.host)
        self._tasks.append(asyncio.create_task(self._observe(), name="picker-gauges"))
        await self.pool.wait_polled(self.config.health_interval_s + 1.0)
        for name in _READY_WITH:
            await self._status(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "endpoint picker on :%d (gRPC ext_proc), %d engine(s) ready",
            self.port,
            len(self.pool.ready()),
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Not ready at once; open streams get `grace_s` to finish."""
        for name in _READY_WITH:
            await self._status(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pool.close()
        await self.upstream.close()
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()

    async def _status(self, service: str, status: int) -> None:
        await self.health.set(service, status)

    async def _observe(self) -> None:
        """The engine gauges, fresh as each poll lands (the pool lives on this loop)."""
        while True:
            states = list(self.pool.engines.values())
            metrics.ENGINES.labels("true").set(sum(e.ready for e in states))
            metrics.ENGINES.labels("false").set(sum(not e.ready for e in states))
            await asyncio.sleep(self.config.health_interval_s)


async def serve(config: PickerConfig) -> None:
    """Run the picker until SIGTERM or SIGINT, then stop gracefully."""
    import signal

    picker = PickerServer(config)
    await picker.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping: no new streams; open ones get 5 s")
    await picker.stop()
