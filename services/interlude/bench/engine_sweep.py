"""`interlude bench engine --rates ...`: the real engine measured like the simulator.

One overloaded rate (`run_engine_bench`) measures throughput at saturation, and that swings:
under overload stock vLLM serves each resubmitted turn first come, first served, so sessions
advance in lockstep and how many cross the finish line by the horizon jumps with small changes
in speed (docs/engine.md). Here each arm runs a sweep of arrival rates instead, and the result
is its sustainable rate at the simulator's SLO rules (`interlude.slo`: median normalized latency
within SLO_FACTOR x the reference arm's at the lowest rate; the tail rule adds the p99 and at
most 1 % unfinished), in several rounds. A round is a whole experiment (its own SLO from its
own reference run), so the spread over rounds is the spread of the answer; ratios are taken
round by round and reported with their range.

One engine per (arm, round) serves that arm's rates in ascending order: an engine start costs
~20 s here. Sessions at each rate get their own ids, hence prompts, so the prefix cache cannot
carry hits from one rate's run to the next; the policy's predictor does stay warm across rates.
An arm's higher rates are not run once `slo.skip_above` says it has failed for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from interlude.bench.engine_bench import (
    ARMS,
    EngineBenchSpec,
    SessionPlan,
    engine_config,
    pool_of,
    replay,
    sessions_at,
    summarize,
)
from interlude.slo import judge_round, judged, round_slo, skip_above, sweep_ratios

REFERENCE_ARM = "vllm-noprefix"  # stock vLLM as InferCept measured it (the simulator's `vllm`)
SWEEP_ARMS = ("vllm-noprefix", "vllm-prefix", "interlude")


def stats_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What the engine's cumulative counters gained between two snapshots (nested dicts too)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, Mapping):
            out[key] = stats_delta(old if isinstance(old, Mapping) else {}, value)
        elif isinstance(value, int | float) and isinstance(old, int | float):
            out[key] = value - old
        else:
            out[key] = value
    return out


def _run_rates(
    arm: str,
    spec: EngineBenchSpec,
    plans: Sequence[tuple[float, SessionPlan]],
    slo: float | None,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    """`arm`'s runs at `plans`' rates on one engine, ascending, until `skip_above` stops it.

    `slo` is the round's SLO; None for the reference arm, whose first run sets it."""
    from interlude.bench.scripted_engine import ScriptedEngine

    engine = ScriptedEngine(engine_config(arm, spec))

    async def sweep() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for rate, sessions in plans:
            progress(f"  {arm} at {rate:g} sessions/s: {len(sessions)} sessions")
            before = engine.stats()
            resubmit = ARMS[arm][0] is None
            runs, span = await replay(engine, sessions, resubmit, spec.horizon, progress)
            await asyncio.sleep(1.0)  # sessions cut at the horizon are aborted by now
            stats = stats_delta(before, engine.stats())
            rows.append(summarize(arm, runs, span, stats) | {"rate": rate})
            limit = slo if slo is not None else round_slo(rows)
            known = {r["rate"]: judged(r) for r in rows}
            if skip_above([p[0] for p in plans], known, limit) is not None:
                break
        return rows

    try:
        return asyncio.run(sweep())
    finally:
        engine.shutdown()


def run_engine_sweep(
    spec: EngineBenchSpec,
    arms: Sequence[str],
    rates: Sequence[float],
    progress: Callable[[str], None],
    repeats: int = 1,
) -> dict[str, Any]:
    """Every arm over `rates`, `repeats` rounds; rows per run, and per round each arm's
    sustainable rates and `interlude`'s ratios over the stock arms."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    if REFERENCE_ARM not in arms:
        raise ValueError(f"the sweep needs the reference arm {REFERENCE_ARM!r} (it sets the SLO)")
    rates = sorted(set(rates))
    if not rates or rates[0] <= 0:
        raise ValueError("rates must be positive")
    pool = pool_of(spec)
    plans = [(r, sessions_at(pool, replace(spec, rate=r), f"r{j}-")) for j, r in enumerate(rates)]
    order = [REFERENCE_ARM, *(a for a in arms if a != REFERENCE_ARM)]
    rows: list[dict[str, Any]] = []
    rounds = []
    for k in range(repeats):
        slo: float | None = None
        for n, arm in enumerate(order, 1):
            progress(f"[round {k + 1}/{repeats}, arm {n}/{len(order)}] {arm}")
            done = _run_rates(arm, spec, plans, slo, progress)
            slo = slo if slo is not None else round_slo(done)
            rows += [r | {"run": k} for r in done]
        assert slo is not None  # the reference arm runs first, at least its lowest rate
        rounds.append(judge_round([r for r in rows if r["run"] == k], slo))
    return {
        "spec": asdict(spec),
        "rates": rates,
        "reference_arm": REFERENCE_ARM,
        "rows": rows,
        "rounds": rounds,
        "ratios": sweep_ratios(rounds),
    }
