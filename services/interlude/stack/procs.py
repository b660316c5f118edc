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

import httpx


class StartError(RuntimeError):
    """A part died or did not become ready; the message names it and holds its log's tail."""


@dataclass(frozen=True)
class PartSpec:
    """One process of the stack: how to start it and how to know it is ready."""

    name: str
    argv: tuple[str, ...]
    log: Path
    ready: Callable[[], bool] = field(compare=False)
    env: Mapping[str, str] = field(default_factory=dict, compare=False)


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

    def check() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

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
    try:
        return path.read_text(errors="replace")[-chars:]
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
        for p in parts:
            code = p.proc.poll()
            if code is not None:
                raise StartError(
                    f"{p.spec.name} exited with code {code} while starting; its log "
                    f"({p.spec.log}) ends with:\n{tail(p.spec.log)}"
                )
            if p.ready_at is None and p.spec.ready():
                p.ready_at = time.monotonic()
        if tick is not None:
            tick(parts)
        if all(p.ready_at is not None for p in parts):
            return
        if time.monotonic() > deadline:
            late = [p.spec.name for p in parts if p.ready_at is None]
            raise StartError(f"not ready after {timeout_s:.0f} s: {', '.join(late)}")
        time.sleep(poll_s)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pid: int, timeout_s: float = 20.0) -> bool:
    """SIGTERM the process group led by `pid`, SIGKILL it after `timeout_s`.

    Returns whether anything was running. Reaps the process when it is our child.
    """
    if not alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not alive(pid):
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # the group's stragglers, or the leader past its time
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return True
