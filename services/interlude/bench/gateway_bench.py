"""`interlude bench gateway`: the latency the gateway adds over calling the engine directly.

Open-loop Poisson arrivals at each rate; each arrival goes, at random and with equal odds,
either straight to an engine or through the gateway, the same one-token
`POST /v1/chat/completions` either way (engines serve OpenAI's API themselves). Two measures
of what the gateway adds, per rate:

* **external**: the gateway arm's latency percentiles minus the direct arm's. Honest but noisy:
  both arms share the engine, the CPU and the client.
* **in-process**: the `gateway` part of each answer's `server-timing` header, the time the
  request spent in the gateway outside its wait for the engine (parsing, auth, rate limit,
  routing, relaying), paired per request.

The first requests at each rate warm connections and are not counted.

With `flood`, a process of its own (`bench/flood.py`) sends that many requests a second with a
real key id and a wrong secret, from many loopback addresses, while the two arms are measured:
what a key-guessing attacker costs the callers who hold a key.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from interlude.bench import cpu
from interlude.bench.flood import launch_at, poisson_offsets

_TIMING = re.compile(r"gateway;dur=([0-9.]+)")
BODY = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0.0}


@dataclass(frozen=True)
class Target:
    """Where the benchmark sends requests."""

    gateway: str
    engine: str
    model: str
    api_key: str = ""
    # Tokens per answer: 1 is a JSON answer; more stream as SSE, one chunk per token (the
    # per-chunk relay, the gateway's work per generated token).
    tokens: int = 1

    def body(self) -> dict[str, Any]:
        return {**BODY, "model": self.model, "max_tokens": self.tokens, "stream": self.tokens > 1}


@dataclass
class _Samples:
    direct: list[float]
    via: list[float]
    in_gateway: list[float]
    errors: int = 0
    sent_via: int = 0  # requests sent through the gateway, the warm-up's included
    flood: Counter[int] = field(default_factory=Counter)  # the flood's answers by status


async def _direct(http: httpx.AsyncClient, t: Target) -> float:
    started = time.perf_counter()
    r = await http.post(t.engine + "/v1/chat/completions", json=t.body())
    elapsed = time.perf_counter() - started
    _check(r, t)
    return elapsed


async def _via(http: httpx.AsyncClient, t: Target) -> tuple[float, float]:
    headers = {"authorization": f"Bearer {t.api_key}"} if t.api_key else {}
    started = time.perf_counter()
    r = await http.post(t.gateway + "/v1/chat/completions", json=t.body(), headers=headers)
    elapsed = time.perf_counter() - started
    _check(r, t)
    m = _TIMING.search(r.headers.get("server-timing", ""))
    return elapsed, float(m.group(1)) / 1000 if m else float("nan")


def _check(r: httpx.Response, t: Target) -> None:
    """An error unless `r` is a whole answer (a stream to its `[DONE]`)."""
    r.raise_for_status()
    if t.tokens > 1 and not r.content.endswith(b"data: [DONE]\n\n"):
        raise httpx.RemoteProtocolError("the stream ended before its [DONE]")


async def _flood(t: Target, rate: float, duration_s: float, seed: int) -> Counter[int]:
    """Run `bench/flood.py` in a process of its own against the gateway for `t.api_key`'s id;
    the answers' status codes, counted."""
    key_id = t.api_key.split("-")[1]
    argv = [t.gateway, key_id, "--rate", str(rate), "--duration", str(duration_s)]
    argv += ["--model", t.model, "--seed", str(seed)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "interlude.bench.flood", *argv, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the flood process exited {proc.returncode}")
    return Counter({int(k): v for k, v in json.loads(out).items()})


async def _run_rate(
    t: Target, rate: float, duration_s: float, warmup: int, seed: int, flood: float = 0.0
) -> _Samples:
    rng = random.Random(seed)
    samples = _Samples([], [], [])
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        tasks: list[asyncio.Task[None]] = []

        async def one(i: int, direct: bool) -> None:
            try:
                if direct:
                    d = await _direct(http, t)
                    if i >= warmup:
                        samples.direct.append(d)
                else:
                    samples.sent_via += 1
                    v, g = await _via(http, t)
                    if i >= warmup:
                        samples.via.append(v)
                        samples.in_gateway.append(g)
            except httpx.HTTPError:
                samples.errors += 1

        arrivals = poisson_offsets(rng, rate, duration_s)
        arms = [rng.random() < 0.5 for _ in arrivals]
        flooding = None
        if flood > 0:
            flooding = asyncio.create_task(_flood(t, flood, duration_s, seed + 1))
        start = time.perf_counter()
        await launch_at(
            arrivals, start, lambda i: tasks.append(asyncio.create_task(one(i, arms[i])))
        )
        await asyncio.gather(*tasks)
        if flooding is not None:
            samples.flood = await flooding
    return samples


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1000, q)) if xs else float("nan")


def measure(
    t: Target,
    rates: list[float],
    duration_s: float,
    seed: int = 0,
    tick: Callable[[float, dict[str, Any]], None] | None = None,
    flood: float = 0.0,
) -> list[dict[str, Any]]:
    """One result row per rate (milliseconds), each under a wrong-secret `flood` (req/s)."""
    rows: list[dict[str, Any]] = []
    for i, rate in enumerate(rates):
        warmup = max(10, int(rate))  # about the first second
        spent = cpu.meter()
        s = asyncio.run(_run_rate(t, rate, duration_s, warmup, seed + i, flood))
        # Every request the gateway answered: the keyed ones and the flood's.
        answered = s.sent_via + sum(s.flood.values())
        gateway_cpu_s = spent().get("gateway", 0.0)
        row: dict[str, Any] = {
            "rate": rate,
            "flood_rate": flood,
            "flood_answers": {str(code): n for code, n in sorted(s.flood.items())},
            "requests": len(s.direct) + len(s.via),
            "errors": s.errors,
            "direct_p50_ms": _pct(s.direct, 50),
            "direct_p99_ms": _pct(s.direct, 99),
            "gateway_p50_ms": _pct(s.via, 50),
            "gateway_p99_ms": _pct(s.via, 99),
            "in_gateway_p50_ms": _pct(s.in_gateway, 50),
            "in_gateway_p99_ms": _pct(s.in_gateway, 99),
            "gateway_cpu_s": gateway_cpu_s,
            "gateway_cpu_ms_per_request": 1000 * gateway_cpu_s / answered if answered else None,
            "tokens": t.tokens,
        }
        row["added_p50_ms"] = row["gateway_p50_ms"] - row["direct_p50_ms"]
        row["added_p99_ms"] = row["gateway_p99_ms"] - row["direct_p99_ms"]
        rows.append(row)
        if tick is not None:
            tick(rate, row)
    return rows


def plot(echo: list[dict[str, Any]], engine: list[dict[str, Any]], out: Path, machine: str) -> None:
    """Left: the time spent in the gateway per rate, both setups, with the targets. Right:
    end-to-end latency with the real engine, direct and through the gateway."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from interlude.bench.report import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    flooded = [r for r in echo if r.get("flood_rate")]
    setups = [
        ([r for r in echo if not r.get("flood_rate")], "echo engine", "-o"),
        (
            flooded,
            f"echo, {flooded[0]['flood_rate']:g}/s wrong-secret flood" if flooded else "",
            "-^",
        ),
        (engine, "tiny model", "-s"),
    ]
    for rows, label, style in setups:
        if rows:
            _p50_p99(left, rows, "in_gateway", label, style)
    left.axhline(1.0, ls="--", c="gray", lw=0.8, label="p50 target 1 ms")
    left.axhline(5.0, ls=":", c="gray", lw=0.8, label="p99 target 5 ms")
    left.set(
        xlabel="requests/s", ylabel="ms", yscale="log", title="time in the gateway (server-timing)"
    )
    left.legend(fontsize=8)
    if engine:
        _end_to_end(right, engine, "tiny model (1-token answers)")
    else:
        _end_to_end(right, setups[0][0], "echo engine", flooded)
    save_figure(fig, f"Interlude gateway overhead ({machine})", out)


def _end_to_end(
    ax: Any, rows: list[dict[str, Any]], title: str, flooded: list[dict[str, Any]] | None = None
) -> None:
    """End-to-end p50/p99, direct and through the gateway (and under the flood, if any)."""
    arms = [(rows, "direct", "engine direct", "-o"), (rows, "gateway", "via gateway", "-s")]
    if flooded:
        arms.append((flooded, "gateway", "via gateway, flood", "-^"))
    for arm_rows, key, label, style in arms:
        _p50_p99(ax, arm_rows, key, label, style)
    ax.set(xlabel="requests/s", ylabel="ms", title=f"end to end, {title}")
    ax.legend(fontsize=8)


def _p50_p99(ax: Any, rows: list[dict[str, Any]], key: str, label: str, style: str) -> None:
    """`key`'s p50 and (lighter) p99 against the rate."""
    rates = [r["rate"] for r in rows]
    ax.plot(rates, [r[f"{key}_p50_ms"] for r in rows], style, label=f"{label} p50")
    ax.plot(rates, [r[f"{key}_p99_ms"] for r in rows], style, alpha=0.5, label=f"{label} p99")
