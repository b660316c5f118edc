"""The KV link's arena (`enginecore/kvlink_segment.py`) on a real GPU: a prompt's blocks written
from CUDA KV tensors into the host shared-memory arena and read back, through a second mapping
as a decode engine's, into other blocks are the same bytes, in both of vLLM's layouts; and how
long a 2,048-token Llama-3-8B prompt takes each way, against one large pinned copy of the same
bytes (its prefill takes about 56 ms on an H200, docs/engine.md). Skipped where there is no
CUDA, which is CI: run with `pytest tests/gpu -s` on a GPU."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from interlude.enginecore import kvlink_segment as seg
from interlude.enginecore.swap_copy import block_dim

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 512  # GPU blocks per layer
BLOCK = 16
PROMPT_BLOCKS = 128  # a 2,048-token prompt


def layers(n_layers: int, layout: str) -> dict[str, torch.Tensor]:
    """KV tensors of a Llama-3-8B-like layer (8 KV heads x 128, block 16) in bf16."""
    shapes = {"blocks-first": (N, 2, BLOCK, 8, 128), "kv-first": (2, N, BLOCK, 8, 128)}
    return {
        f"l{i}": torch.randn(*shapes[layout], dtype=torch.bfloat16, device="cuda")
        for i in range(n_layers)
    }


@pytest.fixture
def directory() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        yield d


def arenas(kv: dict[str, torch.Tensor], directory: str) -> tuple[seg.Arena, seg.Arena]:
    """The writer's arena and a reader's mapping of it (pinned each, as two engines do)."""
    layout = seg.SlotLayout.of(kv, N)
    path = os.path.join(directory, "interlude-kv-gpu-arena.r0")
    writer = seg.Arena.create(path, layout, capacity=256)
    return writer, seg.Arena.open(path, layout, capacity=256)


@pytest.mark.parametrize("layout", ["blocks-first", "kv-first"])
def test_segment_round_trip_on_cuda(layout: str, directory: str) -> None:
    kv = layers(4, layout)
    writer, reader = arenas(kv, directory)
    assert writer.pinned and reader.pinned
    prompt = [*range(300, 340, 2), 5, 77]
    writer.write(start=10, seq=1, block_ids=prompt)
    target = list(range(100, 100 + len(prompt)))
    reader.read(start=10, seq=1, pairs=list(zip(target, range(len(prompt)), strict=True)))
    torch.cuda.synchronize()
    for t in kv.values():
        dim = block_dim(t, N)
        for g, s in zip(target, prompt, strict=True):
            assert torch.equal(t.select(dim, g), t.select(dim, s))
    reader.close()
    writer.close()


def _seconds(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def test_segment_bandwidth_for_a_2k_prompt(directory: str) -> None:
    kv = layers(32, "kv-first")
    t0 = time.perf_counter()
    writer, reader = arenas(kv, directory)
    t_setup = time.perf_counter() - t0
    ids = torch.randperm(N, generator=torch.Generator().manual_seed(0))[:PROMPT_BLOCKS].tolist()
    moved = PROMPT_BLOCKS * writer.layout.slot_bytes
    pairs = list(zip(ids, range(PROMPT_BLOCKS), strict=True))
    seqs = iter(range(1, 100))

    def write() -> None:
        writer.write(start=0, seq=next(seqs), block_ids=ids)

    def read() -> None:
        reader.read(start=0, seq=int(writer.stamps[0]), pairs=pairs)

    write()  # warm up
    read()
    t_write = min(_seconds(write) for _ in range(5))
    t_read = min(_seconds(read) for _ in range(5))
    big = torch.empty(moved // 2, dtype=torch.bfloat16, device="cuda")
    pinned = torch.empty_like(big, device="cpu").pin_memory()
    t_one = min(_seconds(lambda: pinned.copy_(big, non_blocking=True)) for _ in range(3))
    print(
        f"\n{torch.cuda.get_device_name()}: KV arena, {PROMPT_BLOCKS * BLOCK} tokens x 32 layers"
        f" ({moved / 2**20:.0f} MiB): write {t_write * 1e3:.1f} ms"
        f" ({moved / t_write / 1e9:.1f} GB/s), read {t_read * 1e3:.1f} ms"
        f" ({moved / t_read / 1e9:.1f} GB/s), one large pinned copy {t_one * 1e3:.1f} ms"
        f" ({moved / t_one / 1e9:.1f} GB/s); making, pinning and mapping the"
        f" {writer.capacity}-slot arena {t_setup * 1e3:.0f} ms"
    )
    assert writer.pinned and reader.pinned
    reader.close()
    writer.close()
