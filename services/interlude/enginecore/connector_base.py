"""What our KV connectors share: they copy whole blocks once per step, not layer by layer, and
their step counters reach Prometheus through our own stat logger, not vLLM's connector stats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


@dataclass
class CountersElsewhere(KVConnectorStats):
    """What vLLM's logging stat logger builds from our scheduler's counters every step: nothing
    to log. Those counters ride in `kv_connector_stats` only to reach `InterludeStatLogger`
    (engine/metrics.py), which exports them. Without a stats class vLLM's logger warns on every
    step that it has none (a `warning_once` whose check alone cost 1.7 % of the front end's
    active samples at 3/s)."""

    def reset(self) -> None:
        return

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        return self

    def reduce(self) -> dict[str, int | float]:
        return {}

    def is_empty(self) -> bool:
        return True


class StepwiseConnector(KVConnectorBase_V1):
    """A connector whose copies happen once per step (`start_load_kv` before the forward,
    `wait_for_save` after it), so vLLM's per-layer hooks have nothing to do."""

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return CountersElsewhere()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return
