"""The engines behind the gateway: which are ready, how loaded, and where a new session goes.

Engines come from a `Discovery` (a static list, or a Kubernetes Service's EndpointSlices). A
background loop reads each engine's `GET /v1/load` every `interval_s`; `failures` missed reads
in a row take an engine out of the pool (its paused sessions then fall back to recompute), and
one good read brings it back. A continuation goes to the engine named by the tool-call ids it
answers (`by_tag`). A new conversation goes to the better of two engines drawn at random
among the ready ones serving its model (power of two choices, as TetriInfer places decodes):
the score adds KV usage, contended waste and queue depth, so neither a full engine nor a
waiting queue attracts more work, and an engine that generates markedly slower per token (its
median inter-token latency over `SLOWER` times the other's: a starved core, a noisy neighbour)
has its score weighted by how much slower it is. Engines the operator is draining get no new
session (when every engine of the model is draining, a new session gets a 503) but stay in the
pool; paused sessions keep their engine, draining or not.

Roles (`api.engine.ENGINE_ROLES`, each engine's own in `/v1/load`): a prefill engine gets no
session (unless every engine of the model is one); a new session placed on a decode engine has
its prompt prefilled by the better of two random prefill engines by prompt tokens queued
(`choose_prefill`, TetriInfer's prefill placement), the tokens of prompts sent since the last
read counted in (estimated from the body's size).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from interlude.api.load import placement_score
from interlude.api.names import engine_tag
from interlude.gateway.upstream import EngineError, Upstream

log = logging.getLogger(__name__)

# How much slower per token one engine must be than the other before placement weighs speed:
# below it, differences are noise between alike engines, and loads alone decide.
SLOWER = 1.5


class Discovery(Protocol):
    """Where the engines are. `urls` may do I/O; it is called once per poll. `draining` (no
    I/O) names those of the last `urls` that get no new session: an operator is draining
    them, and their paused sessions still resume there."""

    async def urls(self) -> list[str]: ...

    def draining(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class StaticDiscovery:
    engines: tuple[str, ...]

    async def urls(self) -> list[str]:
        return list(self.engines)

    def draining(self) -> frozenset[str]:
        return frozenset()


def discover(
    engines: tuple[str, ...], engine_service: str, engine_port: int, engines_file: str = ""
) -> Discovery:
    """The engines' `Discovery`: a Kubernetes Service's EndpointSlices when `engine_service`
    ("namespace/name") is set, a roster file when `engines_file` is (either with `engines`
    beside them), else the static `engines`."""
    if engines_file:
        from interlude.gateway.file_discovery import FileDiscovery

        return FileDiscovery(engines_file, engines)
    if engine_service:
        from interlude.gateway.discovery import EndpointSliceDiscovery

        namespace, name = engine_service.split("/")
        return EndpointSliceDiscovery(namespace, name, engine_port, engines)
    return StaticDiscovery(engines)


@dataclass
class EngineState:
    """What the gateway last read from one engine (mutable: owned by `EngineRoster`)."""

    url: str
    ready: bool = False
    failures: int = 0
    load: dict[str, Any] = field(default_factory=dict)
    seen_at: float = 0.0
    # Sessions sent here since the last read: the load read is up to one poll old, and without
    # this a burst of new sessions would all go to the engine that looked idlest then.
    routed: int = 0
    draining: bool = False  # being drained: resumes only, no new session
    routed_prefill_tokens: int = 0  # prompt tokens sent here to prefill since the last read

    @property
    def model(self) -> str:
        return str(self.load.get("model", ""))

    @property
    def tag(self) -> str:
        """The tag this engine writes into its tool-call ids (`api.names.engine_tag`)."""
        engine_id = str(self.load.get("engine_id", ""))
        return engine_tag(engine_id) if engine_id else ""

    def score(self) -> float:
        """Lower is better: KV in use, waste while others wait, and the queue per slot."""
        return placement_score(
            float(self.load.get("kv_usage", 0.0)),
            float(self.load.get("contended_waste", 0.0)),
            float(self.load.get("waiting", 0)) + self.routed,
            float(self.load.get("max_num_seqs", 64)),
        )

    @property
    def role(self) -> str:
        return str(self.load.get("role", "mixed"))

    def queue_share(self) -> float:
        """Requests waiting per slot: those queued at the last read and those sent since."""
        slots = max(1.0, float(self.load.get("max_num_seqs", 64)))
        return (float(self.load.get("waiting", 0)) + self.routed) / slots

    def prefill_backlog(self) -> int:
        """Prompt tokens this prefill engine has to compute: queued at the last read, plus
        those sent since."""
        return int(self.load.get("queued_prefill_tokens", 0)) + self.routed_prefill_tokens

    @property
    def itl_ms(self) -> float:
        """The engine's median inter-token latency lately (`/v1/load`); 0 = none reported."""
        return float(self.load.get("itl_ms", 0.0))


def better(a: EngineState, b: EngineState) -> EngineState:
    """The one of `a` and `b` a new session should go to: the lower score, each score (plus
    one, so that idle engines compare too) multiplied by its engine's slowness relative to the
    other when one is over `SLOWER` times slower per token; ties go to `a`."""
    pace_a = pace_b = 1.0
    if a.itl_ms > 0 and b.itl_ms > 0:
        if a.itl_ms > SLOWER * b.itl_ms:
            pace_a = a.itl_ms / b.itl_ms
        elif b.itl_ms > SLOWER * a.itl_ms:
            pace_b = b.itl_ms / a.itl_ms
    return a if (1 + a.score()) * pace_a <= (1 + b.score()) * pace_b else b


class NoEngine(LookupError):
    """No ready engine serves the model (HTTP 503, or 404 if no engine serves it at all)."""

    def __init__(self, message: str, known_model: bool) -> None:
        super().__init__(message)
        self.known_model = known_model


class EngineRoster:
    """Ready engines and their load.

    Side effects: `start` runs the poll loop until `close`. Invariant: `choose` returns only
    engines whose last `failures` reads did not all fail and that reported ready.
    """

    def __init__(
        self,
        discovery: Discovery,
        upstream: Upstream,
        interval_s: float = 2.0,
        failures: int = 2,
        rng: random.Random | None = None,
    ) -> None:
        self.discovery = discovery
        self.upstream = upstream
        self.interval_s = interval_s
        self.failures = failures
        self.engines: dict[str, EngineState] = {}
        self.rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine-pool")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_polled(self, timeout_s: float) -> None:
        """Wait for the first complete poll (start-up), at most `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._polled.wait(), timeout_s)

    def ready(self) -> list[EngineState]:
        return [e for e in self.engines.values() if e.ready]

    def is_ready(self, url: str) -> bool:
        e = self.engines.get(url)
        return e is not None and e.ready

    def models(self) -> list[str]:
        return sorted({e.model for e in self.ready() if e.model})

    def by_tag(self, tag: str, model: str) -> EngineState | None:
        """The ready engine of `model` whose tool-call ids carry `tag`, draining or not (a
        paused session resumes where its KV is); None if no such engine is in the pool."""
        for e in self.engines.values():
            if e.ready and e.model == model and e.tag == tag:
                return e
        return None

    def candidates(
        self, model: str, avoid: frozenset[str] = frozenset(), within: frozenset[str] | None = None
    ) -> list[EngineState]:
        """The engines a new session of `model` may go to: ready ones in `within` (None: all)
        that are not draining and not prefill engines (unless all are), none in `avoid`
        (engines this request could not reach) while another remains. NoEngine when there is
        none, also when every one is draining: a new session there would hold up the drain
        (and a pool scaling to zero would never get there), so the client retries instead."""
        ready = [e for e in self.ready() if within is None or e.url in within]
        ready = [e for e in ready if e.url not in avoid] or ready
        serving = [e for e in ready if e.model == model]
        if serving and all(e.draining for e in serving):
            raise NoEngine(f"every ready engine serving {model!r} is draining", True)
        serving = [e for e in serving if not e.draining]
        serving = [e for e in serving if e.role != "prefill"] or serving
        if not serving:
            known = any(e.model == model for e in self.engines.values())
            raise NoEngine(
                f"no ready engine serves model {model!r}"
                + (f" (ready models: {', '.join(self.models())})" if ready else ""),
                known or not ready,
            )
        return serving

    def choose(
        self, model: str, avoid: frozenset[str] = frozenset(), within: frozenset[str] | None = None
    ) -> EngineState:
        """The engine for a new session of `model`: the better of two random `candidates`."""
        return self.pick(self.candidates(model, avoid, within))

    def pick(self, serving: list[EngineState]) -> EngineState:
        """The better of two random engines of `serving` (not empty), counted as sent one."""
        chosen = serving[0] if len(serving) == 1 else better(*self.rng.sample(serving, 2))
        chosen.routed += 1
        return chosen

    def choose_prefill(self, decode: EngineState, tokens: int) -> EngineState | None:
        """Where the prompt (about `tokens` long) of a new session placed on `decode` is
        prefilled: None for a mixed engine (it prefills its own) or when no prefill engine of
        its model is ready and not draining; else the one of two random prefill engines with
        the smaller backlog (ties: the first drawn)."""
        if decode.role != "decode":
            return None
        pool = [
            e
            for e in self.ready()
            if e.model == decode.model and e.role == "prefill" and not e.draining
        ]
        if not pool:
            return None
        pair = pool if len(pool) == 1 else self.rng.sample(pool, 2)
        chosen = min(pair, key=EngineState.prefill_backlog)
        chosen.routed_prefill_tokens += tokens
        return chosen

    async def poll(self) -> None:
        """Read every engine's load once (concurrently) and update the pool."""
        urls = await self.discovery.urls()
        for gone in set(self.engines) - set(urls):
            log.info("engine %s left the pool (no longer discovered)", gone)
            del self.engines[gone]
        draining = self.discovery.draining()
        for url in urls:
            self.engines.setdefault(url, EngineState(url)).draining = url in draining
        await asyncio.gather(*(self._read(self.engines[u]) for u in urls))

    async def _read(self, e: EngineState) -> None:
        try:
            load = await self.upstream.load(e.url, timeout_s=max(0.5, self.interval_s))
        except EngineError as exc:
            e.failures += 1
            if e.ready and e.failures >= self.failures:
                log.warning("engine %s left the pool: %s", e.url, exc)
                e.ready = False
            return
        was = e.ready
        e.failures, e.load, e.seen_at, e.routed = 0, load, time.time(), 0
        e.routed_prefill_tokens = 0
        e.ready = bool(load.get("ready", True))
        if e.ready and not was:
            log.info("engine %s (%s) joined the pool", e.url, e.model)

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # discovery failures must not stop polling the known engines
                log.exception("engine discovery failed")
            self._polled.set()
            await asyncio.sleep(self.interval_s)


def summary(engines: Sequence[EngineState], addresses: bool = False) -> list[dict[str, Any]]:
    """What `/ready` shows of each engine: its state, and (`addresses`) its URL and score."""
    out: list[dict[str, Any]] = []
    for e in engines:
        state: dict[str, Any] = {
            "ready": e.ready,
            "draining": e.draining,
            "model": e.model,
            "role": e.role,
        }
        if addresses:
            state |= {"url": e.url, "score": round(e.score(), 4)}
        out.append(state)
    return out
