"""`interlude bench chaos`: conversations through the gateway while the stack's parts die.

A real stack as `interlude up` starts it (the embedded Valkey with its append-only file, one
tools worker, N engines, the gateway), supervised from this process as `interlude up` does: a
part that dies is started again (`stack.supervise.Supervisor`). Conversations arrive at a
steady rate: half call client-side tools (each answer resumes the session parked on its
engine), half call a server-side tool the engines run through the bus (`tally_tool`, which
counts its runs and effects). During the arrivals, at evenly spaced moments: an engine is
SIGKILLed (its whole process group, mid-stream), Valkey is restarted twice (SIGKILL, losing at
most appendfsync's second, then SIGTERM), and the tools worker is SIGKILLed.

What holds is judged by `chaos_report`: every conversation finished as scripted or ended with
an error its client can retry; no server-side call acted twice; every engine back to an empty
KV cache with no session left once the conversations are over.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from interlude.bench import chaos_report, tally_tool
from interlude.bench.toolbus_rig import tool_site
from interlude.loadgen.client import Target
from interlude.loadgen.plan import TINY, conversations
from interlude.loadgen.replay import replay
from interlude.loadgen.text import TextMaker
from interlude.stack.procs import Part
from interlude.stack.supervise import SupervisorThread, supervisor_for
from interlude.stack.up import StackConfig, StackState, down, up

FAULTS = ("valkey-pause", "engine", "valkey-kill", "tools", "valkey-term")


@dataclass(frozen=True)
class ChaosSpec:
    """One drill: `conversations` arriving evenly over `duration_s`, the faults spread over the
    same window, and a `horizon_s` past which a conversation still running is lost."""

    conversations: int = 60
    duration_s: float = 60.0
    engines: int = 2
    faults: tuple[str, ...] = FAULTS
    horizon_s: float = 240.0
    # valkey-pause: Valkey SIGSTOPped this long (connected and silent, as in a partition).
    pause_s: float = 20.0
    # A session parked for a client that went away is freed this long after its pause.
    client_deadline_s: float = 20.0
    workload: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.conversations < 2 or self.duration_s <= 0 or self.engines < 1:
            raise ValueError("need conversations >= 2, duration_s > 0 and engines >= 1")
        if unknown := set(self.faults) - set(FAULTS):
            raise ValueError(f"unknown faults {sorted(unknown)}; choose from {list(FAULTS)}")
        if self.horizon_s <= self.duration_s:
            raise ValueError("horizon_s must be longer than duration_s")
        if "valkey-pause" in self.faults and not 0 < self.pause_s < self.duration_s:
            raise ValueError("pause_s must be > 0 and shorter than duration_s")

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds into the arrivals, fault), evenly spaced inside the arrival window, a
        pause taking its length before the next fault."""
        paused = self.pause_s * self.faults.count("valkey-pause")
        gap = (self.duration_s - paused) / (len(self.faults) + 1)
        out, t = [], gap
        for f in self.faults:
            out.append((t, f))
            t += gap + (self.pause_s if f == "valkey-pause" else 0.0)
        return out


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """The parts inherit this process's environment: set `values` while they start."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Stack:
    """The started stack and its supervisor, checking from a thread."""

    def __init__(self, state: StackState, parts: list[Part], say: Callable[[str], None]) -> None:
        self.state = state
        self.events: list[str] = []  # what the supervisor said (restarts, parts back)

        def note(line: str) -> None:
            self.events.append(line)
            say(line)

        self.supervisor = supervisor_for(state, parts, note)
        self._thread = SupervisorThread(self.supervisor)

    @property
    def gave_up(self) -> str:
        return self._thread.gave_up

    def part(self, name: str) -> Part:
        return next(w.part for w in self.supervisor.watched if w.part.spec.name == name)

    def stop(self) -> None:
        self._thread.stop()
        down(Path(self.state.run_dir))


def _inject(stack: _Stack, fault: str, k: int, engines: int) -> str:
    """Do `fault` (the k-th of its kind); what was done, for the report."""
    if fault == "engine":
        name = f"engine-{k % engines}"
        os.killpg(stack.part(name).pid, signal.SIGKILL)
        return f"SIGKILL {name} (its process group)"
    if fault == "tools":
        os.killpg(stack.part("tools").pid, signal.SIGKILL)
        return "SIGKILL the tools worker"
    valkey = stack.part("valkey").pid
    sig = signal.SIGKILL if fault == "valkey-kill" else signal.SIGTERM
    os.kill(valkey, sig)
    return f"{sig.name} Valkey (the supervisor starts it again from its AOF)"


async def _faults(stack: _Stack, spec: ChaosSpec, t0: float) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for at, fault in spec.schedule():
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        at_s = round(time.monotonic() - t0, 1)
        if fault == "valkey-pause":
            done.append({"at_s": at_s} | await _pause(stack, spec.pause_s))
            continue
        k = seen[fault] = seen.get(fault, -1) + 1
        what = await asyncio.to_thread(_inject, stack, fault, k, spec.engines)
        done.append({"at_s": at_s, "what": what})
    return done


async def _pause(stack: _Stack, pause_s: float) -> dict[str, Any]:
    """SIGSTOP Valkey for `pause_s`, asking every engine's /ready (2 s timeout) each second
    meanwhile: the ones ready before it must stay ready (`unready` counts the answers that
    were not 200)."""
    urls = stack.state.engines
    async with httpx.AsyncClient(timeout=2.0) as http:
        before = {u for u in urls if await _ready(http, u)}
        pid = stack.part("valkey").pid
        os.kill(pid, signal.SIGSTOP)
        unready, checks = dict.fromkeys(sorted(before), 0), 0
        try:
            end = time.monotonic() + pause_s
            while time.monotonic() < end:
                answers = await asyncio.gather(*(_ready(http, u) for u in sorted(before)))
                for u, ok in zip(sorted(before), answers, strict=True):
                    unready[u] += not ok
                checks += 1
                await asyncio.sleep(1.0)
        finally:
            os.kill(pid, signal.SIGCONT)
    what = f"SIGSTOP Valkey for {pause_s:.0f} s (then SIGCONT), engines' /ready asked {checks}x"
    return {"what": what, "unready": unready, "checks": checks}


async def _ready(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(url + "/ready")).status_code == 200
    except httpx.HTTPError:
        return False


async def _engines_at_rest(urls: list[str], wait_s: float) -> list[dict[str, Any]]:
    """Each engine's KV usage, sessions and resumes once nothing is held (or after `wait_s`)."""
    deadline = time.monotonic() + wait_s
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            loads = []
            for url in urls:
                try:
                    loads.append({"url": url} | (await http.get(url + "/v1/load")).json())
                except (httpx.HTTPError, ValueError) as exc:
                    loads.append({"url": url, "error": str(exc)})
            # A starting engine reports no usage at all: only a ready one's zero counts.
            idle = all(
                e.get("ready") and e.get("kv_usage") == 0 and not e.get("sessions") for e in loads
            )
            if idle or time.monotonic() > deadline:
                keep = ("url", "ready", "kv_usage", "sessions", "resumes", "paused", "error")
                return [{k: e[k] for k in keep if k in e} for e in loads]
            await asyncio.sleep(1.0)


async def _drive(stack: _Stack, spec: ChaosSpec, texts: TextMaker, drill: Path) -> dict[str, Any]:
    gateway = stack.state.gateway + "/v1"
    async with httpx.AsyncClient() as http:
        model = (await http.get(gateway + "/models")).json()["data"][0]["id"]
    rate = spec.conversations / spec.duration_s
    plan = conversations(spec.workload, rate, spec.duration_s, spec.seed, TINY, "chaos-")
    # Half and half, each half keeping its arrival times: client-side and server-side tools.
    halves = {"resume": plan[0::2], "server-tools": plan[1::2]}
    targets = {
        mode: Target(gateway, model, mode, server_tool="tally") for mode in halves
    }  # fmt: skip
    t0 = time.monotonic()
    faults, *runs = await asyncio.gather(
        _faults(stack, spec, t0),
        *(replay(targets[m], halves[m], texts, spec.horizon_s) for m in halves),
    )
    outcomes = []
    results = []
    for mode, (done, _span) in zip(halves, runs, strict=True):
        seen = {conv.conv_id for conv, _ in done}
        outcomes += [(mode, chaos_report.outcome(c, mode, r)) for c, r in done]
        outcomes += [(mode, "lost") for c in halves[mode] if c.conv_id not in seen]
        results += [r for _, r in done]
    # Long enough for a killed engine to be back (a vLLM start takes a minute on 2 cores).
    engines = await _engines_at_rest(stack.state.engines, spec.client_deadline_s + 120.0)
    runs_log = (drill / tally_tool.RUNS).read_text().splitlines()
    effects = [p.name for p in (drill / tally_tool.EFFECTS).iterdir()]
    tools = chaos_report.tool_runs(runs_log, effects)
    routes, errors = chaos_report.routes(results), chaos_report.errors(results)
    return chaos_report.summarize(outcomes, tools, engines, faults, routes, errors) | {
        "restarts": stack.supervisor.restarts,
        "supervisor": list(stack.events),
    }


def run_chaos(
    spec: ChaosSpec,
    run_dir: Path,
    texts: TextMaker,
    say: Callable[[str], None],
    config: StackConfig | None = None,
) -> dict[str, Any]:
    """Start a stack in `run_dir`, run the drill, stop the stack; the drill's result. `config`
    overrides the stack's settings (its run_dir, engines, deadline and mode are the drill's)."""
    drill = run_dir / "drill"
    (drill / tally_tool.EFFECTS).mkdir(parents=True, exist_ok=True)
    (drill / tally_tool.RUNS).touch()
    cfg = replace(
        config or StackConfig(run_dir=run_dir),
        run_dir=run_dir,
        engines=spec.engines,
        client_deadline_s=spec.client_deadline_s,
        benchmark_mode=True,  # scripted calls (`interlude_script`)
    )
    site = str(tool_site(run_dir / "site", "interlude-chaos", tally_tool.ENTRY_POINT))
    path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    parts: list[Part] = []
    # For the whole drill: a part the supervisor starts again inherits it too.
    with _environ({"PYTHONPATH": path, "INTERLUDE_DRILL_DIR": str(drill)}):
        say(f"starting the stack: Valkey, tools, {spec.engines} engines, gateway ({run_dir})")
        state = up(cfg, started=parts)
        stack = _Stack(state, parts, say)
        try:
            say(f"about {spec.conversations} conversations over {spec.duration_s:.0f} s; faults at "
                + ", ".join(f"{at:.0f} s {f}" for at, f in spec.schedule()))  # fmt: skip
            result = asyncio.run(_drive(stack, spec, texts, drill))
        finally:
            stack.stop()
    if stack.gave_up:
        result["failures"].append(f"the supervisor gave up: {stack.gave_up}")
    return result
