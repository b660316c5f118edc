"""The KV link's arena (enginecore/kvlink_segment.py) with real tensors and files, and the
writer's slots and markers (enginecore/kvlink_slots.py): bytes between two engines' layouts,
refusals of what does not match or was overwritten, slots coming back, dead writers swept."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from interlude.enginecore import kvlink_segment as segment
from interlude.enginecore.kvlink_slots import TAKEN, Handoffs, Slots, claim, release

BS = 32


def kv_caches(num_blocks: int, seed: int, heads: int = 2) -> dict[str, torch.Tensor]:
    """KV tensors as vLLM's CPU backend lays them out: (2, blocks, heads, block, head dim),
    two layers sharing one tensor (cross-layer sharing) beside a layer of its own."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(2, num_blocks, heads, BS, 8, generator=g)
    b = torch.randn(2, num_blocks, heads, BS, 8, generator=g)
    return {"layers.0.attn": a, "layers.1.attn": b, "layers.2.attn": a}


def test_an_arena_carries_blocks_between_two_engines(tmp_path: Path) -> None:
    prefill, decode = kv_caches(16, 0), kv_caches(16, 1)
    out = segment.SlotLayout.of(prefill, 16)
    assert len(out.tensors) == 2  # the shared tensor once
    path = str(tmp_path / "a-arena.r0")
    writer = segment.Arena.create(path, out, capacity=8)
    assert os.path.getsize(path) == segment.arena_bytes(out, 8) and not os.path.exists(
        f"{path}.tmp"
    )
    writer.write(start=4, seq=7, block_ids=[5, 9, 2])
    reader = segment.Arena.open(path, segment.SlotLayout.of(decode, 16), capacity=8)
    reader.read(start=4, seq=7, pairs=[(12, 1), (13, 2)])  # the first block hit locally
    for name in prefill:
        assert torch.equal(decode[name][:, [12, 13]], prefill[name][:, [9, 2]])
    untouched = kv_caches(16, 1)["layers.1.attn"]
    assert torch.equal(decode["layers.1.attn"][:, :12], untouched[:, :12])


def test_a_segment_overwritten_under_its_reader_is_refused(tmp_path: Path) -> None:
    layout = segment.SlotLayout.of(kv_caches(16, 0), 16)
    arena = segment.Arena.create(str(tmp_path / "a-arena.r0"), layout, capacity=8)
    arena.write(start=0, seq=1, block_ids=[1, 2, 3, 4])
    arena.write(start=2, seq=2, block_ids=[5, 6])  # slots 2-3 reused after an expiry
    arena.read(start=0, seq=1, pairs=[(9, 0), (10, 1)])  # slots 0-1 still seq 1's
    with pytest.raises(segment.SegmentError, match="overwritten"):
        arena.read(start=0, seq=1, pairs=[(9, 0), (10, 3)])
    with pytest.raises(segment.SegmentError, match="overwritten"):
        arena.read(start=6, seq=3, pairs=[(9, 0)])  # never written


def test_an_arena_of_another_layout_or_size_or_gone_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "a-arena.r0")
    segment.Arena.create(path, segment.SlotLayout.of(kv_caches(16, 0), 16), capacity=8)
    other_heads = segment.SlotLayout.of(kv_caches(16, 0, heads=1), 16)
    with pytest.raises(segment.SegmentError, match="needs"):
        segment.Arena.open(path, other_heads, capacity=8)
    with pytest.raises(segment.SegmentError, match="another KV layout"):
        segment.Arena.open(path, other_heads, capacity=16)  # same size, other shapes
    with pytest.raises(segment.SegmentError, match="gone"):
        segment.Arena.open(str(tmp_path / "missing"), other_heads, capacity=8)


def test_an_arena_larger_than_the_free_shared_memory_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = segment.SlotLayout.of(kv_caches(16, 0), 16)
    monkeypatch.setattr(segment, "_room", lambda directory: segment.arena_bytes(layout, 8) - 1)
    with pytest.raises(segment.SegmentError, match="lower --kv-link-arena-gib"):
        segment.Arena.create(str(tmp_path / "a-arena.r0"), layout, capacity=8)
    assert not list(tmp_path.iterdir())


def test_slots_are_taken_first_fit_and_merge_when_given_back() -> None:
    s = Slots(10)
    assert [s.take(4), s.take(4), s.take(4)] == [0, 4, None]
    s.give(0, 4)
    assert s.take(3) == 0 and s.take(2) == 8 and s.free == 1
    s.give(4, 4)
    s.give(0, 3)
    s.give(8, 2)
    assert s.free == 10 and s.take(10) == 0
    with pytest.raises(ValueError, match="at least one slot"):
        Slots(0)


def test_slots_come_back_when_the_reader_releases_or_the_ttl_passes(tmp_path: Path) -> None:
    h = Handoffs(str(tmp_path), "interlude-kv-w-", capacity=8, ttl_s=10.0)
    a, b = h.plan(4, now=0.0), h.plan(4, now=0.0)
    assert a == (1, 0) and b == (2, 4) and h.plan(1, now=0.0) is None
    marker_a, marker_b = h.publish(1, now=0.0), h.publish(2, now=0.0)
    assert claim(marker_a) and not claim(marker_a)  # one reader per segment
    assert h.reclaim(now=5.0) == 0  # a reading, b waiting within its TTL
    release(marker_a)
    assert h.reclaim(now=5.0) == 1 and h.slots.free == 4
    assert h.reclaim(now=11.0) == 1 and h.expired == 1  # b unclaimed past its TTL
    assert not claim(marker_b)  # a reader that comes late finds nothing, and prefills
    assert h.slots.free == 8 and not os.listdir(tmp_path)


def test_a_claim_its_reader_never_released_frees_after_four_ttls(tmp_path: Path) -> None:
    h = Handoffs(str(tmp_path), "interlude-kv-w-", capacity=4, ttl_s=10.0)
    assert h.plan(4, now=0.0) == (1, 0)
    assert claim(h.publish(1, now=0.0))
    assert h.reclaim(now=39.0) == 0
    assert h.reclaim(now=41.0) == 1 and not os.listdir(tmp_path)


def test_a_full_arena_takes_back_what_readers_are_done_with_before_refusing(
    tmp_path: Path,
) -> None:
    h = Handoffs(str(tmp_path), "interlude-kv-w-", capacity=4, ttl_s=10.0)
    assert h.plan(4, now=0.0) == (1, 0)
    marker = h.publish(1, now=0.0)
    assert claim(marker)
    release(marker)
    assert h.plan(4, now=1.0) == (2, 0)  # reclaimed on the spot


def _make_arena_and_exit(directory: str) -> None:
    layout = segment.SlotLayout.of(kv_caches(4, 0), 4)
    segment.Arena.create(os.path.join(directory, "interlude-kv-dead-arena.r0"), layout, 2)
    Path(directory, "interlude-kv-dead-7").touch()  # an unclaimed marker


def test_arenas_of_dead_writers_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    proc = multiprocessing.get_context("spawn").Process(
        target=_make_arena_and_exit, args=(str(tmp_path),)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    layout = segment.SlotLayout.of(kv_caches(4, 0), 4)
    live = segment.Arena.create(str(tmp_path / "interlude-kv-live-arena.r0"), layout, 2)
    (tmp_path / "interlude-kv-live-3").touch()
    (tmp_path / f"interlude-kv-live-4{TAKEN}").touch()
    assert segment.sweep_dead(str(tmp_path), "interlude-kv-") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "interlude-kv-live-3",
        f"interlude-kv-live-4{TAKEN}",
        "interlude-kv-live-arena.r0",
    ]
    live.close()
    assert not (tmp_path / "interlude-kv-live-arena.r0").exists()
