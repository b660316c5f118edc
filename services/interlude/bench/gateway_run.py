"""The two setups `interlude bench gateway` measures, each as real local processes.

* **echo**: the gateway (API keys and a Redis-backed rate limit, as deployed) in
  front of `echo_engine`, which answers at once: the rates the issue names (up to 200/s) load
  the gateway, not a model. The direct arm calls the echo engine.
* **engine**: `interlude up` with the tiny model on vLLM's CPU build, at rates one CPU engine
  can serve: the gateway's cost next to a real engine on the same two cores.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from interlude.bench.gateway_bench import Target, measure
from interlude.gateway.auth import create_key
from interlude.stack.procs import Part, PartSpec, http_ok, spawn, stop_group, wait_ready
from interlude.stack.up import StackConfig, down, up
from interlude.stack.valkey import Valkey, free_port

Tick = Callable[[float, dict[str, Any]], None]


def echo_rows(
    run_dir: Path,
    rates: list[float],
    duration_s: float,
    tick: Tick,
    flood: float = 0.0,
    tokens: int = 1,
) -> list[dict[str, Any]]:
    """Rows per rate; with `flood`, each rate again under that many wrong-secret requests a
    second (`gateway_bench.measure`), against the same gateway; answers of `tokens` tokens
    (more than one: streamed, one chunk each)."""
    valkey = Valkey(run_dir / "valkey", log=run_dir / "logs" / "valkey.log")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    parts: list[Part] = []
    try:
        redis_url = valkey.start()
        key, line = create_key("bench")
        (run_dir / "api-keys").write_text(line + "\n")
        echo_port, gw_port = free_port(), free_port()
        echo = f"http://127.0.0.1:{echo_port}"
        gateway = f"http://127.0.0.1:{gw_port}"
        echo_argv = (sys.executable, "-m", "interlude.bench.echo_engine", str(echo_port))
        parts.append(
            spawn(
                PartSpec(
                    "echo-engine",
                    echo_argv,
                    run_dir / "logs" / "echo.log",
                    http_ok(echo + "/ready"),
                )
            )
        )
        gw_argv = (
            sys.executable, "-m", "interlude.cli", "gateway", "--host", "127.0.0.1",
            "--port", str(gw_port), "--engine", echo, "--redis-url", redis_url,
            "--api-keys-file", str(run_dir / "api-keys"), "--rate-limit", "1000000/minute",
            "--log-level", "warning",
        )  # fmt: skip
        parts.append(
            spawn(
                PartSpec(
                    "gateway",
                    gw_argv,
                    run_dir / "logs" / "gateway.log",
                    http_ok(gateway + "/ready"),
                )
            )
        )
        wait_ready(parts, 60)
        target = Target(gateway, echo, "tiny", key, tokens=tokens)
        rows = measure(target, rates, duration_s, tick=tick)
        if flood > 0:
            rows += measure(target, rates, duration_s, seed=len(rates), tick=tick, flood=flood)
        return rows
    finally:
        for p in parts:
            stop_group(p.pid)
        valkey.stop()


def engine_rows(
    run_dir: Path, rates: list[float], duration_s: float, tick: Tick
) -> list[dict[str, Any]]:
    if not rates:
        return []
    cfg = StackConfig(
        run_dir=run_dir,
        auth=True,
        rate_limit="1000000/minute",
        port=free_port(),
        engine_port=free_port(),
    )
    state = up(cfg)
    try:
        target = Target(state.gateway, state.engines[0], "tiny", state.api_key)
        return measure(target, rates, duration_s, tick=tick)
    finally:
        down(run_dir)
