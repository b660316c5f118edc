"""The local pool controller: the operator's rule over engine processes on one machine.

`plan` is pure and tested on its own; `LocalPool` is run against processes that serve an
engine's `/ready` and `/metrics` from a file the test writes (the real engines' metrics and
the operator's parsing of them are tested in tests/operator; here what matters is that the
pool starts, drains and stops processes and keeps the gateway's roster true)."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from pathlib import Path

import pytest

from interlude.gateway.config import check_engines
from interlude.gateway.file_discovery import FileDiscovery, parse_roster, write_roster
from interlude.gateway.roster import EngineRoster
from interlude.gateway.upstream import Upstream
from interlude.stack.pool import LocalPool, PoolConfig, parse_targets
from interlude.stack.pool_plan import LocalEngine, PoolPass, plan
from interlude.stack.procs import PartSpec, alive, http_ok, spawn, stop_group, wait_ready
from interlude.stack.supervise import Supervisor, supervisor_for
from interlude.stack.up import StackState
from interlude.stack.valkey import free_port
from interlude_operator.decide import History
from interlude_operator.metrics import EngineReading
from interlude_operator.spec import Scaling, Targets

T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
BUSY = EngineReading(kv_usage=0.5, queue_depth=20.0, sessions={"generating": 4})
IDLE = EngineReading(kv_usage=0.0, queue_depth=0.0, sessions={})


def engine(
    name: str, ready: bool = True, age_s: float = 100.0, drain_s: float | None = None
) -> LocalEngine:
    since = None if drain_s is None else T0 - dt.timedelta(seconds=drain_s)
    return LocalEngine(name, T0 - dt.timedelta(seconds=age_s), ready, since)


def run(
    engines: list[LocalEngine],
    readings: dict[str, EngineReading],
    passes: list[float],
    scaling: Scaling,
) -> PoolPass:
    """`plan` at each time of `passes` with the same state; the last pass."""
    history = History()
    todo = None
    for now in passes:
        todo, history = plan(engines, readings, history, now, T0, scaling, Targets())
    assert todo is not None
    return todo


def test_load_over_target_for_the_up_window_starts_engines() -> None:
    scaling = Scaling(1, 4, up_window_s=10, down_window_s=60)
    first = run([engine("engine-0")], {"engine-0": BUSY}, [0.0], scaling)
    assert first.start == 0 and first.decision.code == "wait-up"  # the load must persist
    todo = run([engine("engine-0")], {"engine-0": BUSY}, [0.0, 5.0, 11.0], scaling)
    # queue 20 over a target of 8: ceil(1 x 2.5) = 3 engines, two to start.
    assert (todo.decision.direction, todo.decision.desired, todo.start) == ("up", 3, 2)


def test_engines_still_starting_count_as_idle_capacity() -> None:
    scaling = Scaling(1, 4, up_window_s=0, down_window_s=60)
    engines = [engine("engine-0"), engine("engine-1", ready=False, age_s=1)]
    slight = EngineReading(kv_usage=0.1, queue_depth=12.0, sessions={})
    todo = run(engines, {"engine-0": slight}, [0.0], scaling)
    # 12 / 8 = 1.5 over the target on one engine, 0.75 spread over two: hold, not a third.
    assert (todo.decision.direction, todo.start) == ("hold", 0)


def test_idle_for_the_down_window_drains_the_cheapest_engine_one_at_a_time() -> None:
    scaling = Scaling(1, 4, up_window_s=10, down_window_s=60)
    engines = [engine("engine-0", age_s=300), engine("engine-1", age_s=100)]
    busy_one = EngineReading(kv_usage=0.0, queue_depth=0.0, sessions={"awaiting_tool": 3})
    readings = {"engine-0": busy_one, "engine-1": IDLE}
    early = run(engines, readings, [0.0, 30.0], scaling)
    assert early.drain == () and early.decision.code == "wait-down"
    todo = run(engines, readings, [0.0, 30.0, 61.0], scaling)
    assert todo.drain == ("engine-1",)  # no sessions there: nothing lost by draining it
    more = [*engines, engine("engine-2", drain_s=5)]
    held = run(more, {**readings, "engine-2": busy_one}, [0.0, 61.0], scaling)
    assert held.drain == () and held.decision.code == "draining"


def test_a_drain_ends_when_its_sessions_finish_or_at_the_timeout() -> None:
    scaling = Scaling(1, 4, up_window_s=10, down_window_s=60, drain_timeout_s=300)
    paused = EngineReading(kv_usage=0.1, queue_depth=0.0, sessions={"awaiting_client": 2})
    engines = [engine("engine-0"), engine("engine-1", drain_s=10)]
    still = run(engines, {"engine-0": IDLE, "engine-1": paused}, [0.0], scaling)
    assert still.stop == ()
    done = run(engines, {"engine-0": IDLE, "engine-1": IDLE}, [0.0], scaling)
    assert done.stop == (("engine-1", "its sessions are finished"),)
    late = [engine("engine-0"), engine("engine-1", drain_s=301)]
    timed_out = run(late, {"engine-0": IDLE, "engine-1": paused}, [0.0], scaling)
    assert [name for name, _ in timed_out.stop] == ["engine-1"]


def test_a_scale_up_takes_back_a_drain_before_starting_an_engine() -> None:
    scaling = Scaling(1, 4, up_window_s=0, down_window_s=60)
    engines = [engine("engine-0"), engine("engine-1", drain_s=5)]
    paused = EngineReading(kv_usage=0.1, queue_depth=0.0, sessions={"awaiting_tool": 1})
    todo = run(engines, {"engine-0": BUSY, "engine-1": paused}, [0.0], scaling)
    # 20 / 8 on the one serving engine: 3 wanted, one taken back from its drain, one new.
    assert (todo.undrain, todo.start, todo.stop) == (("engine-1",), 1, ())


def test_targets_parse_by_the_engine_pools_names() -> None:
    assert parse_targets("kvUsage=0.5, queueDepth=4") == Targets(kv_usage=0.5, queue_depth=4)
    assert parse_targets("") == Targets()
    with pytest.raises(ValueError, match="unknown target 'kv'"):
        parse_targets("kv=0.5")
    with pytest.raises(ValueError, match="queueDepth needs a number"):
        parse_targets("queueDepth=many")


def test_the_roster_file_is_checked_and_a_bad_one_keeps_the_last(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    discovery = FileDiscovery(str(path), extra=("http://10.0.0.9:8100",))
    assert asyncio.run(discovery.urls()) == ["http://10.0.0.9:8100"]  # no file yet
    write_roster(
        path, ["http://127.0.0.1:8100", "http://127.0.0.1:8101"], ["http://127.0.0.1:8101"]
    )
    assert len(asyncio.run(discovery.urls())) == 3
    assert discovery.draining() == {"http://127.0.0.1:8101"}
    path.write_text('{"engines": ["127.0.0.1:8100"]}')  # no scheme: refused, the last one kept
    assert len(asyncio.run(discovery.urls())) == 3
    with pytest.raises(ValueError, match="must be a list of URLs"):
        parse_roster('{"engines": "http://127.0.0.1:8100"}')
    with pytest.raises(ValueError, match="not both"):
        check_engines((), "ns/engines", str(path))


def test_the_gateways_pool_follows_the_roster(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"

    async def polls() -> tuple[dict[str, bool], list[str]]:
        upstream = Upstream(0.2, 1.0)
        roster = EngineRoster(FileDiscovery(str(path)), upstream, interval_s=0.5)
        write_roster(path, [a, b], [b])
        await roster.poll()
        marks = {url: e.draining for url, e in roster.engines.items()}
        write_roster(path, [a], [])  # b drained and stopped: out of the gateway's pool
        await roster.poll()
        await upstream.close()
        return marks, list(roster.engines)

    marks, after = asyncio.run(polls())
    assert marks == {a: False, b: True} and after == [a]


METRICS_SERVER = """
import http.server, sys
from pathlib import Path
port, metrics = int(sys.argv[1]), Path(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (metrics.read_text() if self.path == "/metrics" else "ok").encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def metrics_text(waiting: float, kv: float, generating: int) -> str:
    return (
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
        f'interlude:sessions{{state="generating"}} {generating}\n'
    )


def test_the_pool_starts_drains_and_stops_engine_processes(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(metrics_text(waiting=20, kv=0.5, generating=3))
    specs = []
    for i in range(2):
        port = free_port()
        argv = (sys.executable, "-c", METRICS_SERVER, str(port), str(metrics))
        url = f"http://127.0.0.1:{port}"
        specs.append(
            (PartSpec(f"engine-{i}", argv, tmp_path / f"e{i}.log", http_ok(url + "/ready")), url)
        )
    first = spawn(specs[0][0])
    said: list[str] = []
    supervisor = Supervisor([first], said.append, lambda old, new: None)
    config = PoolConfig(Scaling(1, 2, up_window_s=0, down_window_s=0), interval_s=0.1)
    pool = LocalPool(
        config, tmp_path, specs[:1], specs[1:], supervisor.watch, supervisor.unwatch, said.append
    )
    try:
        wait_ready([first], 30, poll_s=0.05)
        up = pool.step(1.0)
        assert (up.decision.direction, up.start) == ("up", 1)
        urls, draining = parse_roster((tmp_path / "engines.json").read_text())
        assert urls == [specs[0][1], specs[1][1]] and not draining
        second = supervisor.watched[-1].part
        wait_ready([second], 30, poll_s=0.05)
        metrics.write_text(metrics_text(waiting=0, kv=0.0, generating=1))
        down = pool.step(2.0)
        assert down.drain == ("engine-1",)  # the younger of two idle engines
        assert parse_roster((tmp_path / "engines.json").read_text())[1] == {specs[1][1]}
        assert pool.step(3.0).stop == ()  # a session still generating there
        metrics.write_text(metrics_text(waiting=0, kv=0.0, generating=0))
        gone = pool.step(4.0)
        assert [name for name, _ in gone.stop] == ["engine-1"]
        assert parse_roster((tmp_path / "engines.json").read_text()) == ([specs[0][1]], frozenset())
        assert not alive(second.pid) and [w.part.spec.name for w in supervisor.watched] == [
            "engine-0"
        ]
        assert len((tmp_path / "pool.jsonl").read_text().splitlines()) == 4
    finally:
        for w in supervisor.watched:
            stop_group(w.part.pid, timeout_s=5)


def test_the_state_file_names_the_engines_the_pool_starts_and_forgets_those_it_stops(
    tmp_path: Path,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "metrics.txt").write_text(metrics_text(waiting=0, kv=0.0, generating=0))
    argv = (sys.executable, "-c", METRICS_SERVER, str(port), str(tmp_path / "metrics.txt"))
    spec = PartSpec("engine-1", argv, tmp_path / "e1.log", http_ok(url + "/ready"))
    state = StackState("g", [], "r", "", str(tmp_path))
    supervisor = supervisor_for(state, [], lambda line: None)
    part = supervisor.watch(spec)
    try:
        named = [p["name"] for p in StackState.load(tmp_path).parts]  # type: ignore[union-attr]
        assert named == ["engine-1"]  # `interlude down` would stop it
        assert supervisor.unwatch("engine-1") is part
        assert StackState.load(tmp_path).parts == []  # type: ignore[union-attr]
    finally:
        stop_group(part.pid, timeout_s=5)
