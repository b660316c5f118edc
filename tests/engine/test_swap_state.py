"""The host-swap connector's scheduler-side bookkeeping (no engine): a request that looked up
its host copy but finished before an allocation leaves nothing behind."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore.swap import HostSwapConnector, SwapMetadata


def bare_connector(capacity: int) -> HostSwapConnector:
    c = object.__new__(HostSwapConnector)
    c.block_size = 32
    c.capacity = capacity
    c._free_slots = list(range(capacity - 1, -1, -1))
    c.copies = {}
    c._local_hit = {}
    c._loaded = {}
    c._pending = SwapMetadata()
    return c


def test_a_finished_request_leaves_no_lookup_or_slot_behind() -> None:
    c = bare_connector(4)
    r = Request("r", list(range(100)), SamplingParams(max_tokens=4), None)
    c.save("r", [5, 6], tokens=64)
    assert c.free_slots == 2
    offered, _ = c.get_num_new_matched_tokens(r, num_computed_tokens=32)
    assert offered == 32  # the host copy's second block, past the prefix-cache hit
    assert c._local_hit == {"r": 32}
    c.request_finished(r, [])  # aborted while it waited for blocks: no allocation came
    assert c._local_hit == {} and c.copies == {} and c.free_slots == 4
