"""An upper bound on the arrival rate any policy can sustain: work and memory, nothing wasted.

The simulator's GPU runs iterations of T_fwd(n) = c + a*n seconds for n scheduled tokens
(`Profile.t_fwd`). Whatever a policy does:

* every token of every request (prompt, tool return, generated) is computed at least once, so
  at `rate` requests/s the GPU spends at least a * rate * W seconds per second on tokens (W:
  tokens per request), and at most 1 - that on the fixed cost c of iterations: at most
  (1 - a*rate*W) / c iterations per second, so the mean iteration lasts at least
  t = c / (1 - a*rate*W);
* a generated token takes one iteration of its request, with the request's whole context
  resident in GPU KV for it: a segment of g tokens decoded from context x holds at least
  (g*x + g^2/2) token-iterations, D per request summed over its segments;
* by Little's law the KV in use is then at least rate * D * t tokens on average, which cannot
  exceed the KV capacity K.

So a rate is feasible only if rate * D * c / (1 - a*rate*W) <= K. Nothing here is wasted: no
KV is held through a call, nothing is recomputed, no block is half empty, no request waits,
and the batch is as large as decoding allows. A policy's sustainable rate must be below it,
and the distance to it is what all waste and queueing together cost. Only the request pool
and the profile enter: arrivals, tool times and the SLO do not.

`calls_rate_bound` adds the tool calls. Through a call of d seconds from a context of x tokens,
a policy keeps the KV (x*d token-seconds of KV in use), moves it to the host and back (2x
tokens over the swap link, which carries bandwidth / M tokens a second in both directions
together, as the simulator's budget does), or drops it and recomputes it (a*x more seconds of
GPU, which lengthens every iteration). Any mix counts at its share (keeping part of the
time and then dropping costs at least that share of each), host memory is unlimited, and a
recompute needs no KV while it runs. Per token moved off the GPU, the link and recompute save
the same x*d / x = d, so for a given recompute amount R (tokens per request) the best choice
moves the longest calls first, fractionally, until the link and R are used up; the KV need is
convex in R (iterations lengthen as 1 / (1 - a*rate*(W + R)), kept memory falls with slopes
that flatten), so a ternary search finds its least value. `host_rate_bound` also limits the
host memory to the profile's (`cpu_kv_bytes`).

Prompt heads many requests share (`TraceRequest.prefix_group`) are computed once and held once
(`sim/shared_heads.py`, the simulator's rule, a prefix cache at its best): every bound counts
each request's own part only, in the KV capacity less what the heads hold.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from interlude.policy.profile import Profile
from interlude.sim.shared_heads import own_part, pinned_blocks
from interlude_workloads import TraceCall, TraceRequest


@dataclass(frozen=True)
class Demand:
    """What an average request of a pool asks of the GPU."""

    tokens: float  # W: tokens computed at least once (prompt + tool returns + generated)
    decode_token_iterations: float  # D: sum over generated tokens of the context they attend


def _segments(t: TraceRequest) -> Iterator[tuple[int, int, TraceCall | None]]:
    """(tokens generated, context they start from, the call that ends them) per segment."""
    context = t.prompt_tokens
    for s in t.segments:
        yield s.gen_tokens, context, s.call
        context += s.gen_tokens + (s.call.return_tokens if s.call is not None else 0)


def demand(pool: Sequence[TraceRequest]) -> Demand:
    if not pool:
        raise ValueError("demand of an empty request pool")
    tokens = 0.0
    held = 0.0
    for t in pool:
        for g, context, _ in _segments(t):
            held += g * context + g * g / 2
        tokens += t.prompt_tokens + t.total_gen_tokens + t.total_return_tokens
    return Demand(tokens / len(pool), held / len(pool))


def min_iteration_s(p: Profile, d: Demand, rate: float) -> float:
    """The least mean iteration time at `rate`; inf when the tokens alone fill the GPU."""
    busy = p.fwd_a_ms / 1000.0 * rate * d.tokens
    return math.inf if busy >= 1.0 else p.fwd_c_ms / 1000.0 / (1.0 - busy)


def min_kv_tokens(p: Profile, d: Demand, rate: float) -> float:
    """The least mean KV in use (tokens) at `rate`."""
    return rate * d.decode_token_iterations * min_iteration_s(p, d, rate)


def kv_capacity_tokens(p: Profile) -> float:
    return p.gpu_kv_bytes / p.kv_bytes_per_token


def own_pool(p: Profile, pool: Sequence[TraceRequest]) -> tuple[list[TraceRequest], float]:
    """`pool` as its requests' own parts, and the KV capacity (tokens) its shared heads leave."""
    heads = pinned_blocks(pool, p.block_size) * p.block_size
    return [own_part(t, p.block_size) for t in pool], kv_capacity_tokens(p) - heads


def _largest_rate(p: Profile, d: Demand, cap: float, need: Callable[[float], float]) -> float:
    """The largest rate at which `need(rate)` (KV tokens, rising with the rate) fits `cap`."""
    lo, hi = 0.0, 1000.0 / (p.fwd_a_ms * d.tokens)  # hi: the tokens alone fill the GPU
    for _ in range(60):  # the need rises with the rate: bisect to well below 1e-9 req/s
        mid = (lo + hi) / 2
        if need(mid) <= cap:
            lo = mid
        else:
            hi = mid
    return lo


def rate_bound(p: Profile, pool: Sequence[TraceRequest]) -> float:
    """The largest rate (requests/s) at which `min_kv_tokens` fits the KV capacity."""
    own, cap = own_pool(p, pool)
    d = demand(own)
    return _largest_rate(p, d, cap, lambda rate: min_kv_tokens(p, d, rate))


@dataclass(frozen=True)
class Pauses:
    """The calls of an average request, longest first: each one's duration and the context
    it pauses with, weighted by 1 / pool size, with running sums so that
    `kept_token_seconds` costs a bisection, not a pass over every call (an agent pool holds
    over 10,000 calls, and the bound's searches ask about 24,000 times)."""

    durations: tuple[float, ...]  # seconds, descending
    contexts: tuple[float, ...]  # tokens held at the pause / pool size, in the same order
    # Derived from the two above: cum_contexts[i] = sum of contexts[:i], cum_kept[i] = sum of
    # contexts[j] * durations[j] for j >= i.
    cum_contexts: tuple[float, ...] = field(init=False, repr=False, compare=False)
    cum_kept: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tail = [x * d for x, d in zip(self.contexts, self.durations, strict=True)]
        kept = [*reversed(list(itertools.accumulate(reversed(tail)))), 0.0]
        object.__setattr__(self, "cum_contexts", (0.0, *itertools.accumulate(self.contexts)))
        object.__setattr__(self, "cum_kept", tuple(kept))


def pauses(pool: Sequence[TraceRequest]) -> Pauses:
    calls = [
        (call.duration_s, (context + g) / len(pool))
        for t in pool
        for g, context, call in _segments(t)
        if call is not None
    ]
    calls.sort(key=lambda c: -c[0])
    return Pauses(tuple(c[0] for c in calls), tuple(c[1] for c in calls))


def kept_token_seconds(calls: Pauses, moved: float) -> float:
    """KV token-seconds per request the calls keep once `moved` tokens per request, longest
    calls first, leave the GPU for them (swapped or dropped)."""
    # The first i calls leave whole; call i (if any) leaves in part.
    i = bisect.bisect_right(calls.cum_contexts, moved) - 1
    if i >= len(calls.contexts):
        return 0.0
    left = calls.contexts[i] - (moved - calls.cum_contexts[i])
    return left * calls.durations[i] + calls.cum_kept[i + 1]


def min_kv_tokens_with_calls(
    p: Profile, d: Demand, calls: Pauses, rate: float, host: bool = False
) -> float:
    """The least mean KV in use (tokens) at `rate` when calls must be kept, swapped or
    recomputed (module docstring); `host`: host memory holds at most `Profile.cpu_kv_bytes`
    (`host_rate_bound`)."""
    a = p.fwd_a_ms / 1000.0
    link = p.swap_bandwidth_bps / p.kv_bytes_per_token / rate / 2  # tokens out and back
    # Host token-seconds per request: what the swapped calls may hold on average.
    room = p.cpu_kv_bytes / p.kv_bytes_per_token / rate if host else math.inf
    spare = 1.0 - a * rate * d.tokens  # GPU time per second left for recompute and c
    if spare <= 0:
        return math.inf

    def need(recompute: float) -> float:
        left = spare - a * rate * recompute
        if left <= 0:
            return math.inf
        iteration = p.fwd_c_ms / 1000.0 / left
        # The longest calls are recomputed; the link takes the next longest, and each token
        # it carries frees as many GPU token-seconds as it holds on the host.
        after_recompute = kept_token_seconds(calls, recompute)
        kept = kept_token_seconds(calls, link + recompute)
        kept = max(kept, after_recompute - room)
        return rate * (d.decode_token_iterations * iteration + kept)

    lo, hi = 0.0, min(sum(calls.contexts), spare / (a * rate))
    for _ in range(200):  # need is convex in the recompute amount
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if need(m1) <= need(m2):
            hi = m2
        else:
            lo = m1
    return min(need(0.0), need(lo))


def calls_rate_bound(p: Profile, pool: Sequence[TraceRequest], host: bool = False) -> float:
    """`rate_bound` with the tool calls' KV: kept, swapped or recomputed, at the least cost;
    `host`: with the host memory the profile has (`host_rate_bound`)."""
    own, cap = own_pool(p, pool)
    d, calls = demand(own), pauses(own)
    return _largest_rate(p, d, cap, lambda rate: min_kv_tokens_with_calls(p, d, calls, rate, host))


def host_rate_bound(p: Profile, pool: Sequence[TraceRequest]) -> float:
    """`calls_rate_bound` with host memory as the profile sizes it, not unlimited.

    A swapped call holds its context on the host for its duration: at `rate` the swapped
    calls' token-seconds per request can be at most H / rate (H: host KV tokens). Every token
    the link moves off the GPU frees d GPU token-seconds and takes d host token-seconds, so
    swapping saves at most H / rate of kept token-seconds, whichever calls it takes; and since
    a recompute frees d per token with no host, the longest calls are best recomputed and
    the link takes the next longest. The KV need stays convex in the recompute amount (the
    larger of two convex functions), so the same search finds its least value."""
    return calls_rate_bound(p, pool, host=True)
