"""Admission that keeps room for the batch to grow: `interlude`'s answer to preemption thrash.

vLLM admits a waiting request whenever its prompt fits the free blocks. Under load that fills
the KV space with prompts, and a few iterations later the running decodes need blocks nobody
has: vLLM preempts (drops a running request's KV and recomputes it later). On the shared trace
at 9 req/s, 900 s, `interlude` without this rule (`headroom` 0) preempted 16,224 times, and
the dropped contexts were 3.1M of its 7.5M recomputed tokens.

The rule: admit from the head of the waiting queue, in its order, only while the free blocks
cover the admitted contexts plus a reserve for growth: the running requests' prompt tokens
still to be computed, and `headroom` x the blocks the running (and admitted) requests are
predicted to add before their next call or end (the shared `Predictor`'s mean segment length,
less what each has generated). Not the whole predicted growth: running requests reach their
calls at spread-out times, and a paused one frees its blocks under pressure (discard or swap),
so the peak need is well under the sum. With
`headroom` 0.5 the same run preempted 572 times (215k tokens) and recomputed 4.8M tokens in all.

It needs only the queue's head, so it is `Decision.admit_limit` (a count), over the waiting
requests that hold no GPU KV. A resumed session that kept its KV runs at once in the simulator
(it never enters the waiting queue); in vLLM it waits in `kv_holding_waiting` until scheduled,
so the engine's view shows it as waiting. Here it counts as running (its prompt chunks are
reserved for) and is never held: holding it would lock its blocks while the requests it holds
back wait for them (that stalled a `bench engine` round before this rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

from interlude.policy.profile import Profile
from interlude.policy.types import NO_SHARED_BLOCKS, RequestView

_GPU = attrgetter("gpu_tokens")


def holds_no_kv(r: RequestView) -> bool:
    """Whether `admit_limit` counts `r`: a waiting request with no KV on the GPU."""
    return r.gpu_tokens == 0


def growth_blocks(
    p: Profile, rs: Sequence[RequestView], segment_tokens: Callable[[str], float]
) -> int:
    """Blocks `rs` are predicted to add before their next call or end.

    Counted in whole blocks (those of the context predicted at the segment's end, less those
    of the context now), so the count changes only when a request takes a block, and by the
    same one block: free blocks less `headroom` x this never rises while requests decode. A
    decision that holds the queue back then holds it for every iteration up to the next
    event, and an engine that skips identical iterations (the simulator) admits exactly
    when one that decides every iteration does.
    """
    cache: dict[str, float] = {}
    total = 0
    bs = p.block_size
    # It runs over the running requests at every decision: `p.blocks` inlined.
    for r in rs:
        mean = cache.get(r.kind)
        if mean is None:
            mean = cache[r.kind] = segment_tokens(r.kind)
        ctx = r.context_tokens
        end = ctx - r.generated_tokens + mean
        if end > ctx:
            total += math.ceil(end / bs) + (ctx // -bs)  # ceil(end / bs) - p.blocks(ctx)
    return total


def admit_limit(
    p: Profile,
    free_blocks: int,
    running: Sequence[RequestView],
    waiting: Sequence[RequestView],
    segment_tokens: Callable[[str], float],
    headroom: float,
    reserve_blocks: float = 0.0,
    waiting_holds_kv: bool = True,
    shared: Mapping[str, int] = NO_SHARED_BLOCKS,
) -> int | None:
    """How many requests at the head of `waiting` may be admitted; None: no limit binds.

    Only requests holding no GPU KV are counted (`holds_no_kv`); the others are running-like.
    The walk stops once the walked requests' tokens could fill an iteration's largest batch
    (`max_batched_tokens`): no engine admits more than that in one iteration, so the rest of
    a long queue is never looked at. `waiting_holds_kv` False (the engine knows no waiting
    request has GPU KV: `SchedulerView.waiting_holds_kv`) skips looking for holders.
    `shared` (`SchedulerView.shared_blocks`): blocks of a waiting request's context that
    others already hold, which admitting it does not allocate.
    """
    # `holds_no_kv` over a queue that can hold thousands, at every decision: in C first, as
    # most waiting requests hold nothing (in the simulator none do).
    holders = (
        [r for r in waiting if not holds_no_kv(r)]
        if waiting_holds_kv and any(map(_GPU, waiting))
        else []
    )
    if holders:
        running = [*running, *holders]
        waiting = [r for r in waiting if holds_no_kv(r)]
    if headroom <= 0 or not waiting or not running:
        return None  # with nothing running, holding the head back could only idle the GPU
    # Prompt chunks still to come are certain growth (their blocks), decodes a prediction.
    # A request with no pending and no host tokens has its whole context on the GPU (the
    # `RequestView` invariant) and adds nothing: most running requests decode, and their
    # counts are the cheap ones to read.
    avail = float(free_blocks - pending_blocks(p, running))
    avail -= headroom * growth_blocks(p, running, segment_tokens)
    avail -= reserve_blocks
    return _walk(
        p,
        avail,
        waiting,
        lambda r: new_blocks(p, r, shared) + headroom * growth_blocks(p, (r,), segment_tokens),
    )


def new_blocks(p: Profile, r: RequestView, shared: Mapping[str, int]) -> int:
    """Blocks admitting waiting request `r` allocates: its context's, less those others hold
    already (prefix-cache hits on blocks in use), as vLLM's `allocate_slots` counts them."""
    return p.blocks(r.context_tokens) - shared.get(r.request_id, 0)


def pending_blocks(p: Profile, running: Sequence[RequestView]) -> int:
    """Blocks the running requests' prompt chunks still to come (and host tokens) will take."""
    return sum(
        p.blocks(r.context_tokens) - p.blocks(r.gpu_tokens)
        for r in running
        if r.pending_tokens or r.cpu_tokens
    )


def _walk(
    p: Profile, avail: float, waiting: Sequence[RequestView], need: Callable[[RequestView], float]
) -> int | None:
    """How many at the head of `waiting` fit `avail` blocks, each taking `need` of them; None
    once the walked prompts could fill an iteration's largest batch (no limit binds)."""
    walked_tokens = 0
    for n, r in enumerate(waiting):
        if walked_tokens >= p.max_batched_tokens:
            return None
        blocks = need(r)
        if blocks > avail:
            return n
        avail -= blocks
        walked_tokens += r.pending_tokens
    return None


def reserve_dynamic_limit(
    p: Profile,
    free_blocks: int,
    running: Sequence[RequestView],
    waiting: Sequence[RequestView],
    segment_tokens: Callable[[str], float],
    shared: Mapping[str, int] = NO_SHARED_BLOCKS,
) -> int | None:
    """TetriInfer's *reserve-dynamic* admission (section 3.4): how many requests at the head of
    `waiting` may be admitted so that memory still suffices when the running request predicted
    to end first ends. Until then every request, running or admitted, grows by as many tokens
    as that one has left (or by its own remainder, if less); from then on memory frees. Greedy
    admission reserves nothing, `admit_limit`'s `headroom` a share of all growth to the next
    call; this reserves the growth up to the first end, and so adapts to how soon it comes.

    Same inputs and outputs as `admit_limit` (None: no limit binds); only waiting requests
    holding no GPU KV are counted. Predicted lengths are the shared `Predictor`'s per-kind mean
    segment, less what a request has generated.
    """
    holders = [r for r in waiting if not holds_no_kv(r)]
    if holders:
        running = [*running, *holders]
        waiting = [r for r in waiting if holds_no_kv(r)]
    if not waiting or not running:
        return None
    means: dict[str, float] = {}

    def left(r: RequestView) -> float:
        if r.kind not in means:
            means[r.kind] = segment_tokens(r.kind)
        return max(1.0, means[r.kind] - r.generated_tokens)

    first_end = min(left(r) for r in running)

    def grown(r: RequestView) -> int:
        ctx = r.context_tokens
        return p.blocks(ctx + math.ceil(min(left(r), first_end))) - p.blocks(ctx)

    avail = float(free_blocks - pending_blocks(p, running) - sum(grown(r) for r in running))
    return _walk(p, avail, waiting, lambda r: new_blocks(p, r, shared) + grown(r))
