"""Prompt heads that many requests share (a system prompt, a tool catalog, a chat template's
system block), held once in an engine's prefix cache.

vLLM's prefix cache keys each full block by its tokens and everything before them, so
requests whose prompts start with the same tokens find the same blocks: while one of them
holds those blocks (or they wait, cached, among the free ones) the next computes none of them
and allocates none (a block is reference-counted, `v1/core/block_pool.py`). A trace says
which requests share a head (`TraceRequest.prefix_group`, `shared_prefix_tokens`).

Under load some request of a group always holds its head, so the simulator takes that steady
state from the start: each group's head is held once for the whole run (`KVBook.pin`, its
largest head's full blocks), and each request is simulated as its own part only, its prompt
less the head's full blocks (the partial block after them is the request's own, as in vLLM).
The first request of a group computes its whole prompt, as on the engine (for its life the
head's blocks are counted twice: once pinned, once its own). Only on an engine with a prefix
cache (`Traits.prefix_cache`): without one every request computes and holds its whole prompt,
as vLLM does with prefix caching off.

Not modelled: the head's eviction from an idle engine's cache; in a cluster
(`sim/cluster.py`) only the group's first arrival computes the head, and the first of the
group on each other engine finds it there, where a real engine would compute it once more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from interlude_workloads import Arrival, TraceRequest


def head_blocks(trace: TraceRequest, block_size: int) -> int:
    """Full blocks of `trace`'s shared head that its prompt can find cached; vLLM leaves a
    prompt at least one token to compute, so a head as long as the prompt loses its last
    block."""
    return min(trace.shared_prefix_tokens, trace.prompt_tokens - 1) // block_size


def own_part(trace: TraceRequest, block_size: int) -> TraceRequest:
    """`trace` without its group's head: the prompt the request itself computes and holds."""
    blocks = head_blocks(trace, block_size)
    if blocks == 0:
        return trace
    return replace(
        trace,
        prompt_tokens=trace.prompt_tokens - blocks * block_size,
        shared_prefix_tokens=0,
        prefix_group="",
    )


def pinned_blocks(traces: Iterable[TraceRequest], block_size: int) -> int:
    """GPU blocks the heads of `traces`' groups hold: each group's largest head, once."""
    heads: dict[str, int] = {}
    for t in traces:
        blocks = head_blocks(t, block_size)
        if blocks:
            heads[t.prefix_group] = max(heads.get(t.prefix_group, 0), blocks)
    return sum(heads.values())


def own_arrivals(
    arrivals: Sequence[Arrival], block_size: int, cached: bool
) -> tuple[list[tuple[Arrival, int]], int]:
    """`arrivals` in time order, each as its own part with the head tokens it finds cached
    (the first arrival of a group keeps its whole prompt: it computes the head), and the GPU
    blocks the groups' heads pin on one engine. `cached`: the engine has a prefix cache
    (without one, every arrival as it is and nothing pinned)."""
    ordered = sorted(arrivals, key=lambda a: a.time_s)
    if not cached:
        return [(a, 0) for a in ordered], 0
    pinned = pinned_blocks((a.request for a in ordered), block_size)
    seen: set[str] = set()
    out: list[tuple[Arrival, int]] = []
    for a in ordered:
        group = a.request.prefix_group
        if group and group not in seen:
            seen.add(group)
            out.append((a, 0))
            continue
        own = own_part(a.request, block_size)
        out.append((replace(a, request=own), a.request.prompt_tokens - own.prompt_tokens))
    return out, pinned
