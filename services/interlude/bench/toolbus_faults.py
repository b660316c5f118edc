"""`interlude bench toolbus-faults`: thousands of calls through the tool bus while workers are
SIGKILLed at random, the server restarts once (AOF on) and a poison call kills every worker
that runs it; every call must get exactly one result at the engine.

Everything is real and runs as a deployment would: a Valkey child process, worker processes
(`python -m interlude_tools`) that a supervisor restarts under the same name when they die (a
pod's container restart), and the engine side (`ServerTools`) in this process. Half the calls
are `calculator` (instant), half `sleep` (0.2 s), so kills land on running calls. The poison
call is a `crash` tool from an entry point only the drill's workers see (`crash_tool`).

What is counted: results per call (exactly one each), wrong answers, timeouts, duplicates the
engine dropped (a second post that got past the done key), calls stranded on killed workers
(pending when they died: the reclaim path's work), the dead-letter stream, and what is still
pending or queued at the end, or left on the engine's result stream (nothing may be).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from interlude import aio
from interlude.api.bus import (
    CALL_STREAM,
    DEAD_LETTER_STREAM,
    TOOL_GROUP,
    ToolCall,
    ToolResult,
    result_stream,
)
from interlude.bench import crash_tool
from interlude.bench.toolbus_rig import WorkerProcs, fresh_server, tool_site
from interlude.bus import EngineBus
from interlude.bus.streams import connect
from interlude.engine.tools import ServerTools
from interlude.stack.valkey import Valkey

ENGINE = "drill-engine"


@dataclass(frozen=True)
class DrillSpec:
    """One drill."""

    calls: int = 3000
    rate: float = 300.0  # calls/s submitted
    workers: int = 3
    kills: int = 6  # SIGKILLs of random workers, spread over the submission window
    server_restart: bool = True  # stop and start the server once, mid-window
    poison: bool = True
    sleep_share: float = 0.5  # calls that are `sleep` 0.2 s rather than `calculator`
    claim_idle_ms: int = 1000  # a dead worker's calls are taken over after this
    deadline_s: float = 120.0
    settle_s: float = 3.0  # how long the bus may take to go quiet before what is left counts
    seed: int = 0

    def __post_init__(self) -> None:
        if self.calls < 1 or self.rate <= 0 or self.workers < 1 or self.kills < 0:
            raise ValueError("calls, rate and workers must be positive, kills >= 0")
        if self.settle_s < 0:
            raise ValueError(f"settle_s must be >= 0, got {self.settle_s}")
        if not 0 <= self.sleep_share <= 1:
            raise ValueError("sleep_share must be in [0, 1]")


@dataclass
class DrillReport:
    """What happened; `problems()` lists what broke the exactly-once promise."""

    submitted: int = 0
    answered: int = 0  # calls with exactly one result handed to their session
    correct: int = 0  # ... and that result is the right answer
    wrong: int = 0
    timed_out: int = 0
    duplicates_dropped: int = 0  # second results the engine dropped by call id
    killed: int = 0  # SIGKILLs by the drill
    stranded: int = 0  # calls pending on a worker when it was killed
    restarts: int = 0  # worker processes started again (kills and poison deaths)
    server_restarts: int = 0
    poison_result: str = ""  # the error the poison call's session got
    dead_letters: int = 0
    pending_at_end: int = 0  # read by some worker, never acknowledged
    queued_at_end: int = 0  # still on the call stream
    results_left_at_end: int = 0  # still on the engine's result stream (read, never handed out)
    elapsed_s: float = 0.0
    results_per_call: dict[int, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out = []
        if self.answered != self.submitted:
            out.append(f"{self.submitted - self.answered} calls without exactly one result")
        if self.wrong or self.timed_out:
            out.append(f"{self.wrong} wrong answers, {self.timed_out} timeouts")
        if self.pending_at_end or self.queued_at_end:
            out.append(f"{self.pending_at_end} pending, {self.queued_at_end} queued at the end")
        if self.results_left_at_end:
            out.append(f"{self.results_left_at_end} results left on the engine's stream")
        if self.poison_result and "dead-letter" not in self.poison_result:
            out.append(f"the poison call ended as {self.poison_result!r}, not dead-lettered")
        return out


def _call(n: int, spec: DrillSpec, rng: random.Random) -> tuple[ToolCall, str]:
    now = time.time()
    args: dict[str, Any]
    if rng.random() < spec.sleep_share:
        tool, args, want = "sleep", {"delay_s": 0.2, "tokens": n % 5}, " x" * (n % 5)
    else:
        tool, args, want = "calculator", {"expression": f"{n}*3"}, str(n * 3)
    return ToolCall(f"d{n}", f"s{n}", ENGINE, tool, args, now + spec.deadline_s, {}, now), want


class _Drill:
    def __init__(self, spec: DrillSpec, server: Valkey, procs: WorkerProcs) -> None:
        self.spec, self.server, self.procs = spec, server, procs
        self.report = DrillReport()
        self.rng = random.Random(spec.seed)
        self.names = [f"drill-w{i}" for i in range(spec.workers)]
        self.down = False  # the server is restarting: the supervisor waits

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart dead workers under their names, as Kubernetes restarts a container."""
        while not stop.is_set():
            for name in self.names:
                if not self.down and name not in self.procs.running():
                    self.report.restarts += name in self.procs.procs  # not the first start
                    self.procs.start(name)
            await asyncio.sleep(0.3)

    async def kill_one(self, redis: Redis) -> None:
        running = self.procs.running()
        if not running:
            return
        name = self.rng.choice(running)
        self.procs.kill(name)
        self.report.killed += 1
        for attempt in range(5):  # the first command after a server restart may find it gone
            try:
                held = await redis.xpending_range(CALL_STREAM, TOOL_GROUP, "-", "+", 100_000, name)
            except RedisError:
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            self.report.stranded += len(held)
            return

    async def restart_server(self) -> None:
        self.down = True
        await asyncio.to_thread(self.server.stop)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(self.server.start)
        self.down = False
        self.report.server_restarts += 1

    async def chaos(self, redis: Redis, window_s: float) -> None:
        """The kills at random times in the window, and the server restart at 40 % of it."""
        events: list[tuple[float, str]] = [
            (self.rng.uniform(0.05, 0.95) * window_s, "kill") for _ in range(self.spec.kills)
        ]
        if self.spec.server_restart:
            events.append((0.4 * window_s, "restart"))
        start = time.monotonic()
        for at, what in sorted(events):
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            await (self.kill_one(redis) if what == "kill" else self.restart_server())

    async def run(self, redis: Redis, tools: ServerTools, say: Callable[[str], None]) -> None:
        spec = self.spec
        window_s = spec.calls / spec.rate
        stop = asyncio.Event()
        supervisor = asyncio.create_task(self.supervise(stop))
        await self.procs.wait_reading(redis, self.names)
        await tools.start()
        started = time.monotonic()
        chaos = asyncio.create_task(self.chaos(redis, window_s))
        pending: list[asyncio.Task[tuple[ToolResult, str]]] = []
        poison: asyncio.Task[ToolResult] | None = None
        if spec.poison:
            now = time.time()
            deadline = now + spec.deadline_s
            poisoned = ToolCall("poison", "s-poison", ENGINE, "crash", {}, deadline, {}, now)
            poison = asyncio.create_task(tools.call(poisoned))
        for n in range(spec.calls):
            await asyncio.sleep(max(0.0, started + n / spec.rate - time.monotonic()))
            call, want = _call(n, spec, self.rng)
            pending.append(asyncio.create_task(self._one(tools, call, want)))
            if n and n % int(spec.rate) == 0:
                say(f"{n}/{spec.calls} calls sent, {self.report.killed} workers killed")
        self.report.submitted = spec.calls
        await chaos
        outcomes = await asyncio.gather(*pending)
        say(f"all {spec.calls} calls answered; waiting for the poison call to be dead-lettered")
        if poison is not None:
            result = await poison
            self.report.poison_result = result.error
        stop.set()
        await supervisor
        self.report.elapsed_s = time.monotonic() - started
        self._tally(outcomes)

    async def _one(self, tools: ServerTools, call: ToolCall, want: str) -> tuple[ToolResult, str]:
        return await tools.call(call), want

    def _tally(self, outcomes: list[tuple[ToolResult, str]]) -> None:
        per_call = Counter(result.call_id for result, _ in outcomes)
        self.report.results_per_call = dict(Counter(per_call.values()))
        self.report.answered = sum(1 for n in per_call.values() if n == 1)
        for result, want in outcomes:
            if result.ok and result.content == want:
                self.report.correct += 1
            elif result.error.startswith("timeout"):
                self.report.timed_out += 1
            else:
                self.report.wrong += 1


async def _drill(
    spec: DrillSpec, server: Valkey, run_dir: Path, say: Callable[[str], None]
) -> DrillReport:
    procs = WorkerProcs(
        server.url,
        run_dir / "workers",
        claim_idle_ms=spec.claim_idle_ms,
        env={
            "PYTHONPATH": str(
                tool_site(run_dir / "drill-site", "interlude-drill", crash_tool.ENTRY_POINT)
            )
        },
        test_tools=True,  # half the calls are `sleep`
    )
    redis = connect(server.url, socket_timeout=5)
    bus = EngineBus(redis, ENGINE)
    tools = ServerTools(bus, poll_ms=100, max_backoff_s=0.5)
    drill = _Drill(spec, server, procs)
    try:
        await drill.run(redis, tools, say)
        report = drill.report
        await count_left_over(redis, report, spec.settle_s)
        report.duplicates_dropped = bus.duplicates
        report.dead_letters = int(await redis.xlen(DEAD_LETTER_STREAM))
        return report
    finally:
        await tools.close()
        await redis.aclose()
        procs.stop_all()


async def count_left_over(redis: Redis, report: DrillReport, settle_s: float) -> None:
    """Count what is left once the bus has had `settle_s` to go quiet.

    The engine hands a result to its session before it acknowledges and deletes it (so a
    failed ack loses nothing), so the last answer can wake the drill while its entry is still
    on the stream, for one round trip. Counting at once would report that entry as left over
    (it did, once, in CI); counting after a quiet spell reports only what stays.
    """
    until = time.monotonic() + settle_s
    while True:
        summary = await redis.xpending(CALL_STREAM, TOOL_GROUP)
        report.pending_at_end = int(summary["pending"])
        report.queued_at_end = int(await redis.xlen(CALL_STREAM))
        report.results_left_at_end = int(await redis.xlen(result_stream(ENGINE)))
        left = report.pending_at_end + report.queued_at_end + report.results_left_at_end
        if not left or time.monotonic() >= until:
            return
        await asyncio.sleep(0.05)


def run_drill(spec: DrillSpec, run_dir: Path, say: Callable[[str], None]) -> DrillReport:
    """Start a Valkey (AOF on) under `run_dir`, run the drill, stop everything."""
    server = fresh_server(run_dir)
    server.start()
    try:
        return aio.run(_drill(spec, server, run_dir, say))
    finally:
        server.stop()


def report_lines(report: DrillReport) -> list[str]:
    counts = asdict(report)
    per_call = counts.pop("results_per_call")
    lines = [f"{key}: {value}" for key, value in counts.items()]
    lines.append(f"results per call (results: calls): {per_call}")
    return lines


def as_json(report: DrillReport) -> dict[str, Any]:
    return {**asdict(report), "problems": report.problems()}
