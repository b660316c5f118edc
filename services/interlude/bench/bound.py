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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from interlude.policy.profile import Profile
from interlude_loadgen import TraceRequest


@dataclass(frozen=True)
class Demand:
    """What an average request of a pool asks of the GPU."""

    tokens: float  # W: tokens computed at least once (prompt + tool returns + generated)
    decode_token_iterations: float  # D: sum over generated tokens of the context they attend


def demand(pool: Sequence[TraceRequest]) -> Demand:
    if not pool:
        raise ValueError("demand of an empty request pool")
    tokens = 0.0
    held = 0.0
    for t in pool:
        context = t.prompt_tokens
        for s in t.segments:
            g = s.gen_tokens
            held += g * context + g * g / 2
            context += g
            if s.call is not None:
                context += s.call.return_tokens
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


def rate_bound(p: Profile, pool: Sequence[TraceRequest]) -> float:
    """The largest rate (requests/s) at which `min_kv_tokens` fits the KV capacity."""
    d = demand(pool)
    cap = kv_capacity_tokens(p)
    lo, hi = 0.0, 1000.0 / (p.fwd_a_ms * d.tokens)  # hi: the tokens alone fill the GPU
    for _ in range(60):  # the need rises with the rate: bisect to well below 1e-9 req/s
        mid = (lo + hi) / 2
        if min_kv_tokens(p, d, mid) <= cap:
            lo = mid
        else:
            hi = mid
    return lo
