"""Skipping identical iterations: when the next iterations would repeat this one's batch.

A decode-only batch repeats until an event; a batch whose one prefill chunk fills the whole
chunked budget repeats while that prefill lasts. These helpers say whether a batch repeats, how
many repeats fit in the free GPU blocks, and apply the repeated chunks.
"""

from __future__ import annotations

from collections.abc import Callable

from interlude.policy.profile import Profile
from interlude.policy.types import BatchMode
from interlude.sim.batch import Batch
from interlude.sim.kv import KVBook


def chunk_repeats(batch: Batch, p: Profile, mode: BatchMode) -> int:
    """How many iterations schedule exactly this batch, this one included; 0 when the next
    would differ.

    A batch repeats while one request's long prefill (or recompute) fills the whole chunked
    budget: the same decodes plus the next chunk of the same size, and nothing else fits behind;
    that lasts while the request has more than a chunk left.
    """
    if mode is not BatchMode.CHUNKED or len(batch.chunks) != 1:
        return 0
    x, n, _ = batch.chunks[0]
    if n != p.saturation_tokens - len(batch.decodes) or x.pending_tokens <= n:
        return 0
    return (x.pending_tokens - 1) // n + 1


def extend_chunk(batch: Batch, kv: KVBook, extra_iterations: int) -> None:
    """Prefill the chunk of `batch` for `extra_iterations` more identical iterations."""
    x, n, _ = batch.chunks[0]
    tokens = extra_iterations * n
    recompute = min(tokens, x.recompute_left)
    kv.set_gpu(x, x.gpu_tokens + tokens)
    x.pending_tokens -= tokens
    x.recompute_left -= recompute
    x.recomputed_tokens += recompute


def block_growth(batch: Batch, kv: KVBook) -> Callable[[int], tuple[int, int]]:
    """Blocks that j identical iterations of `batch` add, as (decodes, repeated chunk).

    Each decode grows one token per iteration (its first block is the reservation already made);
    a repeated chunk (at most one, see `chunk_repeats`) grows by its size in every iteration
    after the first.
    """
    bs = kv.bs
    if batch.decodes and batch.decoding is not None:
        hist = batch.decoding.residues()  # the cohort keeps the histogram: no pass over decodes
    else:
        hist = [0] * bs
        for r in batch.decodes:
            hist[r.gpu_tokens % bs] += 1
    x, n = (batch.chunks[0][0], batch.chunks[0][1]) if batch.chunks else (None, 0)

    def blocks(j: int) -> tuple[int, int]:
        dec = hist[0] * (-(-j // bs))
        for q in range(1, bs):
            if hist[q]:
                dec += hist[q] * ((q + j - 1) // bs)
        return dec, (kv.grow_cost(x, (j - 1) * n) if x is not None else 0)

    return blocks


def memory_limit(batch: Batch, kv: KVBook, k: int) -> int:
    """Largest j <= k such that j identical iterations fit in the free GPU blocks."""
    free = kv.gpu_free + batch.reserved_blocks
    growth = block_growth(batch, kv)

    def need(j: int) -> int:
        return sum(growth(j))

    if need(k) <= free:
        return k
    lo, hi = 1, k  # need(lo) fits (it is the reservation just made), need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo
