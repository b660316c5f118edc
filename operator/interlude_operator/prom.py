"""Reading the engines through Prometheus's HTTP API (`GET /api/v1/query`, instant queries).

Series are matched to pods by the `namespace` and `pod` target labels, the ones the Prometheus
Operator's PodMonitor and the usual Kubernetes scrape configs attach. One query per metric, all
pods of the pool at once; the contended waste is `rate()` over `rate_window`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import aiohttp

from interlude.api.cluster import CONTENDED_WASTE_METRIC, POOL_GB_METRIC, SESSIONS_METRIC
from interlude_operator.metrics import (
    KV_USAGE,
    WAITING,
    WAITING_BY_REASON,
    WAITING_REASON,
    EngineReading,
    MetricsError,
    Target,
)


class PrometheusSource:
    """`MetricsSource` over one Prometheus server.

    Side effects: HTTP GETs to `url`; owns an aiohttp session until `close`.
    """

    def __init__(self, url: str, rate_window: str = "1m", timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must be http(s), got {url!r}")
        self.url = url.rstrip("/")
        self.rate_window = rate_window
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def queries(self, namespace: str, pods: Sequence[str]) -> dict[str, str]:
        """The PromQL of each metric, restricted to `pods` of `namespace`."""
        sel = f'namespace="{_quote(namespace)}",pod=~"{"|".join(_regex(p) for p in pods)}"'
        waste = CONTENDED_WASTE_METRIC
        return {
            "kv": f"max by (pod) ({KV_USAGE}{{{sel}}})",
            # Requests waiting for room to run, else (an engine without the reasons) all.
            "waiting": (
                f'sum by (pod) ({WAITING_BY_REASON}{{{sel},reason="{WAITING_REASON}"}}) '
                f"or sum by (pod) ({WAITING}{{{sel}}})"
            ),
            "waste": f"sum by (pod) (rate({waste}_total{{{sel}}}[{self.rate_window}]))",
            "pool": f"max by (pod) ({POOL_GB_METRIC}{{{sel}}})",
            "sessions": f"sum by (pod, state) ({SESSIONS_METRIC}{{{sel}}})",
        }

    async def read(self, namespace: str, targets: Sequence[Target]) -> dict[str, EngineReading]:
        if not targets:
            return {}
        queries = self.queries(namespace, [t.pod for t in targets])
        results = await asyncio.gather(*(self._query(q) for q in queries.values()))
        by = dict(zip(queries, results, strict=True))
        kv, waiting, waste, pool = (_by_pod(by[k]) for k in ("kv", "waiting", "waste", "pool"))
        sessions: dict[str, dict[str, float]] = {}
        for series in by["sessions"]:
            pod, state = series["metric"].get("pod", ""), series["metric"].get("state", "")
            sessions.setdefault(pod, {})[state] = _value(series)
        out: dict[str, EngineReading] = {}
        for t in targets:
            if t.pod not in kv and t.pod not in waiting and t.pod not in sessions:
                continue  # not scraped (yet): the engine is left out, not read as idle
            share = None
            if t.pod in waste and pool.get(t.pod, 0.0) > 0:
                share = waste[t.pod] / pool[t.pod]
            out[t.pod] = EngineReading(
                kv_usage=kv.get(t.pod),
                queue_depth=waiting.get(t.pod),
                contended_waste=share,
                sessions=sessions.get(t.pod, {}),
            )
        return out

    async def _query(self, promql: str) -> list[dict[str, Any]]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        try:
            async with self._session.get(
                f"{self.url}/api/v1/query", params={"query": promql}
            ) as resp:
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise MetricsError(f"Prometheus at {self.url} did not answer: {exc!r}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            raise MetricsError(f"Prometheus refused {promql!r}: {error}")
        result = body["data"]["result"]
        return list(result) if isinstance(result, list) else []

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _by_pod(series: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in series:
        value = _value(s)
        if not math.isnan(value):
            out[s["metric"].get("pod", "")] = value
    return out


def _value(series: dict[str, Any]) -> float:
    return float(series["value"][1])


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _regex(text: str) -> str:
    # Pod names are DNS labels (a-z, 0-9, '-', '.'): only the dot needs escaping, twice
    # (once for the regex, once for the PromQL string).
    return _quote(text.replace(".", "\\."))
