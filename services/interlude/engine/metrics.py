"""`interlude:*` Prometheus metrics, fed from the scheduler's counters.

The scheduler runs in vLLM's engine-core process; its counters reach this process inside
`SchedulerStats.kv_connector_stats[STATS_KEY]` (see `InterludeScheduler.make_stats`), and
`InterludeStatLogger`, a vLLM stat logger, turns them into metrics beside vLLM's own `vllm:*`
ones in the default registry. Counters arrive cumulative; we add the difference, when
`/metrics` is read and at most every `MIRROR_S` in between, not on every step: mirroring them
was the largest part of the logger's per-step work, on the event loop that streams the tokens.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from vllm.v1.metrics.loggers import StatLoggerBase

from interlude.api.cluster import CONTENDED_WASTE_METRIC, POOL_GB_METRIC, SESSIONS_METRIC

# The same bound as the engine core's: turn starts kept until their sessions read them.
from interlude.enginecore.parking import MAX_TURN_STARTS
from interlude.enginecore.swap import STATS_KEY

PAUSED = Gauge("interlude:paused_requests", "Parked requests by KV strategy", ["strategy"])
WASTE = Counter("interlude:kv_waste_gb_seconds", "GB x s of GPU KV held by paused requests")
WASTE_CONTENDED = Counter(
    CONTENDED_WASTE_METRIC,
    "The part of the KV waste held while requests waited in the queue (what scaling reads)",
)
RESUMED = Counter(
    "interlude:resumed_context_tokens",
    "Context tokens parked requests held when they resumed (minus recompute: not re-prefilled)",
)
WASTE_RATIO = Gauge("interlude:kv_waste_ratio", "Paused-held share of used GPU KV (GB x s)")
# The pool's size, so a rate of waste (GB x s per s) reads as a share of it (the operator's
# contended-waste target).
POOL_GB = Gauge(POOL_GB_METRIC, "GB of GPU memory in this engine's KV pool")
RECOMPUTE = Counter(
    "interlude:recompute_tokens", "Tokens recomputed after a discard or preemption", ["reason"]
)
SWAP = Counter("interlude:swap_bytes", "KV bytes copied between GPU and host", ["direction"])
INTERCEPTS = Counter("interlude:interceptions", "Turns that ended at a tool call", ["tool"])
TOOL_WAIT = Histogram(
    "interlude:tool_wait_seconds",
    "Seconds a paused request waited for its tool",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
RESUME_WAIT = Counter(
    "interlude:resume_wait_seconds",
    "Seconds resumed turns waited from the tool's answer to their first scheduled step",
    ["via"],  # how the KV came back: preserve, swap, prefix-cache, recompute
)
RESUME_WAITS = Counter("interlude:resume_waits", "Resumed turns counted in resume_wait", ["via"])
# The same waits one by one, for their percentiles: a turn whose KV stayed on the GPU should
# start within a step of its answer reaching the scheduler.
RESUME_START = Histogram(
    "interlude:resume_start_seconds",
    "Seconds from a tool's answer reaching the scheduler to the resumed turn's first step",
    ["via"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)
STEP_TIME = Counter(
    "interlude:scheduler_seconds",
    "Wall seconds in scheduler steps: vLLM's own scheduling, and ours (policy, moves, counts)",
    ["part"],
)
STEPS = Counter("interlude:scheduler_steps", "Scheduler steps")
SWAP_IN_STEPS = Counter(
    "interlude:swap_in_steps", "Scheduler steps that copied KV blocks back from host memory"
)

PROMPT_TOKENS = Counter(
    "interlude:prompt_tokens",
    "Prompt tokens by where their KV came from: computed here, this engine's prefix cache, "
    "or a peer engine's prefill (the host link)",
    ["source"],
)
# vLLM's `PromptTokenStats` fields, each exported as its own source label.
PROMPT_SOURCES = ("computed", "local_cache_hit", "external_kv_transfer")

ROLE = Gauge(
    "interlude:engine_role",
    "1 for the role this engine holds now (api.engine.ENGINE_ROLES)",
    ["role"],
)
ROLE_CHANGES = Counter("interlude:role_changes", "Role flips of this engine, by new role", ["to"])

SESSIONS = Gauge(SESSIONS_METRIC, "Live chat sessions of this engine by state", ["state"])

# Inter-token latencies kept for the engine's speed (`/v1/load`'s itl_ms): at most this many,
# none older than this. An engine that has generated nothing for the last seconds reports no
# speed (0), not the one it had under its last load: a stale figure would keep new sessions
# away from an engine whose only way to show it is fast again is to get one.
ITL_WINDOW = 256
ITL_WINDOW_S = 10.0
# Fewer gaps than this in the window report no speed: the median of a handful is noise (on a
# shared 2-core machine one short answer's gaps may differ 1.5x between alike engines, and the
# gateway then sends every new session to the other engine).
ITL_MIN_SAMPLES = 32
# Seconds the scheduler's metrics may lag its counters between two reads of `/metrics` (which
# mirrors them first).
MIRROR_S = 1.0


class InterludeStatLogger(StatLoggerBase):
    """Keeps the latest scheduler counters (`latest`) and mirrors them into Prometheus."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.latest: dict[str, Any] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        # Caller request id -> how its latest resumed turn started (kv return, wait s).
        self._turn_starts: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._itls: deque[tuple[float, float]] = deque(maxlen=ITL_WINDOW)  # (when, seconds)
        self.prompt_tokens = dict.fromkeys(PROMPT_SOURCES, 0)
        self._prompt_metrics = {s: PROMPT_TOKENS.labels(s) for s in PROMPT_SOURCES}
        self._mirrored = 0.0  # when `mirror` last ran (monotonic)
        self._unobserved: list[tuple[str, float]] = []  # turn starts `mirror` has not observed

    def take_turn_start(self, request_id: str) -> tuple[str, float] | None:
        """How `request_id`'s latest resumed turn got its KV back and how long it waited to be
        scheduled, once (None: not reported yet, or not on our scheduler)."""
        with self._lock:
            return self._turn_starts.pop(request_id, None)

    def _add(self, metric: Any, key: tuple[str, str], value: float) -> None:
        delta = value - self._seen.get(key, 0.0)
        self._seen[key] = value
        if delta > 0:
            metric.inc(delta)

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if iteration_stats is not None:
            self._record_iteration(iteration_stats)
        if scheduler_stats is None:
            return
        pc = scheduler_stats.prefix_cache_stats
        with self._lock:
            self.prefix_queries += pc.queries
            self.prefix_hits += pc.hits
        data = (scheduler_stats.kv_connector_stats or {}).get(STATS_KEY)
        if not data:
            return
        data = data | {
            "kv_cache_usage": scheduler_stats.kv_cache_usage,
            "num_running": scheduler_stats.num_running_reqs,
            "num_waiting": scheduler_stats.num_waiting_reqs,
        }
        with self._lock:
            self.latest = data
            for rid, (how, wait) in data.get("turn_starts", {}).items():
                self._turn_starts[rid] = (str(how), float(wait))
                self._unobserved.append((str(how), float(wait)))
            while len(self._turn_starts) > MAX_TURN_STARTS:
                self._turn_starts.popitem(last=False)
        if time.monotonic() - self._mirrored >= MIRROR_S:
            self.mirror()

    def mirror(self) -> None:
        """Bring the scheduler's `interlude:*` metrics up to its latest counters (cumulative,
        so however seldom this runs, nothing is lost). `/metrics` calls it before it writes, and
        the engine when it shuts down (another engine in the process may be read later)."""
        with self._lock:
            data = self.latest
            self._mirrored = time.monotonic()
            starts, self._unobserved = self._unobserved, []
        # With the counters, not before them: each wait in the histogram is one in
        # `resume_waits`, whenever Prometheus reads them.
        for how, wait in starts:
            RESUME_START.labels(how).observe(wait)
        if not data:
            return
        POOL_GB.set(float(data.get("gpu_kv_gb", 0.0)))
        for strategy, n in data["paused"].items():
            PAUSED.labels(strategy).set(n)
        self._add(WASTE, ("waste", ""), data["waste_gb_s"])
        self._add(WASTE_CONTENDED, ("waste_contended", ""), data["waste_contended_gb_s"])
        self._add(RESUMED, ("resumed", ""), data["resumed_tokens"])
        if data["used_gb_s"] > 0:
            WASTE_RATIO.set(data["waste_gb_s"] / data["used_gb_s"])
        for reason, n in data["recompute_tokens"].items():
            self._add(RECOMPUTE.labels(reason), ("recompute", reason), n)
        for direction, n in data["swap_bytes"].items():
            self._add(SWAP.labels(direction), ("swap", direction), n)
        for tool, n in data["interceptions"].items():
            self._add(INTERCEPTS.labels(tool), ("tool", tool), n)
        for via, s in data["resume_wait_s"].items():
            self._add(RESUME_WAIT.labels(via), ("resume_wait", via), s)
            self._add(RESUME_WAITS.labels(via), ("resume_waits", via), data["resume_waits"][via])
        self._add(STEP_TIME.labels("vllm"), ("step", "vllm"), data["vllm_s"])
        self._add(
            STEP_TIME.labels("interlude"), ("step", "interlude"), data["step_s"] - data["vllm_s"]
        )
        self._add(STEPS, ("steps", ""), data["steps"])
        self._add(SWAP_IN_STEPS, ("swap_in_steps", ""), data.get("swap_in_steps", 0))

    def _record_iteration(self, iteration_stats: Any) -> None:
        now = time.monotonic()
        tokens = iteration_stats.prompt_token_stats
        with self._lock:
            self._itls.extend((now, s) for s in iteration_stats.inter_token_latencies_iter)
            for source in PROMPT_SOURCES:
                n = int(getattr(tokens, source))
                self.prompt_tokens[source] += n
                if n:
                    self._prompt_metrics[source].inc(n)

    def log_engine_initialized(self) -> None:
        return

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out = dict(self.latest)
            out["prefix_cache_queries"] = self.prefix_queries
            out["prefix_cache_hits"] = self.prefix_hits
            out["itl_ms"] = self._itl_ms(time.monotonic())
            out["prompt_tokens"] = dict(self.prompt_tokens)
            return out

    def _itl_ms(self, now: float) -> float:
        """The median of the recent inter-token latencies, ms; 0 with fewer than
        `ITL_MIN_SAMPLES` in the window. The median: a turn that resumes after a tool call adds
        one gap as long as the tool took, which says nothing about the engine's speed."""
        recent = [s for when, s in self._itls if now - when <= ITL_WINDOW_S]
        return 1000 * statistics.median(recent) if len(recent) >= ITL_MIN_SAMPLES else 0.0
