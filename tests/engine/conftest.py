"""Real vLLM (the CPU build) with a tiny random-weight Llama built offline, once per session.

Each test starts its own engine inside its own event loop (AsyncLLM binds to the loop it first
runs in) and shuts it down; starting one takes about 20 s on a 2-core machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from interlude.engine.config import EngineConfig


@pytest.fixture(scope="session")
def with_engine(tiny_model: str) -> Callable[..., Any]:
    """Run `body(engine)` on a fresh engine of `EngineConfig(model=tiny_model, **kw)`."""
    from interlude.bench.scripted_engine import ScriptedEngine

    def run(body: Callable[[Any], Awaitable[Any]], tool_deadline_s: float = 60.0, **kw: Any) -> Any:
        kw.setdefault("num_gpu_blocks", 40)
        kw.setdefault("host_blocks", 64)
        engine = ScriptedEngine(
            EngineConfig(model=tiny_model, **kw), tool_deadline_s=tool_deadline_s
        )
        try:
            return asyncio.run(body(engine))
        finally:
            engine.shutdown()

    return run


@pytest.fixture(scope="module")
def vllm_config(tiny_model: str) -> Any:
    """vLLM's config of an `interlude` engine with 40 KV blocks and a host pool of 16, built
    without starting an engine (for a scheduler driven by hand: `real_scheduler`)."""
    from interlude.engine.config import prepare_process_env

    prepare_process_env()
    args = EngineConfig(
        model=tiny_model, policy="interlude", num_gpu_blocks=40, host_blocks=16
    ).engine_args()
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = 40  # the engine core sets it from the KV it allocates
    return config


@pytest.fixture(scope="module")
def hasher(vllm_config: Any) -> Any:
    """vLLM's block hasher, as its engine core sets it on every request (prefix caching)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    return get_request_block_hasher(vllm_config.cache_config.block_size, fn)


@pytest.fixture
def real_scheduler(vllm_config: Any, hasher: Any) -> Any:
    """An `InterludeScheduler` of `vllm_config` over 40 KV blocks, with no model: a test feeds
    the sampled tokens: `s.test_step()` is `fake_step(s)`. `s.test_hasher` is the block hasher
    its requests take."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    from interlude.enginecore.scheduler import InterludeScheduler

    bs = vllm_config.cache_config.block_size
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=64, dtype=torch.float32)
    page = spec.page_size_bytes
    kv = KVCacheConfig(
        num_blocks=40,
        kv_cache_tensors=[
            KVCacheTensor(40 * page, ["l0"], layer_stride=40 * page, block_stride=page)
        ],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
    )
    s = InterludeScheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=bs,
    )
    s.test_hasher = hasher  # type: ignore[attr-defined]
    s.test_step = lambda: fake_step(s)  # type: ignore[attr-defined]
    return s


def fake_step(s: Any) -> Any:
    """One step of scheduler `s` with a fake forward pass: every request whose scheduled
    tokens reach its end samples token 7 (`schedule` has counted them as computed already).
    vLLM's `SchedulerOutput` of the step."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    # A request mid-prefill is in the runner's output too, with nothing sampled.
    done = [s.requests[rid].num_computed_tokens >= s.requests[rid].num_tokens for rid in ids]
    runner = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=[[7] if d else [] for d in done],
    )
    s.update_from_output(out, runner)
    return out
