"""EngineConfig: validation, and what it hands vLLM (no engine started)."""

from __future__ import annotations

import pytest

from interlude.engine.config import EngineConfig
from interlude.policy import load_profile


def test_policy_engine_chunks_prefills_at_the_profiles_saturation_point() -> None:
    config = EngineConfig(model="/nonexistent", policy="interlude", num_gpu_blocks=40)
    args = config.engine_args()
    assert args.long_prefill_token_threshold == load_profile("tiny-llama-cpu").saturation_tokens
    assert args.scheduler_cls == "interlude.engine.scheduler.InterludeScheduler"
    assert args.max_model_len == 39 * 32  # one request must fit the capped pool


def test_stock_engine_is_stock() -> None:
    args = EngineConfig(model="/nonexistent", policy=None).engine_args()
    assert args.long_prefill_token_threshold == 0
    assert args.kv_transfer_config is None and args.additional_config == {}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"policy": "nope"}, "unknown policy"),
        ({"block_size": 0}, "block_size must be >= 1"),
        ({"num_gpu_blocks": 1}, "num_gpu_blocks must be >= 2"),
        ({"host_blocks": -1}, "host_blocks must be >= 0"),
    ],
)
def test_bad_settings_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="/m", **kw)  # type: ignore[arg-type]
