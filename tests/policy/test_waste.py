"""The waste equations of DESIGN section 4, checked against hand-computed values.

All with the tiny test profile: M = 1000 B/token, T_fwd(n) = (0.05 n + 10) ms, S = 256,
block size 16, T_swap(n) = n x 1000 B / 1e7 B/s = n x 1e-4 s.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.policy import Profile, load_profile, waste


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
    # T_fwd(600) = 0.05 x 600 + 10 = 40 ms: own memory while recomputing, halved on average:
    #   0.04 x 600 x 1000 / 2 = 12,000
    # n = 3 chunks of 200, T_fwd(200) = 20 ms, others' 1000 tokens wait for each chunk:
    #   3 x 0.02 x 1000 x 1000 = 60,000
    assert waste.chunked_discard(p, 600, 1000, 56) == pytest.approx(72_000)


def test_chunked_discard_when_running_tokens_fill_s(p: Profile) -> None:
    # Running tokens 300 >= S = 256: 38 chunks of 16 tokens.
    # n x T_fwd(C_i / n) = 38 x (0.05 x 600 / 38 + 10) ms = (30 + 380) ms = 0.41 s
    #   0.41 x 1000 x 1000 = 410,000; plus the own-memory term 12,000 as above.
    assert waste.chunked_discard(p, 600, 1000, 300) == pytest.approx(422_000)


def test_chunked_discard_matches_equation_written_with_t_fwd(p: Profile) -> None:
    """The implementation expands n*T_fwd(C_i/n); the equation as written must agree."""
    m = p.kv_bytes_per_token
    for c_i, c_other, running in [(600, 1000, 56), (37, 5000, 10), (3000, 0, 400)]:
        n = waste.recompute_chunks(p, c_i, running)
        expected = p.t_fwd(c_i) * c_i * m / 2 + n * p.t_fwd(c_i / n) * c_other * m
        assert waste.chunked_discard(p, c_i, c_other, running) == pytest.approx(expected)


def test_sync_swap(p: Profile) -> None:
    # T_swap(500) = 0.05 s; 2 x 0.05 x C_batch 2000 x 1000 B
    assert waste.sync_swap(p, 500, 2000) == pytest.approx(200_000)


def test_budgeted_swap_is_free() -> None:
    assert waste.budgeted_swap() == 0.0
