"""`enginecore.prefix_share`: blocks of a waiting request that others hold, read from a real
vLLM KV cache manager (no engine: the manager alone, one full-attention group)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

from interlude.enginecore.prefix_share import shared_blocks

BLOCK = 16
SYSTEM = list(range(100, 100 + 3 * BLOCK))  # a shared prefix of three full blocks


def make_manager(caching: bool = True) -> KVCacheManager:
    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(
        num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)]
    )
    return KVCacheManager(
        config,
        max_model_len=256,
        scheduler_block_size=BLOCK,
        hash_block_size=BLOCK,
        enable_caching=caching,
    )


@pytest.fixture
def request_of() -> Callable[[str, list[int]], Request]:
    hasher = get_request_block_hasher(BLOCK, sha256)

    def make(rid: str, ids: list[int]) -> Request:
        return Request(rid, ids, SamplingParams(max_tokens=4), None, block_hasher=hasher)

    return make


def admit(m: KVCacheManager, r: Request) -> None:
    """What vLLM's scheduler does for a new request: cache hits, then the rest allocated."""
    blocks, hits, _ = m.get_computed_blocks(r)
    assert m.allocate_slots(r, r.num_tokens - hits, hits, blocks) is not None
    r.num_computed_tokens = r.num_tokens


def test_blocks_a_running_request_holds_are_shared(
    request_of: Callable[[str, list[int]], Request],
) -> None:
    m = make_manager()
    admit(m, request_of("a", [*SYSTEM, *range(1, 20)]))
    b = request_of("b", [*SYSTEM, *range(50, 70)])
    free = m.block_pool.get_num_free_blocks()
    assert shared_blocks(m, [b], 512) == {"b": 3}
    # Reading changes nothing: the free count, and a later lookup finds the same hits.
    assert m.block_pool.get_num_free_blocks() == free
    assert m.get_computed_blocks(b)[1] == 3 * BLOCK


def test_cached_blocks_nobody_holds_are_not_shared(
    request_of: Callable[[str, list[int]], Request],
) -> None:
    m = make_manager()
    a = request_of("a", [*SYSTEM, *range(1, 20)])
    admit(m, a)
    m.free(a)  # still in the prefix cache, but in the free count: taking them costs as much
    b = request_of("b", [*SYSTEM, *range(50, 70)])
    assert m.get_computed_blocks(b)[1] == 3 * BLOCK
    assert shared_blocks(m, [b], 512) == {}


def test_the_walk_stops_at_the_token_cap_and_without_a_cache(
    request_of: Callable[[str, list[int]], Request],
) -> None:
    m = make_manager()
    admit(m, request_of("a", [*SYSTEM, *range(1, 20)]))
    queued = [request_of(f"w{i}", [*SYSTEM, 300 + i]) for i in range(3)]
    assert shared_blocks(m, queued, 2 * len(queued[0].prompt_token_ids)) == {"w0": 3, "w1": 3}
    unique = request_of("u", list(range(400, 440)))
    assert shared_blocks(m, [unique], 512) == {}
    off = make_manager(caching=False)
    admit(off, request_of("a", [*SYSTEM, *range(1, 20)]))
    assert shared_blocks(off, [request_of("b", [*SYSTEM, 7])], 512) == {}
