"""The policy seam and the four baselines (vllm, improved-discard, preserve, swap)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from interlude.policy import (
    POLICIES,
    BatchMode,
    Decision,
    Handling,
    KVAction,
    Phase,
    Profile,
    SchedulerView,
    SwapMode,
    make_policy,
)
from interlude.policy.base import swap_in_need, swap_out_budget_blocks

ViewFactory = Callable[..., SchedulerView]
RequestFactory = Callable[..., Any]


def test_registry_order_and_make_policy(make_profile: Callable[..., Profile]) -> None:
    assert list(POLICIES) == [
        "vllm",
        "vllm-v0",
        "improved-discard",
        "preserve",
        "swap",
        "infercept",
        "lamps",
        "lamps-predicted",
        "thunderagent",
        "thunderagent-decay",
        "continuum",
        "continuum-fixed-ttl",
        "interlude",
    ]
    p = make_profile()
    for name, cls in POLICIES.items():
        policy = make_policy(name, p)
        assert isinstance(policy, cls) and policy.name == name and policy.profile is p
        assert policy.description
    with pytest.raises(ValueError, match=r"unknown policy 'fifo'; choose from vllm, "):
        make_policy("fifo", p)


def test_traits() -> None:
    v0 = {"vllm-v0", "improved-discard", "preserve", "swap"}
    for name, cls in POLICIES.items():
        mode = BatchMode.PREFILL_FIRST if name in v0 else BatchMode.CHUNKED
        mode = BatchMode.V1 if name == "vllm" else mode
        assert cls.traits.batch_mode is mode, name
        # The paper's v0 baselines ran without a prefix cache; every other policy has one.
        assert cls.traits.prefix_cache is (name not in v0), name
        sync = SwapMode.SYNC if name == "swap" else SwapMode.BUDGETED
        assert cls.traits.swap_mode is sync, name


def test_kv_action_validation() -> None:
    with pytest.raises(ValueError, match=r"PRESERVE is the absence"):
        KVAction("a", Handling.PRESERVE, 1)
    with pytest.raises(ValueError, match=r"blocks must be >= 1"):
        KVAction("a", Handling.DISCARD, 0)
    assert Decision() == Decision(kv=(), requeue=(), review_at=None, review_iteration=None)


def test_swap_budget_helpers(make_view: ViewFactory, fake_request: RequestFactory) -> None:
    back = fake_request("back", phase=Phase.SWAP_QUEUED, cpu=40, pending=5)
    view = make_view(swap_queue=[back], swap_budget_tokens=150, free_cpu_blocks=50)
    assert swap_in_need(view) == 40  # all of its 40 host tokens fit the 150-token budget
    assert swap_out_budget_blocks(view) == 6  # (150 - 40) // 16 = 6 blocks left to swap out
    tight = make_view(swap_queue=[back], swap_budget_tokens=150, free_cpu_blocks=4)
    assert swap_out_budget_blocks(tight) == 4  # host memory is the limit
    flooded = make_view(swap_queue=[back, back, back, back], swap_budget_tokens=150)
    assert swap_in_need(flooded) == 150  # 160 wanted, capped at the budget
    assert swap_out_budget_blocks(flooded) == 0


def test_default_preemption_order_is_last_admitted_first(
    make_profile: Callable[..., Profile], fake_request: RequestFactory
) -> None:
    reqs = [
        fake_request(rid, phase=Phase.RUNNING, gpu=50, queue_time=t)
        for rid, t in (("a", 1.0), ("b", 3.0), ("c", 2.0))
    ]
    order = make_policy("vllm", make_profile()).preemption_order(reqs)
    assert [r.request_id for r in order] == ["b", "c", "a"]


def _paused_pair(fake_request: RequestFactory) -> tuple[Any, Any, Any]:
    on_gpu = fake_request("on-gpu", phase=Phase.PAUSED, gpu=100, paused_at=0.0)  # 7 blocks
    dropped = fake_request("dropped", phase=Phase.PAUSED, pending=80, paused_at=0.0)
    swapped = fake_request("swapped", phase=Phase.PAUSED, cpu=64, paused_at=0.0)
    return on_gpu, dropped, swapped


@pytest.mark.parametrize("name", ["vllm", "improved-discard"])
def test_discard_baselines_free_every_gpu_block(
    name: str,
    make_profile: Callable[..., Profile],
    make_view: ViewFactory,
    fake_request: RequestFactory,
) -> None:
    policy = make_policy(name, make_profile())
    view = make_view(paused=_paused_pair(fake_request))
    # 100 tokens = ceil(100 / 16) = 7 blocks; requests holding nothing on the GPU get no action.
    assert policy.decide(view).kv == (KVAction("on-gpu", Handling.DISCARD, 7),)


def test_vllm_continuation_queues_at_the_tail(
    make_profile: Callable[..., Profile], fake_request: RequestFactory
) -> None:
    """vllm: the continuation is a new request; its rank is the time it entered the queue."""
    old = fake_request("old", arrival=0.0, queue_time=10.0, pending=120)  # resumed at 10 s
    new = fake_request("new", arrival=5.0, queue_time=5.0, pending=50)  # waiting since 5 s
    vllm = make_policy("vllm", make_profile())
    assert vllm.queue_key(old, 10.0) == (10.0,)
    assert vllm.queue_key(new, 10.0) == (5.0,)
    assert vllm.queue_key(new, 10.0) < vllm.queue_key(old, 10.0)


def test_improved_discard_keeps_the_original_arrival(
    make_profile: Callable[..., Profile], fake_request: RequestFactory
) -> None:
    old = fake_request("old", arrival=0.0, queue_time=10.0, pending=120)
    new = fake_request("new", arrival=5.0, queue_time=5.0, pending=50)
    improved = make_policy("improved-discard", make_profile())
    assert improved.queue_key(old, 10.0) == (0.0,)
    assert improved.queue_key(old, 10.0) < improved.queue_key(new, 10.0)


def test_preserve_never_acts(
    make_profile: Callable[..., Profile], make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    policy = make_policy("preserve", make_profile())
    # Worst case for preserving: a call paused for an hour, memory full, a queue waiting.
    paused = fake_request("p", phase=Phase.PAUSED, gpu=3000, paused_at=0.0)
    waiting = fake_request("w", pending=500)
    view = make_view(now=3600.0, paused=[paused], waiting=[waiting], free_gpu_blocks=0)
    assert policy.decide(view) == Decision()


def test_swap_moves_whole_contexts_then_discards_when_host_is_full(
    make_profile: Callable[..., Profile], make_view: ViewFactory, fake_request: RequestFactory
) -> None:
    policy = make_policy("swap", make_profile())
    # By arrival: a (3 blocks), b (4 blocks), c (2 blocks); the host has 5 free blocks.
    a = fake_request("a", phase=Phase.PAUSED, arrival=1.0, gpu=48, paused_at=5.0)
    b = fake_request("b", phase=Phase.PAUSED, arrival=2.0, gpu=64, paused_at=5.0)
    c = fake_request("c", phase=Phase.PAUSED, arrival=3.0, gpu=20, paused_at=5.0)
    view = make_view(now=5.0, paused=[c, b, a], free_cpu_blocks=5, swap_budget_tokens=16)
    # a: 3 <= 5 swapped, 2 left; b: 4 > 2 discarded; c: 2 <= 2 swapped. Whole contexts, no
    # matter the per-iteration budget (sync mode stalls instead).
    assert policy.decide(view).kv == (
        KVAction("a", Handling.SWAP, 3),
        KVAction("b", Handling.DISCARD, 4),
        KVAction("c", Handling.SWAP, 2),
    )
    full = make_view(now=5.0, paused=[a], free_cpu_blocks=0)
    assert policy.decide(full).kv == (KVAction("a", Handling.DISCARD, 3),)
