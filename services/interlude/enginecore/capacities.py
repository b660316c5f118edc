"""The profile a policy plans with inside a loaded engine: its KV in the engine's own units."""

from __future__ import annotations

import dataclasses
from typing import Any

from interlude.policy import Profile
from interlude.policy.profile import EMULATE_KEY


def real_capacities(
    profile: Profile, kv: Any, block_size: int, device_bytes_per_token: int | None = None
) -> Profile:
    """`profile` with the loaded engine's KV: bytes per token and blocks as vLLM allocated
    them (`KVCacheConfig`), not the named profile's estimates. The policy's waste and its
    memory checks are in these units, so they must be the model's and the GPU's own. The
    host pool keeps its block count.

    `device_bytes_per_token`: an emulated accelerator's (`emulated_bytes_per_token`). Its tiny
    model's KV stands for the profile's model's, so a token weighs what it weighs there: a swap
    copy's time, the per-step swap budget and the waste are the device's, not the tiny
    model's (hundreds of times smaller, which would make every copy nearly free)."""
    if not kv.kv_cache_tensors or kv.num_blocks < 1:
        return profile
    block_bytes = sum(t.size for t in kv.kv_cache_tensors) // kv.num_blocks
    per_token = device_bytes_per_token or max(1, block_bytes // block_size)
    host_blocks = profile.cpu_blocks
    return dataclasses.replace(
        profile,
        kv_bytes_per_token=per_token,
        block_size=block_size,
        gpu_kv_bytes=kv.num_blocks * per_token * block_size,
        cpu_kv_bytes=max(1, host_blocks) * per_token * block_size,
    )


def emulated_bytes_per_token(hf_config: Any) -> int | None:
    """The KV bytes per token of the device an emulated model stands for (its config.json's
    `EMULATE_KEY`, written by `engine/emulate.py`); None for a real model."""
    spec = getattr(hf_config, EMULATE_KEY, None)
    if not isinstance(spec, dict) or "kv_bytes_per_token" not in spec:
        return None
    return int(spec["kv_bytes_per_token"])
