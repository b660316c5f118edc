"""Runs of one server over a list of arrival rates: what `interlude loadgen run` does, and what
`interlude bench http` does for each arm and round.

Rates run in ascending order; each rate's conversations get their own ids (so prompts), so the
prefix cache carries no hits from one rate to the next. With an SLO (the round's, once the
reference arm has set it), an arm stops once `slo.skip_above` says it has failed for
good, as `bench engine` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlude.loadgen.client import Target
from interlude.loadgen.plan import Conversation, Scale, conversations
from interlude.loadgen.replay import Progress, replay, summarize
from interlude.loadgen.text import TextMaker
from interlude.slo import judged, round_slo, skip_above


@dataclass(frozen=True)
class RunSpec:
    """The workload side of a run: what arrives, how fast, for how long."""

    workload: str = "auto"
    rates: tuple[float, ...] = (1.0,)  # conversations/s; empty: the JSONL file's arrival times
    duration_s: float = 20.0  # arrivals stop here
    horizon_s: float | None = None  # the run stops here; None: 2 x duration_s
    seed: int = 0
    scale: Scale = field(default_factory=Scale)

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or any(r <= 0 for r in self.rates):
            raise ValueError("duration_s and every rate must be > 0")
        if self.horizon_s is not None and self.horizon_s < self.duration_s:
            raise ValueError("horizon_s must be >= duration_s")

    @property
    def horizon(self) -> float:
        return self.horizon_s if self.horizon_s is not None else 2 * self.duration_s


def planned(spec: RunSpec) -> Iterator[Conversation]:
    """Every conversation `spec`'s rates send, rate by rate (ids without a run's prefix): what
    a harness sizes its deadlines and horizon by."""
    for rate in spec.rates or (None,):
        yield from conversations(spec.workload, rate, spec.duration_s, spec.seed, spec.scale)


def run_rates(
    arm: str,
    target: Target,
    spec: RunSpec,
    texts: TextMaker,
    run: int = 0,
    slo: float | None = None,
    progress: Callable[[str, Progress | None], Progress | None] | None = None,
    settle_s: float = 1.0,
    reference: bool = False,
    meters: Mapping[str, Callable[[], Callable[[], Any]]] | None = None,
) -> list[dict[str, Any]]:
    """`arm`'s rows at `spec.rates` (ascending) against `target`; stops early past the SLO.

    `progress(label, None)` is called as each rate starts and returns the tick to call as the
    run goes (or None). After a rate that cut conversations at the horizon the server gets
    `settle_s` to free what they left behind (Interlude: sessions parked for a tool the client
    no longer answers end at the engine's client deadline). A `reference` arm takes its SLO
    from its own lowest rate, as it sets the round's. `meters` name what a harness measures of
    its servers around each rate's run: `meters[key]()` starts a meter as the run starts, and
    calling what it returns, as the run ends, gives the row's `key` (e.g. the CPU seconds each
    process spent meanwhile)."""
    rates: Sequence[float | None] = sorted(spec.rates) if spec.rates else [None]
    rows: list[dict[str, Any]] = []
    for j, rate in enumerate(rates):
        plan = conversations(
            spec.workload, rate, spec.duration_s, spec.seed, spec.scale, f"{arm}-k{run}-r{j}-"
        )
        tick = (
            progress(f"{arm} @ {rate or 'trace'}/s: {len(plan)} conversations", None)
            if progress
            else None
        )
        started = {key: start() for key, start in (meters or {}).items()}
        runs, span = asyncio.run(replay(target, plan, texts, spec.horizon, tick))
        row = summarize(arm, target.mode, runs, span) | {"rate": rate or 0.0, "run": run}
        row |= {key: read() for key, read in started.items()}
        rows.append(row)
        # Nothing cut at the horizon: nothing left parked to wait for.
        time.sleep(settle_s if row["unfinished"] else min(settle_s, 1.0))
        limit = round_slo(rows) if reference else slo
        if limit is not None and rate is not None:
            known = {r["rate"]: judged(r) for r in rows}
            if skip_above([r for r in rates if r is not None], known, limit) is not None:
                break
    return rows
