"""Slot pressure (`policy/slots.py`): parked sessions give their `max_num_seqs` slots to
waiting requests when memory is plentiful and the slots alone keep the queue waiting."""

from __future__ import annotations

from interlude.policy import Handling, InterludePolicy, Phase
from interlude.policy.slots import slot_deficit, slot_releases


def test_deficit_counts_waiting_and_swap_ins_against_free_slots(
    make_profile, make_view, fake_request
) -> None:
    p = make_profile(max_num_seqs=4)
    running = [fake_request("run", phase=Phase.RUNNING, gpu=32)]
    waiting = [fake_request(f"w{i}") for i in range(3)]
    swap_in = [fake_request("s", phase=Phase.SWAP_QUEUED, cpu=32)]
    view = make_view(profile=p, running=running, waiting=waiting, swap_queue=swap_in)
    # 4 slots: 1 running, 2 held by parked sessions, 1 free; 4 queued want one each.
    assert slot_deficit(view, parked_holders=2) == 3
    assert slot_deficit(view, parked_holders=0) == 1
    assert slot_deficit(make_view(profile=p, running=running), parked_holders=3) == 0


def test_releases_go_to_the_longest_calls_first(fake_request) -> None:
    holders = [
        fake_request(f"h{i}", phase=Phase.PAUSED, gpu=16, arrival=float(i)) for i in range(4)
    ]
    left = {"h0": 1.0, "h1": 9.0, "h2": 9.0, "h3": 5.0}
    chosen = slot_releases(holders, 3, lambda r: left[r.request_id])
    assert [r.request_id for r in chosen] == ["h1", "h2", "h3"]  # ties: earliest arrival
    assert slot_releases(holders, 0, lambda r: 0.0) == []


def _slot_bound_view(make_profile, make_view, fake_request, slots=4, **view):
    """4 slots (`slots`), all held by sessions parked in their calls; plenty of free blocks;
    `view`: other `make_view` arguments."""
    paused = [
        fake_request(f"h{i}", phase=Phase.PAUSED, gpu=32, paused_at=0.0, arrival=float(i))
        for i in range(4)
    ]
    waiting = [fake_request(f"w{i}", pending=40, arrival=5.0) for i in range(2)]
    p = make_profile(max_num_seqs=slots)
    return make_view(profile=p, now=1.0, paused=paused, waiting=waiting, **view)


def test_parked_sessions_free_slots_for_waiting_requests(
    make_profile, make_view, fake_request
) -> None:
    view = _slot_bound_view(make_profile, make_view, fake_request)
    policy = InterludePolicy(view.profile)
    assert not policy.memory_pressure(view)
    d = policy.decide(view)
    assert len(d.kv) == 2  # two waiting requests, two slots
    # Within the swap link's budget the KV goes to host memory whole; each frees its slot.
    assert {a.handling for a in d.kv} == {Handling.SWAP}
    assert all(a.blocks == 2 for a in d.kv)
    assert {a.request_id for a in d.kv} == {"h0", "h1"}  # equal estimates: first arrivals


def test_a_context_larger_than_the_budget_goes_over_several_iterations(
    make_profile, make_view, fake_request
) -> None:
    # A link that takes 3 blocks an iteration: the first session's 2 blocks and 1 of the
    # second's; the rest waits for the next iteration (no discard: the host has room).
    view = _slot_bound_view(make_profile, make_view, fake_request, swap_budget_tokens=3 * 16)
    d = InterludePolicy(view.profile).decide(view)
    assert [(a.request_id, a.handling, a.blocks) for a in d.kv] == [
        ("h0", Handling.SWAP, 2),
        ("h1", Handling.SWAP, 1),
    ]


def test_a_context_the_host_cannot_hold_is_discarded(make_profile, make_view, fake_request) -> None:
    full = _slot_bound_view(make_profile, make_view, fake_request, free_cpu_blocks=0)
    d = InterludePolicy(full.profile).decide(full)
    assert [a.handling for a in d.kv] == [Handling.DISCARD, Handling.DISCARD]


def test_no_release_while_slots_are_free(make_profile, make_view, fake_request) -> None:
    roomy = _slot_bound_view(make_profile, make_view, fake_request, slots=6)
    assert InterludePolicy(roomy.profile).decide(roomy).kv == ()


def test_new_arrivals_do_not_wait_for_calls_to_end_in_the_simulator(
    make_profile, make_requests, make_arrivals, make_simulator
) -> None:
    """Sessions in 20 s calls hold every slot; a second wave arrives behind them. Without the
    rule it waited for the calls to end (first tokens about 20 s late)."""
    p = make_profile(max_num_seqs=4, gpu_kv_bytes=2000 * 16 * 1000)
    first = make_requests(4, prompt=64, gen=8, duration=20.0, prefix="a")
    second = make_requests(4, prompt=64, gen=8, calls=0, prefix="b")
    arrivals = make_arrivals([*first, *second], gap=0.5)
    m = make_simulator("interlude", arrivals, profile=p).run()
    assert m.unfinished == 0
    assert m.ttft_p99 < 1.0, m.ttft_p99
