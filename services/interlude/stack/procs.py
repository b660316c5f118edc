"""Supervised child processes for the one-machine stack.

Each part runs in its own session (process group), logs to its own file, and is stopped by
signalling the whole group: vLLM's engine-core children go with their engine. A part is ready
when its `ready` check passes; a part that exits while the stack waits for it fails the start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from interlude.ui import term_requested


class StartError(RuntimeError):
    """A part died or did not become ready; the message names it and holds its log's tail."""


@dataclass(frozen=True)
class PartSpec:
    """One process of the stack: how to start it, how to know it is ready, and (`failed`, for
    a process that stays up to report its own failure, as an engine does) why it never will be.
    """

    name: str
    argv: tuple[str, ...]
    log: Path
    ready: Callable[[], bool] = field(compare=False)
    env: Mapping[str, str] = field(default_factory=dict, compare=False)
    failed: Callable[[], str | None] = field(default=lambda: None, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.argv:
            raise ValueError(f"a part needs a name and a command, got {self.name!r} {self.argv!r}")


@dataclass
class Part:
    """A started part (mutable: `ready_at` is set once its check passes)."""

    spec: PartSpec
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    ready_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness check: `url` answers 200."""
    import httpx  # the `up` extras' client: `interlude down` runs on the base install

    def check() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def http_failed(url: str) -> Callable[[], str | None]:
    """A failure check: `url` answers 503; the reason is the OpenAI error envelope's message."""
    import httpx

    def check() -> str | None:
        try:
            r = httpx.get(url, timeout=2)
        except httpx.HTTPError:
            return None  # not listening yet, or busy: not a verdict
        if r.status_code != 503:
            return None
        try:
            return str(r.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return r.text[:500]

    return check


def spawn(spec: PartSpec) -> Part:
    spec.log.parent.mkdir(parents=True, exist_ok=True)
    with spec.log.open("ab") as out:
        proc = subprocess.Popen(
            list(spec.argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **spec.env},
            start_new_session=True,  # its own group: stopping it stops its children too
        )
    return Part(spec, proc)


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log (engine logs grow large: read only the last bytes)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4 * chars))
            return f.read().decode(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_ready(
    parts: Sequence[Part],
    timeout_s: float,
    tick: Callable[[Sequence[Part]], None] | None = None,
    poll_s: float = 0.5,
) -> None:
    """Wait until every part is ready; StartError if one exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if term_requested():  # a SIGTERM whose SystemExit a finalizer swallowed
            raise SystemExit(143)
        for p in parts:
            code = p.proc.poll()
            if code is not None:
                raise StartError(
                    f"{p.spec.name} exited with code {code} while starting; its log "
                    f"({p.spec.log}) ends with:\n{tail(p.spec.log)}"
                )
            if p.ready_at is None and (why := p.spec.failed()) is not None:
                raise StartError(
                    f"{p.spec.name} failed while starting ({why}); its log ({p.spec.log}) "
                    f"ends with:\n{tail(p.spec.log)}"
                )
            if p.ready_at is None and p.spec.ready():
                p.ready_at = time.monotonic()
        if tick is not None:
            tick(parts)
        if all(p.ready_at is not None for p in parts):
            return
        if time.monotonic() > deadline:
            late = [f"{p.spec.name} (log: {p.spec.log})" for p in parts if p.ready_at is None]
            raise StartError(f"not ready after {timeout_s:.0f} s: {', '.join(late)}")
        time.sleep(poll_s)


def start_all(
    waves: Sequence[tuple[Sequence[PartSpec], float]],
    tick: Callable[[Sequence[Part]], None] | None = None,
    on_spawn: Callable[[Part], None] | None = None,
) -> list[Part]:
    """Start `waves` in order: each wave's parts together, the next once all so far are ready
    (each wave has its own timeout in seconds).

    Side effects: the parts' processes and log files; `on_spawn` sees each part as soon as it
    exists, so a state file can name it before it is ready. Invariant: if this raises (a part
    exits, the time runs out, Ctrl-C), no part it started is left running.
    """
    parts: list[Part] = []
    started: list[list[Part]] = []
    try:
        for specs, timeout_s in waves:
            started.append([])
            for spec in specs:
                parts.append(spawn(spec))
                started[-1].append(parts[-1])
                if on_spawn is not None:
                    on_spawn(parts[-1])
            wait_ready(parts, timeout_s, tick)
    except BaseException:
        # Wave by wave, the last first (a wave needs the ones before it, Valkey above all), a
        # wave's parts at once: an engine slow to stop while vLLM loads delays no other part.
        # A part that never got ready holds no accepted work: half the usual grace.
        for wave in reversed(started):
            stop_groups([(p.pid, None) for p in wave], timeout_s=10.0)
        raise
    return parts


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may itself hold spaces and ')': split after the last one.
    return stat.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None where /proc does not say.

    Recorded in the state file: a later process that reuses the id has another start time, so
    `down` never signals a stranger's process group.
    """
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, started: int | None = None) -> bool:
    """Whether `pid` runs (and, given `started`, is still the process that started then).

    A zombie does not run: where init does not reap orphans (as in some containers), an exited
    part of an earlier stack stays a zombie, and must not count as a stack still running.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _proc_stat(pid)
    if fields is None:  # no /proc: the signal's answer is all there is
        return True
    return fields[0] != "Z" and (started is None or int(fields[19]) == started)


def _group_runs(pgid: int) -> bool:
    """Whether a live (not zombie) process is in group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        f = _proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if f and f[2] == str(pgid) and f[0] != "Z":
            return True
    return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_group(pid: int, timeout_s: float = 20.0, started: int | None = None) -> bool:
    """SIGTERM the process group led by `pid`, SIGKILL what is left of it after `timeout_s`.

    The whole group: a leader's children (vLLM's engine core) go too, even when the leader is
    already gone. `started` (from `start_ticks`) guards against a reused id: if `pid` now names
    a process that started at another time, nothing is signalled. Returns whether anything
    of the group was running. Reaps the leader when it is our child.
    """
    return stop_groups([(pid, started)], timeout_s)[0]


def stop_groups(groups: Sequence[tuple[int, int | None]], timeout_s: float = 20.0) -> list[bool]:
    """`stop_group` for several groups at once: SIGTERM to all, one deadline for all, then
    SIGKILL to what is left. A part slow to stop (vLLM loading its model) then costs the others
    nothing: stopping a stack takes at most `timeout_s`, not that times its parts. Per group,
    whether anything of it was running."""
    live: list[int] = []
    ran = []
    for pid, started in groups:
        _reap(pid)
        reused = started is not None and (now := start_ticks(pid)) is not None and now != started
        running = not reused and _group_runs(pid)
        ran.append(running)
        if running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            live.append(pid)
    deadline = time.monotonic() + timeout_s
    while live and time.monotonic() < deadline:
        for pid in live:
            _reap(pid)
        live = [pid for pid in live if _group_runs(pid)]
        if live:
            time.sleep(0.1)
    for pid in live:  # past their time: the leaders and their stragglers
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return ran


def exited(pid: int) -> int | None:
    """The exit code if `pid` (our child or not) has ended, else None; -1 when unknown."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child, or already reaped
        return None if alive(pid) else -1
    return os.waitstatus_to_exitcode(status) if done else None
