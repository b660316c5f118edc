"""CPU seconds of the processes that serve a benchmark, by role, read from /proc (Linux).

`bench http` snapshots them around each rate's run to report the serving path's CPU per
generated token: what the HTTP layers (stock vLLM's API server; Interlude's gateway, or Envoy
and the endpoint picker, and its engine's front end) spend beside vLLM's EngineCore and
worker, which both arms share.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A process's role by its command line; the first match wins. vLLM renames its children.
ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine_core", ("VLLM::",)),
    ("frontend", ("vllm.entrypoints.openai.api_server", "interlude.cli engine")),
    ("gateway", ("interlude.cli gateway",)),
    # The InferencePool path's front (`interlude-envoy`): the picker and Envoy (its launcher
    # execs the binary with the launcher's path as argv[0]).
    ("picker", ("interlude.cli picker",)),
    ("envoy", ("bin/envoy -c",)),
    ("valkey", ("valkey-server",)),
    ("tools", ("interlude_tools",)),
)
# The serving path: everything HTTP, above the EngineCore.
SERVING = ("frontend", "gateway", "picker", "envoy")


def role_of(cmdline: str) -> str | None:
    for role, marks in ROLES:
        if any(m in cmdline for m in marks):
            return role
    return None


def cpu_by_pid(proc: Path = Path("/proc")) -> dict[int, tuple[str, float]]:
    """(role, CPU seconds so far) of every running process with a role."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (d / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        role = role_of(cmdline)
        if role is None:
            continue
        # Fields after the command's closing parenthesis: utime and stime are the 12th, 13th.
        fields = stat.rsplit(")", 1)[1].split()
        out[int(d.name)] = (role, (int(fields[11]) + int(fields[12])) / tick)
    return out


def spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process started meanwhile counts whole;
    one that exited meanwhile is lost, so take snapshots while the servers run)."""
    total: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        prior = before.get(pid)
        total[role] = total.get(role, 0.0) + cpu - (prior[1] if prior and prior[0] == role else 0.0)
    return {role: round(s, 3) for role, s in sorted(total.items())}


def meter() -> Callable[[], dict[str, float]]:
    """Start a meter: calling what it returns gives the CPU seconds per role since."""
    before = cpu_by_pid()
    return lambda: spent(before, cpu_by_pid())


def serving_ms_per_token(rows: list[dict[str, Any]]) -> dict[str, dict[float, float]]:
    """Per arm and rate, the median over rounds of the serving path's CPU milliseconds per
    generated token (rows with `cpu_s` only)."""
    per: dict[str, dict[float, list[float]]] = {}
    for r in rows:
        if "cpu_s" not in r or not r.get("generated"):
            continue
        ms = 1000 * sum(r["cpu_s"].get(role, 0.0) for role in SERVING) / r["generated"]
        per.setdefault(r["arm"], {}).setdefault(r["rate"], []).append(ms)
    return {
        arm: {rate: round(statistics.median(v), 4) for rate, v in sorted(rates.items())}
        for arm, rates in per.items()
    }
