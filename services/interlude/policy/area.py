"""The memory-time area a queued request is ranked by, and the handling it is priced under.

LAMPS's two equations (DESIGN section 4; Shahout et al., arXiv 2410.18248): a request's KV
memory over time until its next call returns, and the strategy for that call chosen as the
argmin of the three wastes. Pure functions of a `Profile`; `ranking.AreaRankedPolicy` and
`rekeyed.RekeyedKeys` price keys with them.
"""

from __future__ import annotations

from interlude.policy import waste
from interlude.policy.profile import Profile
from interlude.policy.types import Handling

# The strategies in the order that breaks ties in `choose_strategy` (by name).
BY_NAME = (Handling.DISCARD, Handling.PRESERVE, Handling.SWAP)


def choose_strategy(
    p: Profile, context: float, duration: float, c_other: int, running_tokens: int
) -> Handling:
    """Argmin of the three wastes for a call at `context` tokens lasting `duration` seconds."""
    c = max(1, round(context))
    options = {
        Handling.PRESERVE: waste.preserve(p, duration, c),
        Handling.DISCARD: waste.chunked_discard(p, c, c_other, running_tokens),
        Handling.SWAP: waste.sync_swap(p, c, c_other + c),
    }
    return min(options, key=lambda h: (options[h], h.value))


def memory_time_area(
    p: Profile, context: float, gen: float, duration: float, strategy: Handling, t_tok: float
) -> float:
    """Token-seconds of KV a request holds until its next call returns, under `strategy`.

    Decoding `gen` tokens from `context` holds (context*gen + gen^2/2)*t_tok; during the call
    preserve holds the whole context, discard holds nothing but pays a recompute spike, swap
    holds it for the copy out and back.
    """
    end = context + gen
    area = (context * gen + gen * gen / 2) * t_tok
    if strategy is Handling.PRESERVE:
        return area + end * duration
    if strategy is Handling.DISCARD:
        return area + end * p.t_fwd(end) / 2
    return area + end * 2 * p.t_swap(end)
