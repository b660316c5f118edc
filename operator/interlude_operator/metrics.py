"""What the operator reads of each engine, and the seam its two readers implement.

The names are the engine's own exports: KV usage and the waiting queue from vLLM's stat logger,
sessions by state and the contended waste counter from Interlude (named in
`interlude.api.cluster`, which `engine/metrics.py` exports them by). The contended waste is a
counter of GB x s; as a share of the pool it is its rate over the pool's size,
`interlude:kv_pool_gb`, a gauge the engine must export for this metric to be read (without it
the metric reads as absent and the others decide).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from interlude_operator.decide import Observation

KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge, 0..1 of the KV pool in use
WAITING = "vllm:num_requests_waiting"  # gauge, requests queued for the engine
# The same queue by reason: "capacity" waits for room to run; "deferred" is blocked, and on an
# Interlude engine that is every session parked at a tool call (it waits in vLLM's queue for
# its answer). Queue depth is the "capacity" share where an engine exports it (vLLM >= 0.32),
# else the whole queue: a pool whose sessions sit at tool calls is not a pool under load.
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
WAITING_REASON = "capacity"

# Session states that still need their engine: a draining engine is done when none is left.
UNFINISHED = ("queued", "generating", "awaiting_tool", "awaiting_client")
PAUSED = ("awaiting_tool", "awaiting_client")


@dataclass(frozen=True)
class EngineReading:
    """One engine's numbers; None where the engine did not report that metric."""

    kv_usage: float | None = None
    queue_depth: float | None = None
    contended_waste: float | None = None  # share of the pool, per second
    sessions: Mapping[str, float] = field(default_factory=dict)  # by state

    def __post_init__(self) -> None:
        for name in ("kv_usage", "queue_depth", "contended_waste"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    @property
    def reported(self) -> bool:
        return self.kv_usage is not None or self.queue_depth is not None

    @property
    def unfinished(self) -> int | None:
        """Sessions that still need this engine (None: the engine reports no sessions)."""
        if not self.sessions and not self.reported:
            return None
        return int(sum(self.sessions.get(s, 0) for s in UNFINISHED))

    @property
    def paused(self) -> int:
        return int(sum(self.sessions.get(s, 0) for s in PAUSED))


@dataclass(frozen=True)
class Target:
    """An engine pod to read: its name (Prometheus's `pod` label) and address."""

    pod: str
    ip: str
    port: int

    def __post_init__(self) -> None:
        if not self.pod:
            raise ValueError("pod must be named")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be within [1, 65535], got {self.port}")


class MetricsError(RuntimeError):
    """The metrics could not be read at all (Prometheus down, a bad query): not one engine."""


class MetricsSource(Protocol):
    """Reads the engines' numbers.

    Side effects: network reads only (Prometheus's HTTP API, or each engine's /metrics); a
    scraping source also remembers each engine's last counter values to turn them into rates.
    Engines that do not answer are left out of the result; MetricsError if nothing could be
    read because the source itself failed.
    """

    async def read(self, namespace: str, targets: Sequence[Target]) -> dict[str, EngineReading]: ...

    async def close(self) -> None: ...


def observe(readings: Sequence[EngineReading]) -> Observation:
    """The means the rule decides on, over the engines that reported."""

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.fmean(present) if present else None

    reported = [r for r in readings if r.reported]
    return Observation(
        kv_usage=mean([r.kv_usage for r in reported]),
        contended_waste=mean([r.contended_waste for r in reported]),
        queue_depth=mean([r.queue_depth for r in reported]),
        engines=len(reported),
    )
