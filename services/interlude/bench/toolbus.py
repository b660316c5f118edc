"""`interlude bench toolbus`: the engine → tool → engine round trip over the tool bus.

What is timed is what a paused session waits for when its tool is instant (`calculator`): the
engine's `ServerTools.call` from before the submit (XADD, in the idempotent-submit script) to
the moment its result reader hands the result to the waiting session: the worker's read, the
done check, the tool, the post script, the engine's read. Everything runs as it does in a
deployment, on loopback: one Valkey, `workers` worker processes (`python -m interlude_tools`),
and the engine side in this process.

Three phases:

* **latency**: open-loop Poisson arrivals at `rate` calls/s for `duration_s`; percentiles over
  every call sent after the warm-up, failures included at the time they took (a timeout is
  not left out of the tail);
* **throughput**: `concurrency` callers each sending their next call as soon as the last is
  answered, for `saturate_s`: `max_calls_per_s` is the answered calls per second;
* **floor**: the bare two-hop stream round trip between two processes (`stream_echo`), with
  the same client and loop and no tool-bus logic: what no design on Redis Streams, in Python,
  on this machine, can go below.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from interlude import aio
from interlude.api.bus import ToolCall
from interlude.bench import stream_echo
from interlude.bench.toolbus_rig import WorkerProcs, fresh_server
from interlude.bus import EngineBus
from interlude.bus.streams import connect
from interlude.engine.tools import ServerTools

ENGINE = "bench-engine"


@dataclass(frozen=True)
class ToolbusSpec:
    """One benchmark run."""

    rates: tuple[float, ...] = (250.0, 500.0, 1000.0)  # calls/s, one latency phase each
    headline_rate: float = 1000.0  # the rate whose p50/p99 are the top-level numbers
    duration_s: float = 10.0  # of arrivals in the latency phase
    warmup_s: float = 1.0  # the first arrivals, not counted (connections, imports, JIT-free)
    workers: int = 4
    worker_concurrency: int = 16
    saturate_s: float = 5.0  # of the throughput phase
    concurrency: int = 128  # callers in the throughput phase
    deadline_s: float = 10.0  # each call's deadline: a call past it counts as failed
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rates or min(self.rates) <= 0 or self.headline_rate not in self.rates:
            raise ValueError("rates must be > 0 and include headline_rate")
        if min(self.duration_s, self.saturate_s, self.deadline_s) <= 0:
            raise ValueError("duration_s, saturate_s and deadline_s must be > 0")
        if self.warmup_s < 0 or self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be in [0, duration_s)")
        if min(self.workers, self.worker_concurrency, self.concurrency) < 1:
            raise ValueError("workers, worker_concurrency and concurrency must be >= 1")


@dataclass
class _Tally:
    latencies_ms: list[float]
    failed: int = 0


def _call(n: int, deadline_s: float) -> tuple[ToolCall, str]:
    now = time.time()
    call = ToolCall(
        f"b{n}", f"s{n}", ENGINE, "calculator", {"expression": f"{n}+1"}, now + deadline_s, {}, now
    )
    return call, str(n + 1)


async def _timed(tools: ServerTools, n: int, spec: ToolbusSpec, tally: _Tally | None) -> bool:
    call, want = _call(n, spec.deadline_s)
    started = time.perf_counter()
    result = await tools.call(call)
    took_ms = (time.perf_counter() - started) * 1000
    ok = result.ok and result.content == want
    if tally is not None:
        tally.latencies_ms.append(took_ms)
        tally.failed += not ok
    return ok


async def latency_phase(
    tools: ServerTools,
    spec: ToolbusSpec,
    rate: float,
    ids: count[int],
    say: Callable[[str], None],
) -> dict[str, Any]:
    rng = random.Random(spec.seed)
    tally = _Tally([])
    tasks: list[asyncio.Task[bool]] = []
    start = time.perf_counter()
    at = 0.0
    next_report = 1.0
    while at < spec.duration_s:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        counted = tally if at >= spec.warmup_s else None
        tasks.append(asyncio.create_task(_timed(tools, next(ids), spec, counted)))
        at += rng.expovariate(rate)
        if at >= next_report:
            say(f"{rate:g} calls/s: {at:.0f}/{spec.duration_s:g} s, {len(tasks)} calls sent")
            next_report += 1.0
    await asyncio.gather(*tasks)
    sent_s = time.perf_counter() - start
    lat = np.asarray(tally.latencies_ms)
    return {
        "rate_per_s": rate,
        "calls": len(lat),
        "failed": tally.failed,
        "offered_per_s": len(tasks) / spec.duration_s,
        "elapsed_s": sent_s,
        **{f"p{q:g}_ms": float(np.percentile(lat, q)) for q in (50, 90, 99, 99.9)},
        "max_ms": float(lat.max()),
        # The distribution at every half percentile (0, 0.5, ..., 100): the plot's CDF.
        "quantiles_ms": [round(float(v), 4) for v in np.percentile(lat, np.linspace(0, 100, 201))],
    }


async def throughput_phase(
    tools: ServerTools, spec: ToolbusSpec, ids: count[int], say: Callable[[str], None]
) -> dict[str, Any]:
    answered = failed = 0
    stop_at = time.perf_counter() + spec.saturate_s

    async def caller() -> None:
        nonlocal answered, failed
        while time.perf_counter() < stop_at:
            ok = await _timed(tools, next(ids), spec, None)
            answered += 1
            failed += not ok

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(spec.concurrency)))
    elapsed = time.perf_counter() - started
    say(f"throughput: {answered} calls in {elapsed:.1f} s")
    return {
        "max_calls_per_s": answered / elapsed,
        "answered": answered,
        "failed": failed,
        "callers": spec.concurrency,
        "elapsed_s": elapsed,
    }


async def _bench(
    url: str, spec: ToolbusSpec, say: Callable[[str], None], run_dir: Path
) -> dict[str, Any]:
    procs = WorkerProcs(url, run_dir / "workers", concurrency=spec.worker_concurrency)
    redis = connect(url)
    tools = ServerTools(EngineBus(redis, ENGINE))
    try:
        names = [f"bench-w{i}" for i in range(spec.workers)]
        for name in names:
            procs.start(name)
        await procs.wait_reading(redis, names)
        await tools.start()
        ids = count()
        say(f"{spec.workers} workers reading")
        latency = [await latency_phase(tools, spec, rate, ids, say) for rate in spec.rates]
        throughput = await throughput_phase(tools, spec, ids, say)
        procs.stop_all()  # the floor is timed on an otherwise idle machine
        floor = await floor_phase(url, run_dir, say)
    finally:
        await tools.close()
        await redis.aclose()
        procs.stop_all()
    return {"latency": latency, "throughput": throughput, "floor": floor}


async def floor_phase(url: str, run_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    log = (run_dir / "stream-echo.log").open("ab")
    echo = subprocess.Popen(
        [sys.executable, "-m", "interlude.bench.stream_echo", url], stdout=log, stderr=log
    )
    try:
        await asyncio.sleep(1.0)  # its imports; the first pings would time them otherwise
        floor = await stream_echo.floor(url)
    finally:
        echo.kill()
        echo.wait()
        log.close()
    say(f"floor: two stream hops p50 {floor['p50_ms']:.2f} ms")
    return floor


def run_toolbus_bench(
    spec: ToolbusSpec, run_dir: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Start a Valkey and the workers under `run_dir`, run both phases, stop everything.

    Returns the JSON the command writes: `p50_ms`, `p99_ms` (latency phase) and
    `max_calls_per_s` (throughput phase) at the top, the detail under `latency`/`throughput`.
    """
    server = fresh_server(run_dir)
    server.start()
    try:
        detail = aio.run(_bench(server.url, spec, say, run_dir))
    finally:
        server.stop()
    lat = next(row for row in detail["latency"] if row["rate_per_s"] == spec.headline_rate)
    thr = detail["throughput"]
    return {
        "p50_ms": lat["p50_ms"],
        "p99_ms": lat["p99_ms"],
        "rate_per_s": spec.headline_rate,
        "max_calls_per_s": thr["max_calls_per_s"],
        "floor_p50_ms": detail["floor"]["p50_ms"],
        "workers": spec.workers,
        "spec": {k: v for k, v in spec.__dict__.items()},
        **detail,
    }
