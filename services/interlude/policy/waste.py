"""The waste equations of DESIGN section 4 (InferCept eq. 1-5), in byte-seconds of GPU KV memory.

Waste is GPU memory x time that produces nothing: memory held by a paused request, memory other
requests hold while the GPU recomputes a discarded context, memory held while a synchronous swap
stalls the batch. Notation: `c_i` context tokens of the paused request, `c_other` context held by
the running requests, `M` = profile.kv_bytes_per_token.
"""

from __future__ import annotations

from collections.abc import Callable

from interlude.policy.profile import Profile


def preserve(p: Profile, t_int: float, c_i: int) -> float:
    """Eq. 1: keep the KV on the GPU for the whole interception: T_INT * C_i * M."""
    return t_int * c_i * p.kv_bytes_per_token


def discard(p: Profile, c_i: int, c_other: int) -> float:
    """Eq. 2: drop the KV and recompute it at once (vLLM):

    T_fwd(C_i)*C_i*M + T_fwd(C_i)*C_other*M.
    """
    t = p.t_fwd(c_i)
    return t * (c_i + c_other) * p.kv_bytes_per_token


def recompute_chunks(p: Profile, c_i: int, running_tokens: int) -> int:
    """Number of chunks for a chunked recompute with chunks of (S - running tokens).

    When the running requests already fill S, a chunk still gets one block: the recompute must
    make progress, and vLLM schedules at least one chunk per iteration once admitted.
    """
    chunk = max(p.saturation_tokens - running_tokens, p.block_size)
    return max(1, -(-c_i // chunk))


def chunked_discard(p: Profile, c_i: int, c_other: int, running_tokens: int) -> float:
    """Eq. 3: drop the KV, recompute in n chunks that fill the batch up to S:

    T_fwd(C_i)*C_i*M/2 + n*T_fwd(C_i/n)*C_other*M.
    """
    return chunked_discard_of(p, c_other, running_tokens)(c_i)


def chunked_discard_of(p: Profile, c_other: int, running_tokens: int) -> Callable[[int], float]:
    """Eq. 3 as a function of C_i for one batch: policies evaluate it for every paused request
    of an iteration, so the batch's constants are worked out once."""
    a, c = p.fwd_a_ms / 1000.0, p.fwd_c_ms / 1000.0
    chunk = max(p.saturation_tokens - running_tokens, p.block_size)  # see recompute_chunks
    m = p.kv_bytes_per_token

    def waste_of(c_i: int) -> float:
        n = max(1, -(-c_i // chunk))
        # n*T_fwd(C_i/n) = a*C_i + n*c, written out.
        return ((a * c_i + c) * c_i / 2 + (a * c_i + n * c) * c_other) * m

    return waste_of


def sync_swap(p: Profile, c_i: int, c_batch: int) -> float:
    """Eq. 4: swap out and back in synchronously, stalling the batch: 2*T_swap(C_i)*C_batch*M."""
    return 2 * p.t_swap(c_i) * c_batch * p.kv_bytes_per_token


def budgeted_swap() -> float:
    """Eq. 5: a swap within the per-iteration budget is hidden behind compute: ~0 waste."""
    return 0.0
