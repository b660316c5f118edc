"""The host link (enginecore/kvlink.py) without an engine: the scheduler side's plans on both
ends of a prefill -> decode handoff, and the worker side's segments with real tensors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.request import Request

from interlude.enginecore import kvlink_segment as segment
from interlude.enginecore.kvlink import SEGMENT_KEY, HostLinkConnector, LinkMetadata, tokens_hash

BS = 32


def bare_link() -> HostLinkConnector:
    c = object.__new__(HostLinkConnector)
    c.directory, c.ttl_s, c.prefix = "/dev/shm", 120.0, "interlude-kv-test-"
    c.block_size, c.num_blocks = BS, 64
    c.sends, c._offers, c._taken, c._pending, c._segments = {}, {}, set(), LinkMetadata(), 0
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


def test_the_prefill_side_writes_the_prompt_s_blocks_once_its_last_chunk_runs() -> None:
    c = bare_link()
    r = request("p", PROMPT, {"do_remote_decode": True})
    c.update_state_after_alloc(r, Allocated([7, 8]), 0)  # chunked: the first 64 tokens' blocks
    assert step(c, new=[("p", [7, 8], 0)], scheduled={"p": 64}).saves == []
    meta = step(c, cached=[("p", [9, 10], 64)], scheduled={"p": 36})
    assert len(meta.saves) == 1 and meta.saves[0].block_ids == [7, 8, 9, 10]
    assert step(c, cached=[("p", None, 100)], scheduled={"p": 1}).saves == []  # written once
    delay, params = c.request_finished(r, [7, 8, 9, 10])
    assert delay is False and params is not None
    assert params["do_remote_prefill"] is True and params[SEGMENT_KEY] == meta.saves[0].path
    assert params["remote_num_tokens"] == 100 and params["remote_block_size"] == BS
    assert params["remote_tokens_hash"] == tokens_hash(PROMPT)
    assert c.sends == {}


def test_a_prefill_aborted_before_its_prompt_ran_hands_nothing_over() -> None:
    c = bare_link()
    r = request("p", PROMPT, {"do_remote_decode": True})
    c.update_state_after_alloc(r, Allocated([7, 8, 9, 10]), 0)
    assert c.request_finished(r, [7, 8, 9, 10]) == (False, None) and c.sends == {}


def handoff(n: int = 100, **over: Any) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        SEGMENT_KEY: "/dev/shm/interlude-kv-peer-1",
        "remote_num_tokens": n,
        "remote_tokens_hash": tokens_hash(PROMPT[:n]),
        "remote_block_size": BS,
    } | over


def test_the_decode_side_loads_the_blocks_past_its_own_prefix_cache_hit_once() -> None:
    c = bare_link()
    r = request("d", PROMPT, handoff())
    # 32 tokens hit this engine's prefix cache: the segment's other 68 are offered, async.
    assert c.get_num_new_matched_tokens(r, 32) == (68, True)
    c.update_state_after_alloc(r, Allocated([20, 21, 22, 23]), 68)
    (job,) = step(c).loads
    # Engine blocks 1-3 of the request come from the segment's blocks 1-3.
    assert job.pairs == [(21, 1), (22, 2), (23, 3)] and job.blocks == 4
    assert job.request_id == "d" and job.path == handoff()[SEGMENT_KEY]
    # A session that parks and resumes later does not look again.
    assert c.get_num_new_matched_tokens(r, 100) == (0, False)


@pytest.mark.parametrize(
    "params",
    [
        handoff(remote_block_size=16),  # another layout of blocks
        handoff(remote_tokens_hash=tokens_hash([1, 2, 3])),  # made for other tokens
        handoff(n=500),  # longer than this request
    ],
)
def test_a_segment_that_does_not_fit_is_refused_and_the_prompt_prefilled_here(
    params: dict[str, Any],
) -> None:
    c = bare_link()
    r = request("d", PROMPT, params)
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    assert "d" in c._taken and step(c).loads == []


def test_a_request_without_handoff_params_is_not_the_link_s() -> None:
    c = bare_link()
    r = request("x", PROMPT)
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    c.update_state_after_alloc(r, Allocated([1, 2, 3, 4]), 0)
    assert c.sends == {} and step(c) == LinkMetadata()


def kv_caches(num_blocks: int, seed: int) -> dict[str, torch.Tensor]:
    """KV tensors as vLLM's CPU backend lays them out: (2, blocks, heads, block, head dim),
    two layers sharing one tensor (cross-layer sharing) beside a layer of its own."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2, num_blocks, 2, BS, 8, generator=g)
    b = torch.randn(2, num_blocks, 2, BS, 8, generator=g)
    return {"layers.0.attn": a, "layers.1.attn": b, "layers.2.attn": a}


def test_a_segment_carries_blocks_between_two_engines_layouts(tmp_path: Path) -> None:
    prefill, decode = kv_caches(16, 0), kv_caches(16, 1)
    out = segment.KVLayout.of(prefill, 16)
    into = segment.KVLayout.of(decode, 16)
    assert len(out.tensors) == 2  # the shared tensor once
    path = str(tmp_path / "seg")
    segment.write(out, path, [5, 9, 2])
    assert os.path.getsize(path) == out.elements(3) * 4 and not os.path.exists(path + ".tmp")
    segment.read(into, path, [(11, 0), (12, 1), (13, 2)], blocks=3)
    for name in prefill:
        assert torch.equal(decode[name][:, [11, 12, 13]], prefill[name][:, [5, 9, 2]])
    untouched = kv_caches(16, 1)["layers.1.attn"]
    assert torch.equal(decode["layers.1.attn"][:, :11], untouched[:, :11])


def test_a_segment_of_another_size_or_gone_is_refused(tmp_path: Path) -> None:
    caches = kv_caches(16, 0)
    layout = segment.KVLayout.of(caches, 16)
    path = str(tmp_path / "seg")
    segment.write(layout, path, [1, 2])
    with pytest.raises(segment.SegmentError, match="needs"):
        segment.read(layout, path, [(3, 0)], blocks=3)
    with pytest.raises(segment.SegmentError, match="gone"):
        segment.read(layout, str(tmp_path / "missing"), [(3, 0)], blocks=1)


def test_the_writer_sweeps_only_its_own_segments_past_their_ttl(tmp_path: Path) -> None:
    for name in ("interlude-kv-a-1", "interlude-kv-a-2", "interlude-kv-b-1"):
        (tmp_path / name).write_bytes(b"x")
    old = os.path.getmtime(tmp_path / "interlude-kv-a-1")
    os.utime(tmp_path / "interlude-kv-a-1", (old - 300, old - 300))
    os.utime(tmp_path / "interlude-kv-b-1", (old - 300, old - 300))
    assert segment.sweep(str(tmp_path), "interlude-kv-a-", ttl_s=120) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["interlude-kv-a-2", "interlude-kv-b-1"]
