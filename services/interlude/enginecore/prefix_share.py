"""How many blocks of a waiting request's context other requests already hold on the GPU.

Conversations often share a prefix: the chat template's system block with the same tool
declarations comes first in every conversation of a kind (3 full blocks of 32 tokens on the
tiny model). With prefix caching, vLLM's `allocate_slots` takes those blocks from the cache,
and where a running or parked request holds them (reference count above 0) they cost no free
block at all. The policy's admission (`policy.admission.new_blocks`) counts a request's need in
blocks; without this it would count the whole context and refuse requests vLLM could admit.

Blocks found in the cache but held by no one are not counted: they sit in vLLM's free queue,
so they are in the free count already, and taking them removes them from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.request import Request


def shared_blocks(
    manager: KVCacheManager, queued: Iterable[Request], token_cap: int
) -> dict[str, int]:
    """Waiting request id -> blocks of its context that others hold (only ids with some).

    `queued`: the waiting requests in queue order, none with KV (computed tokens or a host
    copy). Walks them until their tokens reach `token_cap` (an iteration's largest batch: the
    admission never looks further). Reads the cache only: no reference counts, LRU order or
    hit statistics change.
    """
    if not manager.enable_caching:
        return {}
    out: dict[str, int] = {}
    walked = 0
    for r in queued:
        if walked >= token_cap:
            break
        walked += r.num_tokens
        if not manager.prefix_cache_lookup_enabled(r):
            continue
        # vLLM's own limit: the last token is always computed again (for its logits).
        hit, _, _ = manager.coordinator.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
        held = min((sum(1 for b in group if b.ref_cnt > 0) for group in hit), default=0)
        if held:
            out[r.request_id] = held
    return out
