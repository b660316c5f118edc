"""The operator's own Prometheus metrics: each pool's replicas, what it read, what it decided.

Served on `--metrics-port` (the chart's PodMonitor scrapes it), so the dashboards can show a
pool's engines over time next to the numbers that moved them and the decisions it took:

* `interlude_operator_replicas{pool_namespace, pool, state}`: `desired` (spec.replicas after
  this pass), `serving`, `ready` and `draining` engines;
* `interlude_operator_observed{..., metric}` and `interlude_operator_target{..., metric}`: the
  means the last decision read (`kv_usage`, `contended_waste`, `queue_depth`) and their targets;
* `interlude_operator_decisions_total{..., direction}`: passes by outcome (up, down, hold);
* `interlude_operator_events_total{..., type, reason}`: every Kubernetes event the operator
  posted on a pool (`ScaledUp`, `DrainStarted`, `ScaledDown`, `MetricsUnavailable`, ...).

The pool's namespace is `pool_namespace`: Prometheus sets `namespace` to the operator pod's.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, start_http_server

from interlude_operator.decide import Observation
from interlude_operator.spec import Targets

POOL = ["pool_namespace", "pool"]
REPLICAS = Gauge(
    "interlude_operator_replicas",
    "Engines of an EnginePool by state: desired, serving, ready, draining",
    [*POOL, "state"],
)
OBSERVED = Gauge(
    "interlude_operator_observed",
    "Means over the serving engines that the last decision read, by metric",
    [*POOL, "metric"],
)
TARGET = Gauge(
    "interlude_operator_target", "The pool's scale-up targets, by metric", [*POOL, "metric"]
)
DECISIONS = Counter(
    "interlude_operator_decisions",
    "Reconcile passes by decision (up, down, hold)",
    [*POOL, "direction"],
)
EVENTS = Counter(
    "interlude_operator_events",
    "Kubernetes events the operator posted on a pool, by type and reason",
    [*POOL, "type", "reason"],
)


def serve(port: int) -> None:
    """Serve /metrics on all interfaces at `port` (a daemon thread); 0 serves nothing."""
    if port:
        start_http_server(port)


def record_pass(
    namespace: str,
    name: str,
    *,
    desired: int,
    serving: int,
    ready: int,
    draining: int,
    direction: str,
    observed: Observation,
    targets: Targets,
) -> None:
    """One reconcile pass's numbers."""
    pool = (namespace, name)
    for state, n in (
        ("desired", desired),
        ("serving", serving),
        ("ready", ready),
        ("draining", draining),
    ):
        REPLICAS.labels(*pool, state).set(n)
    for metric, value, target in (
        ("kv_usage", observed.kv_usage, targets.kv_usage),
        ("contended_waste", observed.contended_waste, targets.contended_waste),
        ("queue_depth", observed.queue_depth, targets.queue_depth),
    ):
        TARGET.labels(*pool, metric).set(target)
        if value is None:  # no engine reported it: no sample, rather than a false zero
            _drop(OBSERVED, (*pool, metric))
        else:
            OBSERVED.labels(*pool, metric).set(value)
    DECISIONS.labels(*pool, direction).inc()


def record_event(namespace: str, name: str, kind: str, reason: str) -> None:
    EVENTS.labels(namespace, name, kind, reason).inc()


def forget(namespace: str, name: str) -> None:
    """A deleted pool's gauges go (its counters stay until the operator restarts)."""
    for gauge, keys in (
        (REPLICAS, ("desired", "serving", "ready", "draining")),
        (OBSERVED, ("kv_usage", "contended_waste", "queue_depth")),
        (TARGET, ("kv_usage", "contended_waste", "queue_depth")),
    ):
        for key in keys:
            _drop(gauge, (namespace, name, key))


def _drop(gauge: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)
