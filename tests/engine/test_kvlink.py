"""The host link (enginecore/kvlink.py) without an engine: the scheduler side's plans on both
ends of a prefill -> decode handoff, with the real markers in a temporary directory (the arena
itself: test_kvlink_arena.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.kvlink import HostLinkConnector
from interlude.enginecore.kvlink_handoff import SEGMENT_KEY, LinkMetadata, tokens_hash
from interlude.enginecore.kvlink_slots import TAKEN, Handoffs

BS = 32


def bare_link(directory: Path, capacity: int = 16) -> HostLinkConnector:
    c = object.__new__(HostLinkConnector)
    c.directory, c.ttl_s, c.prefix = str(directory), 120.0, "interlude-kv-test-"
    c.arena_path = str(directory / "interlude-kv-test-arena")
    c.block_size, c.num_blocks, c.capacity = BS, 64, capacity
    c.handoffs = Handoffs(c.directory, c.prefix, capacity, c.ttl_s)
    c.sends, c._offers, c._claims, c._taken, c._pending = {}, {}, {}, set(), LinkMetadata()
    c.unsent, c._reclaimed_at = 0, 0.0
    return c


class Allocated:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (self.ids,)


def request(rid: str, tokens: list[int], kv: dict[str, Any] | None = None) -> Request:
    params = SamplingParams(max_tokens=4, extra_args={"kv_transfer_params": kv} if kv else None)
    return Request(rid, tokens, params, None)


def step(
    c: HostLinkConnector,
    new: Sequence[tuple[str, list[int], int]] = (),
    cached: Sequence[tuple[str, list[int] | None, int]] = (),
    scheduled: dict[str, int] | None = None,
) -> LinkMetadata:
    """One step's metadata: `new` (id, blocks, computed) and `cached` (id, added, computed)."""
    so = SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, block_ids=(b,), num_computed_tokens=n) for r, b, n in new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r for r, _, _ in cached],
            resumed_req_ids=set(),
            new_block_ids=[None if b is None else (b,) for _, b, _ in cached],
            num_computed_tokens=[n for _, _, n in cached],
        ),
        num_scheduled_tokens=scheduled or {},
    )
    meta = c.build_connector_meta(so)  # type: ignore[arg-type]
    assert isinstance(meta, LinkMetadata)
    return meta


PROMPT = list(range(3, 3 + 100))  # 100 tokens: four blocks, the last partly filled


def test_the_prefill_side_writes_the_prompt_s_blocks_once_its_last_chunk_runs(
    tmp_path: Path,
) -> None:
    c = bare_link(tmp_path)
    r = request("p", PROMPT, {"do_remote_decode": True})
    c.update_state_after_alloc(r, Allocated([7, 8]), 0)  # chunked: the first 64 tokens' blocks
    assert step(c, new=[("p", [7, 8], 0)], scheduled={"p": 64}).saves == []
    meta = step(c, cached=[("p", [9, 10], 64)], scheduled={"p": 36})
    (save,) = meta.saves
    assert save.block_ids == [7, 8, 9, 10] and save.start == 0 and c.handoffs.slots.free == 12
    assert step(c, cached=[("p", None, 100)], scheduled={"p": 1}).saves == []  # written once
    assert not os.listdir(tmp_path)  # nothing published before the request ends
    delay, params = c.request_finished(r, [7, 8, 9, 10])
    assert delay is False and params is not None
    assert params["do_remote_prefill"] is True and os.path.exists(params[SEGMENT_KEY])
    assert params["interlude_seq"] == save.seq and params["interlude_slot"] == 0
    assert params["interlude_arena"] == c.arena_path and params["interlude_capacity"] == 16
    assert params["remote_num_tokens"] == 100 and params["remote_block_size"] == BS
    assert params["remote_tokens_hash"] == tokens_hash(PROMPT)
    assert c.sends == {}


def test_a_prefill_aborted_before_its_prompt_ran_hands_nothing_over(tmp_path: Path) -> None:
    c = bare_link(tmp_path)
    r = request("p", PROMPT, {"do_remote_decode": True})
    c.update_state_after_alloc(r, Allocated([7, 8, 9, 10]), 0)
    assert c.request_finished(r, [7, 8, 9, 10]) == (False, None) and c.sends == {}


def test_a_prefill_aborted_after_its_write_gives_its_slots_back(tmp_path: Path) -> None:
    c = bare_link(tmp_path)
    r = request("p", PROMPT, {"do_remote_decode": True})
    c.update_state_after_alloc(r, Allocated([7, 8, 9, 10]), 0)
    assert len(step(c, new=[("p", [7, 8, 9, 10], 0)], scheduled={"p": 100}).saves) == 1
    r.status = RequestStatus.FINISHED_ABORTED
    assert c.request_finished(r, [7, 8, 9, 10]) == (False, None)
    assert c.handoffs.slots.free == 16 and not os.listdir(tmp_path)


def test_a_full_arena_hands_the_prompt_over_unprefilled(tmp_path: Path) -> None:
    c = bare_link(tmp_path, capacity=6)
    for rid in ("a", "b"):
        r = request(rid, PROMPT, {"do_remote_decode": True})
        c.update_state_after_alloc(r, Allocated([1, 2, 3, 4]), 0)
        step(c, new=[(rid, [1, 2, 3, 4], 0)], scheduled={rid: 100})
    assert c.unsent == 1 and "b" not in c.sends  # 4 of 6 slots held by "a"
    assert c.request_finished(request("b", PROMPT), []) == (False, None)


def handoff(marker: Path, n: int = 100, **over: Any) -> dict[str, Any]:
    marker.touch(exist_ok=True)
    return {
        "do_remote_prefill": True,
        SEGMENT_KEY: str(marker),
        "interlude_arena": "/dev/shm/interlude-kv-peer-arena",
        "interlude_capacity": 64,
        "interlude_slot": 8,
        "interlude_seq": 3,
        "remote_num_tokens": n,
        "remote_tokens_hash": tokens_hash(PROMPT[:n]),
        "remote_block_size": BS,
    } | over


def test_the_decode_side_claims_the_segment_and_loads_past_its_prefix_cache_hit_once(
    tmp_path: Path,
) -> None:
    c = bare_link(tmp_path)
    marker = tmp_path / "interlude-kv-peer-3"
    r = request("d", PROMPT, handoff(marker))
    # 32 tokens hit this engine's prefix cache: the segment's other 68 are offered, async.
    assert c.get_num_new_matched_tokens(r, 32) == (68, True)
    assert not marker.exists() and os.path.exists(f"{marker}{TAKEN}")  # claimed
    assert c.get_num_new_matched_tokens(r, 32) == (68, True)  # asked again: the same claim
    c.update_state_after_alloc(r, Allocated([20, 21, 22, 23]), 68)
    (job,) = step(c).loads
    # Engine blocks 1-3 of the request come from the segment's blocks 1-3, in the peer's slots.
    assert job.pairs == [(21, 1), (22, 2), (23, 3)]
    assert (job.request_id, job.where.start, job.where.seq, job.where.capacity) == ("d", 8, 3, 64)
    assert job.where.arena == "/dev/shm/interlude-kv-peer-arena" and job.where.marker == str(marker)
    c.update_connector_output(KVConnectorOutput(finished_recving={"d"}))
    assert not os.path.exists(f"{marker}{TAKEN}")  # released: the writer may reuse its slots
    # A session that parks and resumes later does not look again.
    assert c.get_num_new_matched_tokens(r, 100) == (0, False)


def test_a_segment_another_engine_claimed_or_that_expired_is_refused(tmp_path: Path) -> None:
    c = bare_link(tmp_path)
    marker = tmp_path / "interlude-kv-peer-3"
    params = handoff(marker)
    marker.unlink()
    assert c.get_num_new_matched_tokens(request("d", PROMPT, params), 0) == (0, False)
    assert step(c).loads == []


def test_a_request_aborted_before_its_load_releases_its_claim(tmp_path: Path) -> None:
    c = bare_link(tmp_path)
    marker = tmp_path / "interlude-kv-peer-3"
    r = request("d", PROMPT, handoff(marker))
    assert c.get_num_new_matched_tokens(r, 0) == (100, True)
    assert c.request_finished(r, []) == (False, None)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "over",
    [
        {"remote_block_size": 16},  # another layout of blocks
        {"remote_tokens_hash": tokens_hash([1, 2, 3])},  # made for other tokens
        {"n": 500},  # longer than this request
    ],
)
def test_a_segment_that_does_not_fit_is_refused_and_the_prompt_prefilled_here(
    over: dict[str, Any], tmp_path: Path
) -> None:
    c = bare_link(tmp_path)
    marker = tmp_path / "interlude-kv-peer-3"
    r = request("d", PROMPT, handoff(marker, **over))
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    assert "d" in c._taken and step(c).loads == []
    assert marker.exists()  # not claimed: it is not this request's


def test_a_request_without_handoff_params_is_not_the_link_s(tmp_path: Path) -> None:
    c = bare_link(tmp_path)
    r = request("x", PROMPT)
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    c.update_state_after_alloc(r, Allocated([1, 2, 3, 4]), 0)
    assert c.sends == {} and step(c) == LinkMetadata()
