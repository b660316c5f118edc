"""The local pool controller: engines started and drained as the operator's rule decides.

`interlude up --min-engines N --engines M` starts N engines and hands this controller the
specs of all M (`spares`). Every `interval_s` it reads each engine's `/metrics` (parsed by the
operator's `ScrapeSource`), asks `pool_plan.plan` what to do, and does it: an engine started
(its own port, cores and log, as `up` would have started it), a drain begun or taken back (the
gateway's roster file, `gateway.file_discovery`), a drained engine stopped. Each pass is a line
of `<run_dir>/pool.jsonl`, and the operator's own metrics (`interlude_operator_*`, pool
`local/engines`) are served on `metrics_port`, so the dashboards show the decisions beside the
numbers that moved them.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from interlude.gateway.file_discovery import write_roster
from interlude.stack.pool_plan import LocalEngine, PoolPass, plan
from interlude.stack.procs import Part, PartSpec, stop_group
from interlude.stack.specs import ROSTER
from interlude_operator import telemetry
from interlude_operator.decide import History
from interlude_operator.metrics import EngineReading
from interlude_operator.scrape import ScrapeSource
from interlude_operator.spec import Scaling, Targets

if TYPE_CHECKING:
    from interlude.stack.supervise import Supervisor
    from interlude.stack.up import StackState

NAMESPACE, POOL = "local", "engines"  # the pool's labels on the operator's metrics
PASSES = "pool.jsonl"


@dataclass(frozen=True)
class PoolConfig:
    """The rule's bounds, windows and targets (the operator's `Scaling` and `Targets`) and how
    often a pass runs."""

    scaling: Scaling
    targets: Targets = field(default_factory=Targets)
    interval_s: float = 2.0
    read_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("interval_s and read_timeout_s must be > 0")

    @classmethod
    def between(
        cls, least: int, most: int, up_window_s: float, down_window_s: float, targets: str
    ) -> PoolConfig:
        """`least` to `most` engines, the windows, and `targets` as `parse_targets` reads
        them; ValueError naming what is wrong."""
        scaling = Scaling(least, most, up_window_s=up_window_s, down_window_s=down_window_s)
        return cls(scaling, parse_targets(targets))


TARGET_NAMES = {
    "kvUsage": "kv_usage",
    "contendedWaste": "contended_waste",
    "queueDepth": "queue_depth",
}


def parse_targets(text: str) -> Targets:
    """`Targets` from "kvUsage=0.5,queueDepth=4" (the EnginePool's names; others default);
    ValueError naming what is wrong."""
    values: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in TARGET_NAMES:
            raise ValueError(f"unknown target {name!r}: one of {', '.join(TARGET_NAMES)}")
        try:
            values[TARGET_NAMES[name]] = float(value)
        except ValueError:
            raise ValueError(f"target {name} needs a number, got {value!r}") from None
    return Targets(**values)


@dataclass
class _Engine:
    spec: PartSpec
    url: str
    local: LocalEngine


class LocalPool:
    """Scales the stack's engines between the config's bounds.

    Side effects: engine processes (started through `watch`, which a supervisor restarts if
    they die, and stopped after `unwatch`), the roster file, one JSON line per pass, the
    operator's gauges. Invariant: the roster names exactly the engines this pool runs, and an
    engine is stopped only once its drain is over (`pool_plan`).
    """

    def __init__(
        self,
        config: PoolConfig,
        run_dir: Path,
        running: Sequence[tuple[PartSpec, str]],
        spares: Sequence[tuple[PartSpec, str]],
        watch: Callable[[PartSpec], Part],
        unwatch: Callable[[str], Part | None],
        say: Callable[[str], None],
    ) -> None:
        self.config = config
        self.roster = run_dir / ROSTER
        self.passes = run_dir / PASSES
        self.watch, self.unwatch, self.say = watch, unwatch, say
        now = _wall()
        self.engines = [_Engine(s, url, LocalEngine(s.name, now, False)) for s, url in running]
        self.spares = list(spares)
        self.history = History()
        self.source = ScrapeSource(rate_window_s=30.0)
        self.started_at = time.monotonic()
        self._next = 0.0
        self._last_code = ""
        self.write_roster()

    @classmethod
    def for_stack(
        cls,
        config: PoolConfig,
        state: StackState,
        parts: Sequence[Part],
        spares: Sequence[tuple[PartSpec, str]],
        supervisor: Supervisor,
        say: Callable[[str], None],
    ) -> LocalPool:
        """The pool of a stack `up` started (`parts`, `spares`), its engines supervised by
        `supervisor` (`supervise.supervisor_for`, which keeps the state file naming them)."""
        engines = [p for p in parts if p.spec.name.startswith("engine-")]
        running = [(p.spec, url) for p, url in zip(engines, state.engines, strict=True)]
        run_dir = Path(state.run_dir)
        return cls(config, run_dir, running, spares, supervisor.watch, supervisor.unwatch, say)

    def at_rest(self, engines: int) -> bool:
        """Whether exactly `engines` engines run and none is draining."""
        live = self.engines
        return len(live) == engines and all(e.local.draining_since is None for e in live)

    def write_roster(self) -> None:
        urls = [e.url for e in self.engines]
        draining = [e.url for e in self.engines if e.local.draining_since is not None]
        write_roster(self.roster, urls, draining)

    def tick(self) -> None:
        """Run a pass if one is due (called often, from the supervising loop)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.config.interval_s
        self.step(now)

    def step(self, now: float) -> PoolPass:
        """One pass: read, plan, act, record."""
        readings = self._read()
        for e in self.engines:
            e.local = replace(e.local, ready=e.spec.ready())
        wall = _wall()
        locals_ = [e.local for e in self.engines]
        cfg = self.config
        todo, self.history = plan(
            locals_, readings, self.history, now, wall, cfg.scaling, cfg.targets
        )
        self._act(todo, wall)
        self._record(todo, readings, now)
        return todo

    def _act(self, todo: PoolPass, wall: dt.datetime) -> None:
        why = todo.decision.reason
        for e in self.engines:
            if e.local.name in todo.undrain:
                e.local = replace(e.local, draining_since=None)
                self.say(f"pool: {e.local.name} serves again, its drain taken back ({why})")
            elif e.local.name in todo.drain:
                e.local = replace(e.local, draining_since=wall)
                self.say(f"pool: draining {e.local.name} ({why})")
        for _ in range(min(todo.start, len(self.spares))):
            spec, url = self.spares.pop(0)
            self.watch(spec)
            self.engines.append(_Engine(spec, url, LocalEngine(spec.name, wall, False)))
            self.say(f"pool: starting {spec.name} at {url} ({why})")
        stopping = dict(todo.stop)
        for e in [e for e in self.engines if e.local.name in stopping]:
            self.engines.remove(e)
            self.write_roster()  # out of the gateway's pool before the process goes
            part = self.unwatch(e.local.name)
            if part is not None:
                stop_group(part.pid)
            self.spares.insert(0, (e.spec, e.url))
            self.say(f"pool: stopped {e.local.name}: {stopping[e.local.name]}")
        self.write_roster()

    def _read(self) -> dict[str, EngineReading]:
        """Each engine's reading (those that did not answer are left out)."""
        timeout = self.config.read_timeout_s
        with ThreadPoolExecutor(max(1, len(self.engines))) as ex:
            texts = list(ex.map(lambda e: _get(e.url + "/metrics", timeout), self.engines))
        return {
            e.local.name: self.source.parse(e.local.name, text)
            for e, text in zip(self.engines, texts, strict=True)
            if text is not None
        }

    def _record(self, todo: PoolPass, readings: dict[str, EngineReading], now: float) -> None:
        serving = [e for e in self.engines if e.local.draining_since is None]
        counts = {
            "serving": len(serving),
            "ready": sum(e.local.ready for e in serving),
            "draining": len(self.engines) - len(serving),
        }
        telemetry.record_pass(
            NAMESPACE,
            POOL,
            desired=todo.decision.desired,
            direction=todo.decision.direction,
            observed=todo.observation,
            targets=self.config.targets,
            **counts,
        )
        if todo.decision.code != self._last_code:
            self._last_code = todo.decision.code
            self.say(f"pool: {todo.decision.direction}, {todo.decision.reason}")
        line = {
            "t": round(now - self.started_at, 3),
            **counts,
            "desired": todo.decision.desired,
            "direction": todo.decision.direction,
            "reason": todo.decision.reason,
            "observed": asdict(todo.observation),
            "engines": {
                name: {"kv_usage": r.kv_usage, "waiting": r.queue_depth, "unfinished": r.unfinished}
                for name, r in readings.items()
            },
        }
        with self.passes.open("a") as f:
            f.write(json.dumps(line) + "\n")


def _get(url: str, timeout_s: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except (OSError, ValueError):
        return None  # an engine that does not answer is left out, not read as idle


def _wall() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
