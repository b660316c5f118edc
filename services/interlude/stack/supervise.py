"""Keeping a running stack up: a part that dies is started again, as a process supervisor would.

`interlude up` in the foreground hands its parts to a `Supervisor` and calls `check` twice a
second. A part that exited is started again from the same command, environment and log file
(the embedded Valkey from its append-only file, so accepted work survives; an engine, a worker
or the gateway on the same port). A part that keeps dying (more than `max_restarts` exits within
`window_s`) is not restarted again: `check` names it and the stack is stopped, as before, with
its log's tail, because a crash loop is a bug to read, not a blip to ride out.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from interlude.stack.procs import Part, PartSpec, spawn, start_ticks
from interlude.stack.up import StackState, record_restart, record_start, record_stop
from interlude.ui import term_requested


@dataclass
class _Watched:
    part: Part
    exits: deque[float] = field(default_factory=deque)  # monotonic times of recent exits
    back: bool = True  # ready since its last start (a restarted part is not, at first)
    new: bool = False  # started by `watch`, never ready yet


@dataclass(frozen=True)
class GaveUp:
    """A part that died more often than the supervisor restarts it."""

    name: str
    code: int  # of its last exit
    log: str
    exits: int  # within the supervisor's window
    window_s: float

    def __str__(self) -> str:
        return f"{self.name} died {self.exits} times within {self.window_s:.0f} s: see {self.log}"


class Supervisor:
    """Restarts the parts that exit.

    Side effects: processes (a restarted part is a new process group), `on_restart(old, new)`
    (the caller rewrites its state file, so that `interlude down` stops the new process) and
    one line per event through `say`; `watch` starts a part and `on_start` names it, `unwatch`
    lets one go and `on_stop` forgets it (the state file again). Invariant: a part is started
    again only after its old process has exited, and at most `max_restarts` times within any
    `window_s`.
    """

    def __init__(
        self,
        parts: Sequence[Part],
        say: Callable[[str], None],
        on_restart: Callable[[Part, Part], None],
        max_restarts: int = 3,
        window_s: float = 300.0,
        on_start: Callable[[Part], None] = lambda part: None,
        on_stop: Callable[[str], None] = lambda name: None,
    ) -> None:
        if max_restarts < 0 or window_s <= 0:
            raise ValueError("max_restarts must be >= 0 and window_s > 0")
        self.watched = [_Watched(p) for p in parts]
        self.say = say
        self.on_restart = on_restart
        self.on_start = on_start
        self.on_stop = on_stop
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.restarts = 0

    def watch(self, spec: PartSpec) -> Part:
        """Start a new part and watch it from now on (a local pool's new engine)."""
        part = spawn(spec)
        self.watched.append(_Watched(part, back=False, new=True))
        self.on_start(part)
        return part

    def unwatch(self, name: str) -> Part | None:
        """Stop watching the part named `name` (the caller stops it; `on_stop` names it);
        that part, if any."""
        for w in self.watched:
            if w.part.spec.name == name:
                self.watched.remove(w)
                self.on_stop(name)
                return w.part
        return None

    def check(self) -> GaveUp | None:
        """One pass: start again each part that exited and report those that are back; the
        first part that exited too often, if any (then the caller stops the stack)."""
        now = time.monotonic()
        for w in self.watched:
            code = w.part.proc.poll()
            if code is None:
                self._note_ready(w, now)
                continue
            while w.exits and now - w.exits[0] > self.window_s:
                w.exits.popleft()
            w.exits.append(now)
            name = w.part.spec.name
            if len(w.exits) > self.max_restarts:
                return GaveUp(name, code, str(w.part.spec.log), len(w.exits), self.window_s)
            self.say(
                f"{name} exited (code {code}); starting it again "
                f"({len(w.exits)} of {self.max_restarts} restarts in {self.window_s:.0f} s)"
            )
            old, w.part = w.part, spawn(w.part.spec)
            w.back = False
            self.restarts += 1
            self.on_restart(old, w.part)
        return None

    def _note_ready(self, w: _Watched, now: float) -> None:
        if w.back or not w.part.spec.ready():
            return
        w.back = True
        w.part.ready_at = now
        took = f"{now - w.part.started:.0f} s after its {'start' if w.new else 'restart'}"
        self.say(f"{w.part.spec.name} is {'ready' if w.new else 'back'} ({took})")
        w.new = False


def supervisor_for(
    state: StackState, parts: Sequence[Part], say: Callable[[str], None]
) -> Supervisor:
    """A `Supervisor` of `parts` that keeps `state`'s file naming the processes it starts."""
    return Supervisor(
        parts,
        say,
        lambda old, new: record_restart(state, old, new),
        on_start=lambda part: record_start(state, part),
        on_stop=lambda name: record_stop(state, name),
    )


def supervise(
    state: StackState,
    supervisor: Supervisor,
    poll_s: float = 0.5,
    tick: Callable[[], None] = lambda: None,
) -> GaveUp | None:
    """Keep a started stack's parts running, from this process, until Ctrl-C or SIGTERM (None;
    `interlude down` sends SIGTERM: the state file names this process) or until a part dies too
    often; `tick` runs after each check (a local pool's pass when one is due). The caller stops
    the stack after either."""
    try:
        # Named only inside the `try`: `down` may signal as soon as it reads the name.
        state.supervisor = [os.getpid(), start_ticks(os.getpid()) or 0]
        state.save()
        while (gave_up := supervisor.check()) is None and not term_requested():
            tick()
            time.sleep(poll_s)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (`ui.exit_on_term`)
        return None
    return gave_up


class SupervisorThread:
    """`Supervisor.check`, then `tick`, every `poll_s` from a daemon thread: for a caller whose
    own thread drives load against the stack (the benchmarks), where `supervise` would block.

    Side effects: those of `check` and `tick`, from the thread. Invariant: after a part dies too
    often the thread stops checking and `gave_up` names it ("" until then); `stop` returns once
    the thread has ended, so no restart races the caller's `down`.
    """

    def __init__(
        self, supervisor: Supervisor, poll_s: float = 0.5, tick: Callable[[], None] = lambda: None
    ) -> None:
        self.supervisor = supervisor
        self.gave_up = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, args=(poll_s, tick), name="supervisor", daemon=True
        )
        self._thread.start()

    def _watch(self, poll_s: float, tick: Callable[[], None]) -> None:
        while not self._stop.wait(poll_s):
            if (gave := self.supervisor.check()) is not None:
                self.gave_up = str(gave)
                return
            tick()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
