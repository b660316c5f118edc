"""What our KV connectors share: they copy whole blocks once per step, not layer by layer."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class StepwiseConnector(KVConnectorBase_V1):
    """A connector whose copies happen once per step (`start_load_kv` before the forward,
    `wait_for_save` after it), so vLLM's per-layer hooks have nothing to do."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return
