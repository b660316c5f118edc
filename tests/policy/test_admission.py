"""`interlude`'s admission: free blocks for the batch's growth decide how many may enter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import Decision, Phase, Profile
from interlude.policy.admission import admit_limit, growth_blocks, reserve_dynamic_limit

SEGMENT = 160.0  # predicted tokens per segment: 10 blocks of growth for a fresh segment


def mean_segment(kind: str) -> float:
    return SEGMENT


@pytest.fixture
def running(fake_request: Callable[..., Any]) -> list[Any]:
    """One decoding request: 20 blocks held, a whole segment (10 blocks) still to grow."""
    return [fake_request("r", phase=Phase.RUNNING, gpu=320)]


@pytest.fixture
def waiting(fake_request: Callable[..., Any]) -> list[Any]:
    """Three 640-token requests (40 blocks each)."""
    return [fake_request(f"w{i}", pending=640) for i in range(3)]


def test_growth_counts_the_blocks_each_request_has_left(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any]
) -> None:
    rs = [
        # 100 tokens, 40 of them generated: 220 at the segment's end, 14 blocks, 7 held.
        fake_request("a", phase=Phase.RUNNING, gpu=100, generated=40),
        fake_request("b", phase=Phase.RUNNING, gpu=100, generated=500),  # past the mean: 0
    ]
    assert growth_blocks(make_profile(), rs, mean_segment) == 7


def test_the_reserve_never_rises_while_requests_decode(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any]
) -> None:
    """Free blocks less half the growth, decode by decode: it may only fall (the simulator
    skips identical iterations on the strength of it)."""
    p = make_profile()
    last = None
    for generated in range(0, 400):
        gpu = 300 + generated
        r = fake_request("r", phase=Phase.RUNNING, gpu=gpu, generated=generated)
        avail = (p.gpu_blocks - p.blocks(gpu)) - 0.5 * growth_blocks(p, [r], mean_segment)
        assert last is None or avail <= last
        last = avail


def test_the_head_is_admitted_while_its_context_and_the_reserve_fit(
    make_profile: Callable[..., Profile], running: list[Any], waiting: list[Any]
) -> None:
    # Reserve: 0.5 x 10 blocks for r, and 5 per admitted request. 100 free: w0 takes
    # 40 + 5 (50 left), w1 45 (5 left), w2 does not fit.
    assert admit_limit(make_profile(), 100, running, waiting, mean_segment, 0.5) == 2
    # With the whole growth kept (headroom 1) only w0 fits: 100 - 10 - 50 = 40 < 50.
    assert admit_limit(make_profile(), 100, running, waiting, mean_segment, 1.0) == 1
    # Not even the head fits: nobody enters.
    assert admit_limit(make_profile(), 40, running, waiting, mean_segment, 0.5) == 0


def test_blocks_others_hold_already_are_not_counted_again(
    make_profile: Callable[..., Profile], running: list[Any], waiting: list[Any]
) -> None:
    """A waiting request whose prefix (a shared system block) others hold on the GPU needs
    only the rest: vLLM's `allocate_slots` takes the held blocks from the prefix cache."""
    p = make_profile()
    # 80 free, 5 kept for r's growth: w0 takes 40 + 5 (30 left), w1 would take 45.
    shared = {"w1": 20}
    assert admit_limit(p, 80, running, waiting, mean_segment, 0.5) == 1
    # With 20 of w1's 40 blocks held by others it takes 20 + 5 (5 left); w2 still not.
    assert admit_limit(p, 80, running, waiting, mean_segment, 0.5, shared=shared) == 2
    # TetriInfer's rule counts them the same way: 96 - 10 for r, 50 for w0, 30 for w1.
    assert reserve_dynamic_limit(p, 96, running, waiting, mean_segment) == 1
    assert reserve_dynamic_limit(p, 96, running, waiting, mean_segment, shared) == 2


def test_prompt_chunks_still_to_come_are_reserved_in_full(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any], waiting: list[Any]
) -> None:
    # Same as above, but r has 160 prompt tokens (10 blocks) left to compute: 100 - 10 - 5
    # = 85; w0 takes 45 (40 left) and w1 does not fit.
    r = fake_request("r", phase=Phase.RUNNING, gpu=320, pending=160)
    assert admit_limit(make_profile(), 100, [r], waiting, mean_segment, 0.5) == 1


def test_no_limit_when_it_cannot_bind(
    make_profile: Callable[..., Profile], running: list[Any], waiting: list[Any]
) -> None:
    p = make_profile()
    assert admit_limit(p, 1000, running, waiting, mean_segment, 0.5) is None  # all fit
    assert admit_limit(p, 40, running, waiting, mean_segment, 0.0) is None  # rule off
    # Nothing running: holding the head back would only idle the GPU.
    assert admit_limit(p, 40, [], waiting, mean_segment, 0.5) is None
    assert admit_limit(p, 40, running, [], mean_segment, 0.5) is None


def test_the_walk_stops_at_what_one_iteration_can_admit(
    make_profile: Callable[..., Profile], running: list[Any], fake_request: Callable[..., Any]
) -> None:
    # w0's 320 tokens already fill a 256-token batch; the 2000-token w1 behind it would not
    # fit, but no iteration can reach it, so the queue is not walked further.
    waiting = [fake_request("w0", pending=320), fake_request("w1", pending=2000)]
    p = make_profile(max_batched_tokens=256)
    assert admit_limit(p, 100, running, waiting, mean_segment, 0.5) is None
    assert admit_limit(make_profile(), 100, running, waiting, mean_segment, 0.5) == 1


def test_a_resumed_request_holding_its_kv_counts_as_running(
    make_profile: Callable[..., Profile],
    running: list[Any],
    waiting: list[Any],
    fake_request: Callable[..., Any],
) -> None:
    """vLLM queues a resumed session that kept its KV (the simulator runs it at once): the
    limit does not count it, and reserves for it as for a running request."""
    # 320 tokens held, a 160-token tool answer (10 blocks) to prefill: reserved in full, plus
    # 0.5 x its 10 blocks of growth. 100 - 5 - 10 - 5 = 80: w0 takes 45, w1 does not fit.
    resumed = fake_request("back", gpu=320, pending=160)
    assert admit_limit(make_profile(), 100, running, [resumed, *waiting], mean_segment, 0.5) == 1
    # It is never the one held back, even with nothing else running.
    assert admit_limit(make_profile(), 10, [], [resumed, *waiting], mean_segment, 0.5) == 0


def test_a_negative_admit_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="admit_limit"):
        Decision(admit_limit=-1)


def test_reserve_dynamic_keeps_the_growth_until_the_first_end(
    make_profile: Callable[..., Profile], fake_request: Callable[..., Any], waiting: list[Any]
) -> None:
    """TetriInfer's rule: memory must still suffice when the running request predicted to end
    first ends; until then everyone grows by what that one has left."""
    p = make_profile()  # 16-token blocks
    near = fake_request("near", phase=Phase.RUNNING, gpu=320, generated=150)  # 10 tokens left
    fresh = fake_request("fresh", phase=Phase.RUNNING, gpu=320)  # 160 left
    # The first end is 10 tokens away: each running request grows a block (2), each 640-token
    # waiting one 41 blocks: 98 free -> 57 -> 16, and the third does not fit.
    assert reserve_dynamic_limit(p, 100, [near, fresh], waiting, mean_segment) == 2
    # The whole predicted growth (headroom 1) holds back more for the same batch.
    assert admit_limit(p, 100, [near, fresh], waiting, mean_segment, 1.0) == 1
    # With only the fresh request running the first end is 160 tokens away: 10 blocks for it,
    # 50 for each waiting one: 90 -> 40, and the second does not fit.
    assert reserve_dynamic_limit(p, 100, [fresh], waiting, mean_segment) == 1
    assert reserve_dynamic_limit(p, 1000, [fresh], waiting, mean_segment) is None  # all fit
    assert reserve_dynamic_limit(p, 40, [], waiting, mean_segment) is None  # nothing runs
    assert reserve_dynamic_limit(p, 40, [fresh], [], mean_segment) is None  # nothing waits


def test_interlude_runs_either_admission_and_refuses_others() -> None:
    from interlude.policy import policy_class
    from interlude.policy.interlude_config import InterludeConfig

    assert InterludeConfig(admission="reserve-dynamic").admission == "reserve-dynamic"
    with pytest.raises(ValueError, match="admission must be one of"):
        InterludeConfig(admission="greedy")
    variant = policy_class("interlude.policy.variants:ReserveDynamic")
    assert variant.name == "interlude-reserve-dynamic"
