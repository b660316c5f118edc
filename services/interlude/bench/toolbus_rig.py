"""Tool workers as real processes on a server of their own, for the tool-bus benchmark and the
fault drill: each worker is `python -m interlude_tools`, as a pod runs it, so a SIGKILL is a
crash and not a cancelled task."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from redis.asyncio import Redis

from interlude.api.bus import CALL_STREAM, TOOL_GROUP
from interlude.bus.streams import as_text, ensure_group
from interlude.stack.valkey import Valkey


def tool_site(root: Path, name: str, entry_point: str) -> Path:
    """A folder to put on a worker's PYTHONPATH: a throwaway distribution `name` whose only
    content is an `interlude.tools` entry point (a drill's own tool, never in a deployment)."""
    info = root / f"{name.replace('-', '_')}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[interlude.tools]\n{entry_point}\n")
    return root


def fresh_server(run_dir: Path) -> Valkey:
    """A server (not started) whose data folder under `run_dir` is emptied first: a run's call
    ids repeat across runs, and the bus's submitted and done keys would answer them from the
    last run (an idempotent submit queues nothing)."""
    data = run_dir / "valkey"
    shutil.rmtree(data, ignore_errors=True)
    return Valkey(data)


class WorkerProcs:
    """Worker processes by name.

    Side effects: child processes (their own process groups) and a log file each under
    `log_dir`. Invariant: after `stop_all()` none of them runs.
    """

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        *,
        concurrency: int = 16,
        claim_idle_ms: int = 30_000,
        log_level: str = "WARNING",
        config: Path | None = None,
        env: dict[str, str] | None = None,
        drain_timeout_s: float = 10.0,
        test_tools: bool = False,
    ) -> None:
        """`test_tools`: the workers also run echo, scripted/sleep and fail (`--test-tools`)."""
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.concurrency = concurrency
        self.claim_idle_ms = claim_idle_ms
        self.log_level = log_level
        self.config = config  # the tools file (`--config`)
        self.drain_timeout_s = drain_timeout_s
        self.test_tools = test_tools
        self.env = {**os.environ, **(env or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def argv(self, name: str) -> list[str]:
        return [
            sys.executable, "-m", "interlude_tools",
            "--redis-url", self.redis_url,
            "--consumer", name,
            "--concurrency", str(self.concurrency),
            "--claim-idle-ms", str(self.claim_idle_ms),
            "--metrics-port", "0",
            "--log-level", self.log_level,
            "--drain-timeout-s", str(self.drain_timeout_s),
            *(["--config", str(self.config)] if self.config else []),
            *(["--test-tools"] if self.test_tools else []),
        ]  # fmt: skip

    def start(self, name: str) -> None:
        """Start worker `name` (a name used before: a restarted pod re-owns its pending calls)."""
        if name in self.procs and self.procs[name].poll() is None:
            raise ValueError(f"worker {name!r} is already running")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                self.argv(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def terminate(self, name: str, timeout_s: float = 30.0) -> int:
        """SIGTERM worker `name` (a pod being stopped) and wait; returns its exit status."""
        proc = self.procs[name]
        proc.terminate()
        return proc.wait(timeout_s)

    def kill(self, name: str) -> None:
        """SIGKILL worker `name` and reap it: no drain, no acknowledgement, a crash."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def running(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def stop_all(self, timeout_s: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    async def wait_reading(
        self, redis: Redis, names: Iterable[str], timeout_s: float = 60.0
    ) -> None:
        """Until every worker in `names` has read the call stream once (it is a consumer of the
        group), or TimeoutError naming the missing ones and their logs."""
        await ensure_group(redis, CALL_STREAM, TOOL_GROUP)
        want = set(names)
        seen: set[str] = set()
        try:
            async with asyncio.timeout(timeout_s):
                while not want <= seen:
                    for name, proc in self.procs.items():
                        if name in want and proc.poll() is not None:
                            raise RuntimeError(
                                f"worker {name} exited: see {self.log_dir}/{name}.log"
                            )
                    consumers = await redis.xinfo_consumers(CALL_STREAM, TOOL_GROUP)
                    seen = {as_text(c["name"]) for c in consumers}
                    await asyncio.sleep(0.1)
        except TimeoutError:
            missing = ", ".join(sorted(want - seen))
            raise TimeoutError(
                f"workers {missing} did not start reading in {timeout_s} s"
            ) from None
