"""The waste equations of DESIGN section 4, checked against hand-computed values.

All with the tiny test profile unless said otherwise: M = 1000 B/token, T_fwd(n) = (0.05 n + 10)
ms (a = 5e-5 s/token, c = 0.01 s), S = 256, block size 16, T_swap(n) = n x 1000 B / 1e7 B/s.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.policy import Profile, available_profiles, load_profile, waste


@pytest.fixture
def p(make_profile: Callable[..., Profile]) -> Profile:
    return make_profile()


def test_preserve(p: Profile) -> None:
    # T_INT x C_i x M = 2 s x 100 x 1000 B
    assert waste.preserve(p, 2.0, 100) == pytest.approx(200_000)
    assert waste.preserve(p, 0.0, 100) == 0.0  # a call that has not started wastes nothing


def test_preserve_gptj() -> None:
    # 1 s x 1000 tokens x 458,752 B
    assert waste.preserve(load_profile("gptj-6b-a100-40g"), 1.0, 1000) == pytest.approx(458_752_000)


def test_discard(p: Profile) -> None:
    # T_fwd(200) = 0.05 x 200 + 10 = 20 ms; (C_i + C_other) x M x T_fwd = 500 x 1000 x 0.02
    assert waste.discard(p, 200, 300) == pytest.approx(10_000)
    # Alone on the GPU only the request's own memory waits: 0.02 x 200 x 1000
    assert waste.discard(p, 200, 0) == pytest.approx(4_000)


@pytest.mark.parametrize(
    ("c_i", "running_tokens", "chunks"),
    [
        (600, 56, 3),  # chunk = 256 - 56 = 200; 600 / 200 = 3
        (601, 56, 4),  # one token more needs a fourth chunk
        (200, 56, 1),  # fits in one chunk
        (600, 256, 38),  # running tokens == S: chunks of one block, ceil(600 / 16) = 38
        (600, 300, 38),  # running tokens > S: still one block per chunk
        (1, 0, 1),
        (0, 0, 1),  # degenerate: never fewer than one chunk
    ],
)
def test_recompute_chunks(p: Profile, c_i: int, running_tokens: int, chunks: int) -> None:
    assert waste.recompute_chunks(p, c_i, running_tokens) == chunks


def test_chunked_discard(p: Profile) -> None:
    # Own memory while recomputing, held half of T_fwd(600) = 40 ms on average:
    #   0.04 x 600 x 1000 / 2 = 12,000
    # The 3 chunks of 200 add 3 x a x 200 = a x 600 = 30 ms to iterations that run anyway;
    # the others' 1000 tokens wait that long: 0.03 x 1000 x 1000 = 30,000.
    assert waste.chunked_discard(p, 600, 1000, 56) == pytest.approx(42_000)
    # Charging each chunk a whole iteration (a x 200 + c, the old price) would have said
    # 12,000 + 3 x 0.02 x 1000 x 1000 = 72,000: more than recomputing at once (64,000).
    assert waste.discard(p, 600, 1000) == pytest.approx(64_000)


def test_chunk_count_does_not_change_the_price(p: Profile) -> None:
    # Running tokens 300 >= S: 38 chunks of 16 tokens, still a x 600 = 30 ms added in all.
    # (A fixed c per chunk would have made it 12,000 + 0.41 x 1000 x 1000 = 422,000.)
    assert waste.chunked_discard(p, 600, 1000, 300) == pytest.approx(42_000)
    assert waste.chunked_discard(p, 600, 1000, 0) == pytest.approx(42_000)


def test_chunked_discard_matches_equation_written_with_marginal_t_fwd(p: Profile) -> None:
    """Eq. 4 as written, n*T_fwd(C_i/n) read as the time n chunks add: n * a * (C_i / n)."""
    m, a = p.kv_bytes_per_token, p.fwd_a_ms / 1000
    for c_i, c_other, running in [(600, 1000, 56), (37, 5000, 10), (3000, 0, 400), (1, 7, 0)]:
        n = waste.recompute_chunks(p, c_i, running)
        expected = p.t_fwd(c_i) * c_i * m / 2 + n * (a * c_i / n) * c_other * m
        assert waste.chunked_discard(p, c_i, c_other, running) == pytest.approx(expected)
        batch = waste.chunked_discard_of(p, c_other, running)
        assert batch(c_i) == waste.chunked_discard(p, c_i, c_other, running)


def test_chat_call_on_gptj_chunked_is_cheaper_than_at_once() -> None:
    """A chat call (mean context 753 tokens, DESIGN section 4's table) beside 60,000 tokens of
    other requests' context, GPT-J-6B on an A100: a = 0.0463 ms/token, c = 10 ms, M = 458,752 B.

    T_fwd(753) = 0.0463 x 753 + 10 = 44.8639 ms.
    At once:  0.0448639 x (753 + 60,000) x M           = 2,725.616 x M = 1,250,382,028
    Chunked:  0.0448639 x 753 / 2 x M                   =    16.891 x M
            + 0.0000463 x 753 x 60,000 x M              = 2,091.834 x M
                                                        = 2,108.725 x M =   967,381,930
    The paper's claim holds: chunked <= at once. With 200 running tokens (chunks of 184, n = 5)
    a fixed 10 ms per chunk would add 5 x 0.01 x 60,000 = 3,000 x M and price it above at once.
    """
    p = load_profile("gptj-6b-a100-40g")
    assert waste.recompute_chunks(p, 753, 200) == 5
    at_once = waste.discard(p, 753, 60_000)
    chunked = waste.chunked_discard(p, 753, 60_000, 200)
    assert at_once == pytest.approx(1_250_382_028, rel=1e-9)
    assert chunked == pytest.approx(967_381_930, rel=1e-9)
    assert chunked <= at_once
    per_chunk_c = chunked + 5 * p.fwd_c_ms / 1000 * 60_000 * p.kv_bytes_per_token
    assert per_chunk_c > at_once  # what the old pricing said


@pytest.mark.parametrize("profile_name", [*available_profiles(), "tiny"])
def test_chunked_never_costs_more_than_at_once(
    profile_name: str, make_profile: Callable[..., Profile]
) -> None:
    """The paper's claim n*T_fwd(C_i/n) <= T_fwd(C_i), over a grid of contexts and batches."""
    p = make_profile() if profile_name == "tiny" else load_profile(profile_name)
    contexts = [1, 2, 15, 16, 17, 100, 255, 256, 257, 384, 753, 1000, 4000, 32_000]
    for running in [0, 1, 56, 255, 256, 300, 1000]:
        for c_other in [0, 1, 100, 3000, 60_000, 1_000_000]:
            batch = waste.chunked_discard_of(p, c_other, running)
            for c_i in contexts:
                chunked, at_once = batch(c_i), waste.discard(p, c_i, c_other)
                assert 0 < chunked <= at_once, (c_i, c_other, running)


def test_sync_swap(p: Profile) -> None:
    # T_swap(500) = 0.05 s; 2 x 0.05 x C_batch 2000 x 1000 B
    assert waste.sync_swap(p, 500, 2000) == pytest.approx(200_000)


def test_budgeted_swap_is_free() -> None:
    assert waste.budgeted_swap() == 0.0
