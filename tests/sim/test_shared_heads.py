"""Prompt heads many requests share: held once on an engine with a prefix cache, computed by
the first request of a group only (`sim/shared_heads.py`), as vLLM's prefix cache does."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.policy import Profile, load_profile, make_policy
from interlude.sim.cluster import Cluster, ClusterSpec
from interlude.sim.metrics import RunMetrics
from interlude.sim.shared_heads import head_blocks, own_arrivals, own_part, pinned_blocks
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceCall, TraceRequest

BS = 16


def program(rid: str, prompt: int, head: int, group: str = "g") -> TraceRequest:
    calls = (Segment(20, TraceCall("t", 0.5, 10)), Segment(20, None))
    return TraceRequest(rid, "k", prompt, calls, head, group if head else "")


def test_a_request_keeps_the_partial_block_after_its_head_and_a_token_to_compute() -> None:
    r = program("a", 200, 100)  # a head of 6 full blocks and 4 tokens
    assert head_blocks(r, BS) == 6
    own = own_part(r, BS)
    assert (own.prompt_tokens, own.shared_prefix_tokens, own.prefix_group) == (104, 0, "")
    whole = program("b", 96, 96)  # the head is the prompt: its last block is computed
    assert head_blocks(whole, BS) == 5 and own_part(whole, BS).prompt_tokens == 16
    assert own_part(program("c", 200, 0), BS) == program("c", 200, 0)


def test_each_group_pins_its_largest_head_once() -> None:
    traces = [program("a", 300, 64), program("b", 300, 96), program("c", 300, 160, "h")]
    assert pinned_blocks(traces, BS) == 6 + 10


def test_the_first_of_a_group_computes_its_head_and_the_rest_find_it() -> None:
    arrivals = [Arrival(t, program(f"r{t}", 200, 128), f"{t}:r") for t in (0.2, 0.0, 0.1)]
    out, pinned = own_arrivals(arrivals, BS, cached=True)
    assert [a.time_s for a, _ in out] == [0.0, 0.1, 0.2]
    assert [(a.request.prompt_tokens, found) for a, found in out] == [
        (200, 0),
        (72, 128),
        (72, 128),
    ]
    assert pinned == 8
    plain, none = own_arrivals(arrivals, BS, cached=False)
    assert none == 0 and [found for _, found in plain] == [0, 0, 0]


def run(
    make_simulator: Callable[..., Simulator], p: Profile, policy: str, head: int
) -> tuple[Simulator, RunMetrics]:
    arrivals = [Arrival(0.05 * i, program(f"r{i}", 600, head), f"{i}:r{i}") for i in range(8)]
    sim = make_simulator(policy, arrivals, profile=p)  # integrity checked every step
    return sim, sim.run()


def test_a_shared_head_is_held_once_and_computed_once(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile]
) -> None:
    """Eight 600-token prompts opening with the same 512 tokens on a GPU of 100 blocks: with
    vLLM's prefix cache they fit at once (32 pinned blocks + about 6 own blocks each); each
    whole one needs 40, so without it two run at a time."""
    p = make_profile(gpu_kv_bytes=100 * BS * 1000)
    shared, m = run(make_simulator, p, "vllm", 512)
    alone, a = run(make_simulator, p, "vllm", 0)
    v0, old = run(make_simulator, p, "vllm-v0", 512)
    assert shared.kv.pinned == 32 and alone.kv.pinned == v0.kv.pinned == 0
    assert m.finished == a.finished == old.finished == 8
    assert m.shared_head_tokens == 7 * 512 and a.shared_head_tokens == old.shared_head_tokens == 0
    assert m.ttft_p99 < a.ttft_p99 / 2


def test_every_engine_of_a_cluster_holds_the_heads() -> None:
    p = load_profile("gptj-6b-a100-40g")
    arrivals = [Arrival(0.1 * i, program(f"r{i}", 3000, 2048), f"{i}:r{i}") for i in range(6)]
    spec = ClusterSpec(("mixed", "mixed"), horizon_s=600.0, check_integrity=True)
    c = Cluster(p, lambda q: make_policy("interlude", q), arrivals, spec, rate=1.0)
    m = c.run()
    assert m.run.finished == 6
    assert [e.kv.pinned for e in c.engines] == [2048 // p.block_size] * 2
    assert m.run.shared_head_tokens == 5 * 2048


@pytest.mark.parametrize("policy", ["interlude", "infercept", "lamps"])
def test_policies_that_pause_keep_the_books_with_pinned_heads(
    make_simulator: Callable[..., Simulator], make_profile: Callable[..., Profile], policy: str
) -> None:
    """Discards, swaps and preemptions of requests whose heads are pinned keep every block
    and token accounted for (the integrity check runs after every step)."""
    p = make_profile(gpu_kv_bytes=80 * BS * 1000)
    sim, m = run(make_simulator, p, policy, 512)
    assert sim.kv.pinned == 32 and m.finished == 8
