"""The simulator's side of the engine's slot rule (`tests/engine/test_slots.py`): a paused
request holds a `max_num_seqs` slot only while its KV is on the GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from interlude.sim.batch import Batch
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival

SimFactory = Callable[..., Simulator]
TOOL_S = 3.0


@pytest.mark.parametrize(("policy", "all_start_before_a_tool_returns"), [
    ("vllm", True),  # the KV is dropped at the pause: the slot goes with it
    ("preserve", False),  # the KV stays: so does the slot, and four must wait for a resume
])  # fmt: skip
def test_a_paused_request_holds_a_slot_only_with_its_kv_on_the_gpu(
    policy: str,
    all_start_before_a_tool_returns: bool,
    make_simulator: SimFactory,
    make_profile: Callable[..., object],
    make_requests: Callable[..., list[object]],
    make_arrivals: Callable[..., list[Arrival]],
) -> None:
    admitted: dict[str, float] = {}

    def observe(sim: Simulator, batch: Batch, k: int) -> None:
        for r in batch.admitted:
            admitted.setdefault(r.request_id, sim.now)

    arrivals = make_arrivals(make_requests(6, prompt=40, gen=4, duration=TOOL_S, final_gen=4))
    sim = make_simulator(policy, arrivals, profile=make_profile(max_num_seqs=2), observer=observe)
    assert sim.run().finished == 6
    spread = max(admitted.values()) - min(admitted.values())
    assert (spread < TOOL_S) is all_start_before_a_tool_returns, admitted
