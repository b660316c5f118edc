"""The simulator's prefix cache: vLLM's free-block queue, least recently freed evicted first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.policy import Profile
from interlude.sim.kv import KVBook
from interlude.sim.prefix_cache import PrefixCache
from interlude.sim.request import SimRequest
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

BS = 16


def freed(cache: PrefixCache, free: int, owner: str, tokens: int) -> int:
    """`owner` frees `tokens` tokens' blocks; the free count after."""
    blocks = -(-tokens // BS)
    cache.freed(free, owner, tokens, blocks, BS)
    return free + blocks


def test_eviction_takes_the_least_recently_freed_and_a_requests_tail_first() -> None:
    cache = PrefixCache(10, enabled=True)
    free = freed(cache, 0, "a", 4 * BS)  # a's 4 blocks, then b's 3 whole and 1 partial
    free = freed(cache, free, "b", 3 * BS + 5)
    assert free == 8 and cache.check(free) is None
    assert cache.lookup("a", 10 * BS, free, BS) == 4 * BS
    free -= 3  # an allocation takes 3 blocks from the head: a's last 3
    assert cache.lookup("a", 10 * BS, free, BS) == 1 * BS
    assert cache.lookup("b", 10 * BS, free, BS) == 3 * BS
    free -= 2  # a's first block, then b's partial one (freed first, never cached)
    assert cache.lookup("a", 10 * BS, free, BS) == 0
    assert cache.lookup("b", 10 * BS, free, BS) == 3 * BS
    free -= 1  # b's last whole block
    assert cache.lookup("b", 10 * BS, free, BS) == 2 * BS
    assert cache.check(free) is None


def test_a_hit_leaves_a_token_to_compute_and_takes_the_blocks_out_of_the_queue() -> None:
    cache = PrefixCache(8, enabled=True)
    free = freed(cache, 0, "a", 4 * BS)
    # Its whole context is cached: vLLM still computes its last token, so 3 blocks are hit.
    hit = cache.lookup("a", 4 * BS, free, BS)
    assert hit == 3 * BS
    cache.hit("a", hit, BS)
    free -= 3
    assert cache.check(free) is None
    assert cache.lookup("a", 4 * BS, free, BS) == 0  # the 4th block is nobody's now


def test_a_copy_in_pieces_is_found_whole_until_its_first_piece_loses_a_block() -> None:
    # A copy to host in pieces: the engine frees each piece after the step that copied it,
    # from the context's first block on, so the first piece is the oldest in the queue. Once an
    # allocation takes its last block the rest is behind a gap and nobody finds it.
    cache = PrefixCache(12, enabled=True)
    cache.freed_piece(0, "a", 3, first=True)
    free = freed(cache, 3, "x", 2 * BS)  # another request's blocks, freed in between
    cache.freed_piece(free, "a", 2, first=False)
    free += 2
    cache.freed_piece(free, "a", 2, first=False)
    free += 2
    assert cache.check(free) is None
    assert cache.lookup("a", 10 * BS, free, BS) == 7 * BS
    assert cache.lookup("a", 5 * BS, free, BS) == 4 * BS  # vLLM's cap: one token computed
    assert cache.lookup("a", 10 * BS, free - 1, BS) == 2 * BS  # the first piece's last block
    assert cache.lookup("x", 10 * BS, free - 1, BS) == 2 * BS  # x's come after it
    assert cache.lookup("a", 10 * BS, free - 3, BS) == 0 and cache.check(free - 3) is None


def test_a_hit_takes_the_later_pieces_out_of_the_queue_too() -> None:
    cache = PrefixCache(12, enabled=True)
    cache.freed_piece(0, "a", 3, first=True)
    cache.freed_piece(3, "a", 2, first=False)
    free = freed(cache, 5, "b", BS)
    cache.hit("a", cache.lookup("a", 10 * BS, free, BS), BS)
    free -= 5
    assert cache.check(free) is None and cache.queued == free == 1
    assert cache.lookup("b", 10 * BS, free, BS) == BS
    # A piece freed after a gap (its first piece went) is found by nobody.
    cache.freed_piece(free, "c", 2, first=False)
    assert cache.lookup("c", 10 * BS, free + 2, BS) == 0 and cache.check(free + 2) is None


def test_a_disabled_cache_finds_nothing() -> None:
    cache = PrefixCache(8, enabled=False)
    free = freed(cache, 0, "a", 4 * BS)
    assert cache.lookup("a", 8 * BS, free, BS) == 0 and cache.check(free) is None


def test_a_book_takes_and_gives_back_a_requests_cached_blocks(
    make_profile: Callable[..., Profile],
) -> None:
    p = make_profile()
    kv = KVBook(p, prefix_cache=True)
    trace = TraceRequest("a", "k", 100, (Segment(10, None),))
    r = SimRequest("0:a", trace, 0.0)
    kv.set_gpu(r, 100)
    r.pending_tokens = 0
    dropped = kv.free_cached(r)
    r.pending_tokens, r.recompute_left = dropped, dropped
    assert (r.gpu_tokens, kv.gpu_free) == (0, p.gpu_blocks)
    hit = kv.take_cached(r)
    assert hit == 96 and (r.gpu_tokens, r.pending_tokens, r.recompute_left) == (96, 4, 4)
    assert r.prefix_hit_tokens == 96
    kv.check([r])
    kv.untake_cached(r, hit)
    assert (r.gpu_tokens, r.pending_tokens, r.recompute_left, r.prefix_hit_tokens) == (
        0,
        100,
        100,
        0,
    )
    kv.check([r])
    assert kv.take_cached(r) == 96  # given back as its own


@pytest.mark.parametrize(("discarded", "found"), [(0, 5 * BS), (BS, 0)])
def test_a_book_swapping_out_in_pieces_leaves_them_to_the_cache(
    make_profile: Callable[..., Profile], discarded: int, found: int
) -> None:
    # Two pieces copied to host; at the swap-in the prefix cache gives back the 5 whole blocks
    # and only the partial one is loaded. A request that had part of its context discarded
    # before has a host copy that does not start where the cache does: nothing is found.
    kv = KVBook(make_profile(), prefix_cache=True)
    r = SimRequest("0:a", TraceRequest("a", "k", 100, (Segment(10, None),)), 0.0)
    r.context_tokens = 5 * BS + 3 + discarded
    r.pending_tokens = r.recompute_left = discarded
    kv.set_gpu(r, 5 * BS + 3)
    kv.set_cpu(r, 2 * BS)
    kv.swap_out(r, 2 * BS, first=True)
    kv.set_cpu(r, 5 * BS + 3)
    kv.swap_out(r, 3 * BS + 3, first=False)
    kv.check([r])
    r.context_tokens += 8  # the call's answer
    r.pending_tokens += 8
    assert kv.take_cached_copy(r) == found == r.gpu_tokens == r.prefix_hit_tokens
    assert r.cpu_tokens == 5 * BS + 3 - found
    kv.check([r])


def test_a_preempted_request_finds_what_is_left_of_its_blocks(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile]
) -> None:
    """Two requests outgrow a small GPU and one is preempted. Its freed blocks are the free
    queue's newest, so the other's growth takes other blocks first and then its tail: vLLM v1
    finds the rest again when it is admitted, v0 recomputes everything it held."""
    p = make_profile(gpu_kv_bytes=20 * BS * 1000)  # 20 blocks
    a = TraceRequest("a", "k", 120, (Segment(90, None),))
    b = TraceRequest("b", "k", 120, (Segment(90, None),))
    arrivals = [Arrival(0.0, a, "0:a"), Arrival(0.0, b, "1:b")]
    v1 = make_simulator("vllm", arrivals, profile=p).run()
    v0 = make_simulator("vllm-v0", arrivals, profile=p).run()
    assert v1.finished == v0.finished == 2
    assert v0.prefix_hit_tokens == 0 and v0.recomputed_tokens >= 120
    assert v1.prefix_hit_tokens >= 4 * BS
    assert v1.recomputed_tokens < v0.recomputed_tokens


def test_a_discarded_request_loses_what_others_allocated_meanwhile(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile]
) -> None:
    """a's KV is dropped at its call; c, which did not fit beside it, then fills the whole
    GPU, taking the free blocks a's KV stayed in: a recomputes all of it."""
    p = make_profile()  # 200 blocks
    a = TraceRequest("a", "k", 100, (Segment(10, TraceCall("t", 0.5, 10)), Segment(10, None)))
    c = TraceRequest("c", "k", 3100, (Segment(100, None),))
    sim = make_simulator("vllm", [Arrival(0.0, a, "0:a"), Arrival(0.02, c, "1:c")], profile=p)
    m = sim.run()
    assert m.finished == 2
    assert (m.recomputed_tokens, m.prefix_hit_tokens) == (110, 0)
