"""The tool worker's command line, run by `python -m interlude_tools`: one tool-executor worker
until SIGTERM or Ctrl-C.

The worker runs `calculator`, `retrieval` and `textworld`, plus what the tools file
(`--config`, `tools.example.toml`) and installed `interlude.tools` entry points declare; with
`--test-tools` (tests, benchmarks, `interlude up`; never in the chart) also the test tools
`echo`, `scripted`/`sleep` and `fail`. A tools file with a mistake, or a declared MCP server
that does not start, stops the worker at start with the reason (exit status 2).

SIGTERM (a pod being stopped) and SIGINT stop reading and drain the running calls; a call
still running after the drain timeout is left pending for another worker to reclaim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import typer
from redis.asyncio import Redis
from redis.exceptions import RedisError

from interlude import aio, telemetry
from interlude.api.tools import REFRESH_S
from interlude.bus.published import publish
from interlude.bus.streams import connect, redacted
from interlude.env import load_env
from interlude_tools import observe
from interlude_tools.config import ToolsConfig, ToolSet, load_config
from interlude_tools.context import ToolEnv
from interlude_tools.registry import Registry, Tool, default_registry
from interlude_tools.tools.standard import standard_tools
from interlude_tools.worker import Worker

app = typer.Typer(add_completion=False, help=__doc__)


def _default_consumer() -> str:
    # Pod names are unique and stable for a pod's life: a restarted container of the same pod
    # re-owns its pending calls; without Kubernetes, host and pid do the same job.
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@app.command()
def main(
    redis_url: str = typer.Option("redis://127.0.0.1:6379/0", envvar="INTERLUDE_REDIS_URL"),
    consumer: str = typer.Option("", help="consumer name in the group (default: pod or host-pid)"),
    concurrency: int = typer.Option(16, min=1, help="calls run at once"),
    claim_idle_ms: int = typer.Option(
        30_000, min=1, help="reclaim a dead worker's calls idle this long"
    ),
    drain_timeout_s: float = typer.Option(10.0, min=0.0, help="wait this long for calls on stop"),
    metrics_port: int = typer.Option(
        9100, min=0, max=65535, help="/health and /metrics on this port (0: none)"
    ),
    config: str = typer.Option(
        "", envvar="INTERLUDE_TOOLS_CONFIG", help="the tools file (TOML) to run beyond the standard"
    ),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR"),
    test_tools: bool = typer.Option(
        False,
        "--test-tools",
        help="also publish the test tools echo, scripted/sleep and fail (tests, benchmarks)",
    ),
) -> None:
    """Run one worker: take calls from the tool bus, run them, post the results."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        tools = load_config(Path(config)) if config else None
        env = ToolEnv(redis_url, base_dir=tools.path.parent if tools else Path())
    except ValueError as exc:
        typer.echo(f"interlude_tools: {exc}", err=True)
        raise typer.Exit(2) from None
    telemetry.setup_tracing("interlude-tools", load_env().otlp_endpoint)
    health = observe.Health()
    server = observe.serve_http(metrics_port, health) if metrics_port else None
    try:
        settings = _Settings(
            redis_url,
            consumer or _default_consumer(),
            concurrency,
            claim_idle_ms,
            drain_timeout_s,
            test_tools,
        )
        aio.run(_serve(settings, health, tools, env))
    except (ValueError, ConnectionError) as exc:  # a declared tool that cannot be set up
        typer.echo(f"interlude_tools: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        if server is not None:
            server.shutdown()


@dataclass(frozen=True)
class _Settings:
    """The worker's own settings, from the command line."""

    redis_url: str
    consumer: str
    concurrency: int
    claim_idle_ms: int
    drain_timeout_s: float
    test_tools: bool = False  # publish echo, scripted/sleep and fail too


async def _serve(
    settings: _Settings, health: observe.Health, config: ToolsConfig | None, env: ToolEnv
) -> None:
    standard = await asyncio.to_thread(standard_tools, env, config.retrieval if config else None)
    try:
        async with ToolSet(config, env) as declared:
            registry = default_registry(test_tools=settings.test_tools)
            for tool in [*standard, *declared.tools]:
                registry.register(tool)
            await _work(settings, health, registry)
    finally:
        await _close(standard)


async def _close(tools: list[Tool]) -> None:
    for tool in tools:
        close = getattr(tool, "aclose", None)
        if close is not None:
            await close()


async def _work(settings: _Settings, health: observe.Health, registry: Registry) -> None:
    # A connection per running call, plus the read and the reclaim; more wait for one.
    redis = connect(settings.redis_url, max_connections=settings.concurrency + 4)
    consumer = settings.consumer
    worker = Worker(
        redis,
        consumer,
        registry,
        concurrency=settings.concurrency,
        claim_idle_ms=settings.claim_idle_ms,
        drain_timeout_s=settings.drain_timeout_s,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    logger = logging.getLogger(__name__)
    logger.info(
        "worker %s on %s: tools %s, concurrency %d",
        consumer,
        redacted(settings.redis_url),
        ", ".join(registry.names()),
        settings.concurrency,
    )
    # The deployment's server-side tools are the ones its workers publish (bus/published.py).
    publisher = asyncio.create_task(_publish(redis, registry, consumer), name="publish-tools")
    watcher = asyncio.create_task(observe.watch_bus(redis, health), name="watch-bus")
    try:
        with observe.running(health):
            await worker.run()
    finally:
        for task in (publisher, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await redis.aclose()
    logger.info("worker %s stopped: %d results posted", consumer, worker.posted)


async def _publish(redis: Redis, registry: Registry, worker: str) -> None:
    log = logging.getLogger(__name__)
    while True:
        try:
            await publish(redis, registry.specs(), worker)
        except (RedisError, OSError) as exc:  # the bus is away: try again at the next refresh
            log.warning("could not publish the tools: %s", exc)
        await asyncio.sleep(REFRESH_S)
