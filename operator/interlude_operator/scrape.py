"""Reading the engines directly, when no Prometheus is configured: `GET /metrics` of each pod.

The text is parsed with prometheus_client's own parser. Gauges are read as they are; the
contended-waste counter becomes a rate from this source's own earlier scrapes of the same pod
(the first scrape of a pod has no rate yet), over about `rate_window_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from interlude.api.cluster import CONTENDED_WASTE_METRIC, POOL_GB_METRIC, SESSIONS_METRIC
from interlude_operator.metrics import (
    KV_USAGE,
    WAITING,
    WAITING_BY_REASON,
    WAITING_REASON,
    EngineReading,
    Target,
)


class ScrapeSource:
    """`MetricsSource` that scrapes each engine pod.

    Side effects: one HTTP GET per pod per `read`; remembers each pod's recent counter values
    (forgotten when a pod is no longer among the targets).
    """

    def __init__(
        self,
        rate_window_s: float = 60.0,
        timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_window_s <= 0:
            raise ValueError(f"rate_window_s must be > 0, got {rate_window_s}")
        self.rate_window_s = rate_window_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._counters: dict[str, deque[tuple[float, float]]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def read(self, namespace: str, targets: Sequence[Target]) -> dict[str, EngineReading]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        texts = await asyncio.gather(*(self._get(t) for t in targets))
        for gone in set(self._counters) - {t.pod for t in targets}:
            del self._counters[gone]
        out: dict[str, EngineReading] = {}
        for t, text in zip(targets, texts, strict=True):
            if text is not None:
                out[t.pod] = self.parse(t.pod, text)
        return out

    def parse(self, pod: str, text: str) -> EngineReading:
        """One pod's reading from its /metrics text (and its earlier counter values)."""
        kv: list[float] = []
        waiting: list[float] = []
        for_capacity: list[float] = []
        pool: list[float] = []
        counter: float | None = None
        sessions: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == KV_USAGE:
                    kv.append(s.value)
                elif s.name == WAITING:
                    waiting.append(s.value)
                elif s.name == WAITING_BY_REASON and s.labels.get("reason") == WAITING_REASON:
                    for_capacity.append(s.value)
                elif s.name == POOL_GB_METRIC:
                    pool.append(s.value)
                elif s.name == f"{CONTENDED_WASTE_METRIC}_total":
                    counter = (counter or 0.0) + s.value
                elif s.name == SESSIONS_METRIC:
                    state = s.labels.get("state", "")
                    sessions[state] = sessions.get(state, 0.0) + s.value
        share = None
        rate = self._rate(pod, counter)
        if rate is not None and pool and max(pool) > 0:
            share = rate / max(pool)
        return EngineReading(
            kv_usage=max(kv) if kv else None,
            queue_depth=sum(queue) if (queue := for_capacity or waiting) else None,
            contended_waste=share,
            sessions=sessions,
        )

    def _rate(self, pod: str, counter: float | None) -> float | None:
        if counter is None:
            return None
        now = self.clock()
        samples = self._counters.setdefault(pod, deque())
        if samples and counter < samples[-1][1]:
            samples.clear()  # the engine restarted: its counter began again at 0
        samples.append((now, counter))
        while len(samples) > 2 and now - samples[1][0] >= self.rate_window_s:
            samples.popleft()
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None

    async def _get(self, t: Target) -> str | None:
        assert self._session is not None
        try:
            host = f"[{t.ip}]" if ":" in t.ip else t.ip  # an IPv6 pod address
            async with self._session.get(f"http://{host}:{t.port}/metrics") as resp:
                if resp.status != 200:
                    return None
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None  # an engine that does not answer is left out, not read as idle

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
