"""What the operator and the pods it manages agree on: the pod label that drains an engine and
the engine metrics the operator scales on.

The operator writes `DRAINING_LABEL` and the gateway's discovery reads it; the engine exports
the metrics (`engine/metrics.py`, beside vLLM's own) and the operator reads them by these names
(`interlude_operator/metrics.py`), from Prometheus or from the engines directly.
"""

from __future__ import annotations

# "true" on an engine pod the operator is draining: the gateway sends it no new sessions.
DRAINING_LABEL = "interlude.dev/draining"

# Interlude's engine metrics the operator reads (vLLM's own, `vllm:*`, are vLLM's names).
SESSIONS_METRIC = "interlude:sessions"  # gauge by `state`: live chat sessions of the engine
# Counter of GB x s of GPU KV held by paused requests while others queued (exposed with _total).
CONTENDED_WASTE_METRIC = "interlude:kv_waste_contended_gb_seconds"
POOL_GB_METRIC = "interlude:kv_pool_gb"  # gauge: GB of GPU KV in the engine's pool
