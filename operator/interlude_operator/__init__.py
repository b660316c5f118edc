"""The Interlude operator: runs EnginePools (engines as a Deployment), scales them on KV usage,
contended waste and queue depth, and drains an engine before it goes.

Modules, one job each: `spec` (the EnginePool spec, validated), `decide` (the scaling rule,
pure), `metrics` / `prom` / `scrape` (reading the engines), `pods` (which engine is what, which
to drain, pure), `deployment` (the Deployment the pool owns, rendered), `kube` (the few
Kubernetes API calls), `actions` (a pass's writes, in a crash-safe order), `status` (the status
and its conditions), `reconcile` (one pass), `telemetry` (the operator's own metrics),
`handlers` (kopf), `__main__` (the command).
"""

GROUP = "interlude.dev"
VERSION = "v1alpha1"
PLURAL = "enginepools"
