"""The waste equations of DESIGN section 4, in byte-seconds of GPU KV memory.

Source: Abhyankar et al., "InferCept: Efficient Intercept Support for Augmented Large Language
Model Inference", ICML 2024, arXiv 2402.01869 (Section 3 quantifies the waste of the three
strategies, Section 4 the min-waste variants), and the authors' code, github.com/WukLab/InferCept,
`vllm/core/scheduler_v2.py` (`discard_waste`). The chunked recompute is the paper's eq. 4 (as
DESIGN section 4 cites it); the basic wastes of Section 3 are named by strategy here, because
their individual numbers could not be checked against the paper's text.

Waste is GPU memory x time that produces nothing: memory held by a paused request, memory other
requests hold while the GPU recomputes a discarded context, memory held while a synchronous swap
stalls the batch. Notation: `c_i` context tokens of the paused request, `c_other` context held by
the running requests, `M` = profile.kv_bytes_per_token, T_fwd(n) = a*n + c.
"""

from __future__ import annotations

from collections.abc import Callable

from interlude.policy.profile import Profile


def preserve(p: Profile, t_int: float, c_i: int) -> float:
    """Preserve (Section 3): keep the KV on the GPU for the whole interception: T_INT * C_i * M."""
    return t_int * c_i * p.kv_bytes_per_token


def discard(p: Profile, c_i: int, c_other: int) -> float:
    """Discard (Section 3): drop the KV and recompute it at once, as vLLM does:

    T_fwd(C_i)*C_i*M + T_fwd(C_i)*C_other*M.

    The whole recompute is one iteration of C_i tokens; everyone's memory waits for it.
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
    """Eq. 4: drop the KV, recompute it in n chunks that fill the batch up to S:

    T_fwd(C_i)*C_i*M/2 + n*T_fwd(C_i/n)*C_other*M,  with n*T_fwd(C_i/n) = a*C_i.

    See `chunked_discard_of`; `running_tokens` sets the chunk size and so n, which cancels out.
    """
    return chunked_discard_of(p, c_other, running_tokens)(c_i)


def chunked_discard_of(p: Profile, c_other: int, running_tokens: int) -> Callable[[int], float]:
    """Eq. 4 as a function of C_i for one batch (policies evaluate it for every paused request
    of an iteration, so the batch's constants are worked out once).

    The left term is the paper's: the request's own memory fills up over the recompute, held
    on average half of it, for T_fwd(C_i). In the right term a chunk rides in an iteration that
    runs anyway (the running requests decode in it), so what the others wait for is the time the
    chunk *adds*, a*C_i/n, not a whole iteration with its fixed cost c. Only then does the
    paper's own claim n*T_fwd(C_i/n) <= T_fwd(C_i) hold (n*(a*C_i/n + c) exceeds it once n > 1);
    the authors' `discard_waste` prices the chunks the same way: f_ch = a*c_h per full chunk,
    a*(C_i mod c_h) for the last, both times C_other. Its left term differs from the paper's
    (it charges a full iteration at S per chunk for the part recomputed so far); we keep the
    paper's, which keeps chunked <= at-once (`discard`) for every input.

    `running_tokens` is accepted so callers describe the batch as the paper does (chunks of
    S - running tokens); the chunk count drops out of the marginal price.
    """
    del running_tokens  # n * (a * C_i / n) = a * C_i: the chunking does not change the price
    a = p.fwd_a_ms / 1000.0
    m = p.kv_bytes_per_token

    def waste_of(c_i: int) -> float:
        return (p.t_fwd(c_i) * c_i / 2 + a * c_i * c_other) * m

    return waste_of


def sync_swap(p: Profile, c_i: int, c_batch: int) -> float:
    """Swap (Section 3): out and back in synchronously while the batch stalls:

    2*T_swap(C_i)*C_batch*M.
    """
    return 2 * p.t_swap(c_i) * c_batch * p.kv_bytes_per_token


def budgeted_swap_own(p: Profile, c_i: int) -> float:
    """A budgeted swap out and back, charged to the request alone: its own memory while the
    copies run, 2*T_swap(C_i)*C_i*M (`sync_swap` with C_batch = C_i). The batch does not
    stall, so nobody else's memory waits; `interlude` prices swaps under pressure so."""
    return sync_swap(p, c_i, c_i)


def budgeted_swap() -> float:
    """Min-waste swap (Section 4): a swap within the per-iteration budget N, T_swap(N) =
    T_fwd(batch), is hidden behind compute, layer by layer: ~0 waste (no equation of its own)."""
    return 0.0
