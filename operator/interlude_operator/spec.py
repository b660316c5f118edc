"""An EnginePool's spec as frozen, validated values (the CRD in charts/interlude/crds).

The API server applies the CRD's defaults and checks its schema; this module applies the same
defaults again (an object written before a default existed, or a test's emulator, has none) and
checks what the schema cannot, so a bad pool fails with its field's name, not deep in a pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlude_operator.podsecurity import allowed_overrides

# Where the chart points the operator at Prometheus when a pool names none itself.
PROMETHEUS_URL_ENV = "INTERLUDE_PROMETHEUS_URL"

MODEL_SOURCES = ("tiny", "image", "pvc", "hf")
METRICS_SOURCES = ("prometheus", "scrape")
# `operator`: this operator's rule writes spec.replicas. `external`: KEDA or an HPA writes it
# through /scale and the operator follows (still draining before an engine goes).
SCALERS = ("operator", "external")


@dataclass(frozen=True)
class Targets:
    """Scale up when a mean over the serving engines passes one of these."""

    kv_usage: float = 0.85  # share of the KV pool in use, 0..1
    contended_waste: float = 0.1  # share of the pool held by paused requests while others queue
    queue_depth: float = 8.0  # requests waiting per engine

    def __post_init__(self) -> None:
        for name in ("kv_usage", "contended_waste"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"targets.{_camel(name)} must be within [0, 1], got {value}")
        if self.queue_depth < 0:
            raise ValueError(f"targets.queueDepth must be >= 0, got {self.queue_depth}")


@dataclass(frozen=True)
class Scaling:
    """Bounds, windows and who decides the replica count."""

    min_replicas: int
    max_replicas: int
    replicas: int | None = None  # spec.replicas: serving engines wanted now
    up_window_s: float = 30.0
    down_window_s: float = 600.0
    drain_timeout_s: float = 300.0
    scaler: str = "operator"

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"minReplicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < 1 or self.max_replicas < self.min_replicas:
            raise ValueError(
                f"maxReplicas must be >= 1 and >= minReplicas ({self.min_replicas}), "
                f"got {self.max_replicas}"
            )
        for name in ("up_window_s", "down_window_s", "drain_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.scaler not in SCALERS:
            raise ValueError(f"scaler must be one of {', '.join(SCALERS)}, got {self.scaler!r}")

    @property
    def external(self) -> bool:
        return self.scaler == "external"

    def clamp(self, n: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, n))


@dataclass(frozen=True)
class MetricsConfig:
    """Where the engines' numbers come from, and how often they are read."""

    source: str = "scrape"
    prometheus_url: str = ""
    interval_s: float = 15.0

    def __post_init__(self) -> None:
        if self.source not in METRICS_SOURCES:
            raise ValueError(
                f"metrics.source must be one of {', '.join(METRICS_SOURCES)}, got {self.source!r}"
            )
        if self.source == "prometheus" and not self.prometheus_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                "metrics.source is prometheus but no http(s) URL is set: set "
                f"metrics.prometheusUrl or the operator's {PROMETHEUS_URL_ENV}"
            )
        if self.interval_s < 1:
            raise ValueError(f"metrics.intervalSeconds must be >= 1, got {self.interval_s}")


KV_LINKS = ("host", "nixl")


@dataclass(frozen=True)
class Roles:
    """Prefill and decode engines in one pool (docs/disaggregation.md): every engine runs with
    the KV link and starts as a decode engine; the operator gives `prefill` of them the prefill
    role as they start serving and, with `flips`, moves idle engines to the other role."""

    enabled: bool = False
    prefill: int = 1
    kv_link_via: str = "nixl"
    flips: bool = True
    window_s: float = 60.0
    idle_below: float = 0.1
    min_per_role: int = 1

    def __post_init__(self) -> None:
        if self.prefill < 1:
            raise ValueError(f"roles.prefill must be >= 1, got {self.prefill}")
        if self.kv_link_via not in KV_LINKS:
            raise ValueError(f"roles.kvLinkVia must be one of {', '.join(KV_LINKS)}")
        # As the CRD's schema has them: a window shorter than a pass, or an idle share of
        # nothing, would flip at once or never.
        if self.window_s < 1:
            raise ValueError(f"roles.flips.windowSeconds must be >= 1, got {self.window_s}")
        if not 0.01 <= self.idle_below <= 1:
            raise ValueError(
                f"roles.flips.idleBelow must be within [0.01, 1], got {self.idle_below}"
            )
        if self.min_per_role < 1:
            raise ValueError(f"roles.flips.minPerRole must be >= 1, got {self.min_per_role}")


def _roles(raw: Mapping[str, Any]) -> Roles:
    flips = raw.get("flips") or {}
    return Roles(
        enabled=bool(raw.get("enabled", False)),
        prefill=int(raw.get("prefill", 1)),
        kv_link_via=str(raw.get("kvLinkVia", "nixl")),
        flips=bool(flips.get("enabled", True)),
        window_s=float(flips.get("windowSeconds", 60)),
        idle_below=float(flips.get("idleBelow", 0.1)),
        min_per_role=int(flips.get("minPerRole", 1)),
    )


@dataclass(frozen=True)
class PoolSpec:
    """One EnginePool's spec; `model`, `engine` stay raw mappings for the Deployment renderer."""

    scaling: Scaling
    targets: Targets = field(default_factory=Targets)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    model: Mapping[str, Any] = field(default_factory=lambda: {"source": "tiny"})
    engine: Mapping[str, Any] = field(default_factory=dict)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    roles: Roles = field(default_factory=Roles)

    def __post_init__(self) -> None:
        source = self.model.get("source")
        if source not in MODEL_SOURCES:
            raise ValueError(
                f"model.source must be one of {', '.join(MODEL_SOURCES)}, got {source!r}"
            )
        needs = {"hf": ("hf", "repo"), "pvc": ("pvcClaimName", None), "image": ("path", None)}
        if source in needs:
            key, sub = needs[source]
            value = self.model.get(key)
            if isinstance(value, Mapping) and sub is not None:
                value = value.get(sub)
            if not value:
                raise ValueError(
                    f"model.source {source} needs model.{key}{'.' + sub if sub else ''}"
                )
        port = int(self.engine.get("port", 8100))
        if not 1 <= port <= 65535:
            raise ValueError(f"engine.port must be within [1, 65535], got {port}")
        for key in ("maxTokens", "maxMessages"):
            if self.engine.get(key) is not None and int(self.engine[key]) < 1:
                raise ValueError(f"engine.{key} must be >= 1, got {self.engine[key]}")
        token = self.engine.get("gatewayTokenSecretRef")
        if token is not None and not (isinstance(token, Mapping) and token.get("name")):
            raise ValueError("engine.gatewayTokenSecretRef needs a name (the Secret's)")
        # Refused here, so a pool asking for more than placement never gets a Deployment.
        allowed_overrides(self.engine.get("podSpec"))

    @property
    def port(self) -> int:
        return int(self.engine.get("port", 8100))

    @property
    def served_name(self) -> str:
        """The model's name in the API, as the engine will report it."""
        if self.model.get("servedName"):
            return str(self.model["servedName"])
        if self.model.get("source") == "hf":
            return str(self.model["hf"]["repo"])
        return str(self.model.get("path") or self.model.get("source"))


def parse(spec: Mapping[str, Any], env: Mapping[str, str] | None = None) -> PoolSpec:
    """The validated `PoolSpec` of an EnginePool's `spec`; ValueError names the bad field."""
    env = os.environ if env is None else env
    targets = spec.get("targets") or {}
    metrics = spec.get("metrics") or {}
    replicas = spec.get("replicas")
    try:
        return PoolSpec(
            scaling=Scaling(
                min_replicas=int(spec["minReplicas"]),
                max_replicas=int(spec["maxReplicas"]),
                replicas=None if replicas is None else int(replicas),
                up_window_s=float(
                    (spec.get("scaleUp") or {}).get("stabilizationWindowSeconds", 30)
                ),
                down_window_s=float(
                    (spec.get("scaleDown") or {}).get("stabilizationWindowSeconds", 600)
                ),
                drain_timeout_s=float(spec.get("drainTimeoutSeconds", 300)),
                scaler=str(spec.get("scaler", "operator")),
            ),
            targets=Targets(
                kv_usage=float(targets.get("kvUsage", 0.85)),
                contended_waste=float(targets.get("contendedWaste", 0.1)),
                queue_depth=float(targets.get("queueDepth", 8)),
            ),
            metrics=MetricsConfig(
                source=str(metrics.get("source", "scrape")),
                prometheus_url=str(
                    metrics.get("prometheusUrl") or env.get(PROMETHEUS_URL_ENV, "")
                ).rstrip("/"),
                interval_s=float(metrics.get("intervalSeconds", 15)),
            ),
            model=dict(spec.get("model") or {}),
            engine=dict(spec.get("engine") or {}),
            pod_labels={str(k): str(v) for k, v in (spec.get("podLabels") or {}).items()},
            pod_annotations={str(k): str(v) for k, v in (spec.get("podAnnotations") or {}).items()},
            roles=_roles(spec.get("roles") or {}),
        )
    except KeyError as exc:
        raise ValueError(f"spec.{exc.args[0]} is required") from None
    except TypeError as exc:
        raise ValueError(f"spec has a value of the wrong type: {exc}") from None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
