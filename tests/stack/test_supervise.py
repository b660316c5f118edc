"""`interlude up`'s supervisor with real processes: a part that is killed is started again (the
embedded Valkey from its append-only file, nothing it accepted lost), `down` stops the new
process, and a part that keeps dying is given up on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis

from interlude.stack.procs import Part, PartSpec, alive, http_ok, spawn, wait_ready
from interlude.stack.supervise import GaveUp, Supervisor, SupervisorThread
from interlude.stack.up import StackState, down, record_restart
from interlude.stack.valkey import Valkey, free_port

SERVE = (
    "import http.server as h; "
    "h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
)


def started(specs: list[PartSpec], tmp_path: Path) -> tuple[list[Part], StackState]:
    parts = [spawn(spec) for spec in specs]
    wait_ready(parts, timeout_s=30, poll_s=0.05)
    entries = [{"name": p.spec.name, "pid": p.pid, "log": str(p.spec.log)} for p in parts]
    state = StackState("g", [], "r", "", str(tmp_path), entries, ready=True)
    state.save()
    return parts, state


def until(check: Callable[[], object], supervisor: Supervisor, timeout_s: float = 30.0) -> None:
    """Run the supervisor's passes until `check()` holds."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert supervisor.check() is None
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_killed_part_is_started_again_and_down_stops_the_new_one(tmp_path: Path) -> None:
    port = free_port()
    spec = PartSpec(
        "web",
        (sys.executable, "-c", SERVE.format(port=port)),
        tmp_path / "web.log",
        http_ok(f"http://127.0.0.1:{port}/"),
    )
    parts, state = started([spec], tmp_path)
    said: list[str] = []
    supervisor = Supervisor(parts, said.append, lambda old, new: record_restart(state, old, new))
    first = parts[0].pid
    os.kill(first, signal.SIGKILL)
    until(lambda: any("is back" in line for line in said), supervisor)
    new = supervisor.watched[0].part
    assert new.pid != first and supervisor.restarts == 1
    assert said[0].startswith("web exited (code -9); starting it again (1 of 3")
    assert StackState.load(tmp_path).parts[0]["pid"] == new.pid  # type: ignore[union-attr]
    assert down(tmp_path) == ["web"]
    new.proc.wait(timeout=5)
    assert not alive(new.pid)


def test_valkey_killed_comes_back_with_what_it_had_accepted(tmp_path: Path) -> None:
    valkey = Valkey(tmp_path / "valkey", free_port(), tmp_path / "valkey.log")
    parts, state = started([valkey.spec()], tmp_path)
    with Redis.from_url(valkey.url) as r:
        r.xadd("interlude:calls", {"call": "c1"})
    said: list[str] = []
    supervisor = Supervisor(parts, said.append, lambda old, new: record_restart(state, old, new))
    os.kill(parts[0].pid, signal.SIGKILL)
    until(lambda: any("is back" in line for line in said), supervisor)
    with Redis.from_url(valkey.url) as r:  # the same URL: every other part keeps its config
        assert r.xlen("interlude:calls") == 1
    down(tmp_path)


def test_a_part_that_keeps_dying_is_given_up(tmp_path: Path) -> None:
    spec = PartSpec(
        "broken", (sys.executable, "-c", "raise SystemExit(3)"), tmp_path / "b.log", lambda: True
    )
    part = spawn(spec)
    part.proc.wait(timeout=10)
    said: list[str] = []
    supervisor = Supervisor([part], said.append, lambda old, new: None, max_restarts=2)
    gave_up = None
    deadline = time.monotonic() + 30
    while gave_up is None and time.monotonic() < deadline:
        gave_up = supervisor.check()
        time.sleep(0.05)
    assert gave_up == GaveUp("broken", 3, str(tmp_path / "b.log"), 3, 300.0)
    # (A loaded machine may see a restarted one alive for a moment: "is back" lines then.)
    restarted = [line for line in said if "starting it again" in line]
    assert supervisor.restarts == 2 and len(restarted) == 2


def test_a_supervisor_thread_ticks_and_names_the_part_it_gave_up_on(tmp_path: Path) -> None:
    spec = PartSpec(
        "broken", (sys.executable, "-c", "raise SystemExit(3)"), tmp_path / "b.log", lambda: True
    )
    part = spawn(spec)
    part.proc.wait(timeout=10)
    supervisor = Supervisor([part], lambda line: None, lambda old, new: None, max_restarts=1)
    ticks: list[float] = []
    thread = SupervisorThread(supervisor, poll_s=0.05, tick=lambda: ticks.append(time.monotonic()))
    deadline = time.monotonic() + 30
    while not thread.gave_up:
        assert time.monotonic() < deadline, "the thread never gave up"
        time.sleep(0.05)
    thread.stop()
    assert thread.gave_up == f"broken died 2 times within 300 s: see {tmp_path / 'b.log'}"
    assert ticks  # after the pass that restarted it, before the one that gave up
    assert supervisor.restarts == 1


SUPERVISING = """
import signal, sys
from pathlib import Path
from interlude.stack.procs import PartSpec, http_ok, spawn, wait_ready
from interlude.stack.supervise import supervise, supervisor_for
from interlude.stack.up import StackState, down
from interlude.ui import exit_on_term

run_dir, port = Path(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGTERM, exit_on_term)
serve = {serve!r}.format(port=port)
spec = PartSpec("web", (sys.executable, "-c", serve), run_dir / "web.log",
                http_ok(f"http://127.0.0.1:{{port}}/"))
part = spawn(spec)
wait_ready([part], 30, poll_s=0.05)
state = StackState("g", [], "r", "", str(run_dir), [{{"name": "web", "pid": part.pid}}], True)
state.save()
print("up", flush=True)
supervise(state, supervisor_for(state, [part], print), poll_s=0.05)
print("stopped:", down(run_dir), flush=True)
"""


def test_down_stops_the_supervising_up_before_the_parts(tmp_path: Path) -> None:
    # Otherwise the supervisor starts again every part `down` stops.
    port = free_port()
    script = SUPERVISING.format(serve=SERVE)
    up = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), str(port)], stdout=subprocess.PIPE, text=True
    )
    assert up.stdout is not None and up.stdout.readline() == "up\n"
    deadline = time.monotonic() + 10
    while not (state := StackState.load(tmp_path)) or not state.supervisor:
        assert time.monotonic() < deadline, "the supervisor never named itself"
        time.sleep(0.05)
    assert state.supervisor[0] == up.pid
    web = state.parts[0]["pid"]
    assert down(tmp_path) == ["web"]
    out, _ = up.communicate(timeout=30)
    assert up.returncode == 0 and out == "stopped: ['web']\n"  # it stopped it, restarted nothing
    assert not alive(web) and StackState.load(tmp_path) is None
