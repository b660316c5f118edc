"""BlockCopier and its helpers on CPU tensors shaped like vLLM's KV layouts (no engine)."""

from __future__ import annotations

import pytest
import torch

from interlude.enginecore.swap_copy import (
    BlockCopier,
    Staged,
    block_dim,
    copy_blocks,
    host_like,
    runs,
)

N = 7  # blocks in the "GPU" pool


def layouts() -> list[tuple[str, torch.Tensor]]:
    """(name, KV tensor): blocks first; K/V first (flash-attn); K/V first over a blocks-first
    memory layout (a backend's stride order, as vLLM permutes for HND)."""
    g = torch.Generator().manual_seed(0)
    return [
        ("blocks-first", torch.randn(N, 2, 4, 3, 8, generator=g)),
        ("kv-first", torch.randn(2, N, 4, 3, 8, generator=g)),
        ("permuted", torch.randn(N, 2, 3, 4, 8, generator=g).permute(1, 0, 3, 2, 4)),
    ]


@pytest.mark.parametrize(("name", "kv"), layouts())
def test_host_tensor_mirrors_the_layout_and_blocks_round_trip(name: str, kv: torch.Tensor) -> None:
    dim = block_dim(kv, N)
    host = host_like(kv, dim, capacity=3, pin=False)
    assert host.shape[dim] == 3 and host.shape[:dim] == kv.shape[:dim]
    order = sorted(range(kv.dim()), key=lambda d: -kv.stride(d))
    assert sorted(range(host.dim()), key=lambda d: -host.stride(d)) == order
    assert not host.any()
    saves = [(5, 0), (1, 2)]  # (gpu block, host slot)
    copy_blocks(host, kv, dim, [(h, g) for g, h in saves])
    for g, h in saves:
        assert torch.equal(host.select(dim, h), kv.select(dim, g))
    assert not host.select(dim, 1).any()  # an untouched slot stays zero
    copy_blocks(kv, host, dim, [(3, 0)])  # load slot 0 into another block
    assert torch.equal(kv.select(dim, 3), kv.select(dim, 5))


def test_copier_saves_then_loads_every_layer() -> None:
    layers = dict(layouts())
    original = {n: t.clone() for n, t in layers.items()}
    copier = BlockCopier(capacity=4, num_gpu_blocks=N)
    copier.register(layers)
    copier.start(loads=[], saves=[(2, 3), (6, 0)])
    copier.finish_saves()
    for t in layers.values():  # the blocks are freed and reused by someone else
        t.select(block_dim(t, N), 2).zero_()
        t.select(block_dim(t, N), 6).fill_(1.0)
    copier.start(loads=[(4, 3), (0, 0)], saves=[])  # they come back elsewhere
    for n, t in layers.items():
        dim = block_dim(t, N)
        assert torch.equal(t.select(dim, 4), original[n].select(dim, 2))
        assert torch.equal(t.select(dim, 0), original[n].select(dim, 6))
    copier.start(loads=[], saves=[])  # nothing to do is a no-op


def test_runs_coalesce_blocks_consecutive_on_both_sides() -> None:
    assert runs([(4, 0), (5, 1), (6, 2), (9, 3), (2, 7), (3, 9)]) == [
        (2, 7, 1),
        (3, 9, 1),
        (4, 0, 3),
        (9, 3, 1),
    ]
    assert runs([]) == []


@pytest.mark.parametrize(("name", "kv"), layouts())
def test_copying_by_runs_equals_copying_block_by_block(name: str, kv: torch.Tensor) -> None:
    dim = block_dim(kv, N)
    pairs = [(0, 2), (1, 3), (2, 4), (5, 0), (6, 6)]  # (host slot, gpu block): runs and strays
    by_runs = host_like(kv, dim, capacity=7, pin=False)
    copy_blocks(by_runs, kv, dim, pairs)
    for h, g in pairs:
        assert torch.equal(by_runs.select(dim, h), kv.select(dim, g)), (h, g)
    untouched = {0, 1, 2, 5, 6} ^ set(range(7))
    assert all(not by_runs.select(dim, h).any() for h in untouched)


def test_host_tensors_share_one_pool_and_shared_kv_layers_are_copied_once() -> None:
    layers = dict(layouts())
    first = next(iter(layers))
    layers["shares-kv"] = layers[first]  # cross-layer KV sharing: the same tensor twice
    layers["half"] = torch.randn(2, N, 16, 2, 4, dtype=torch.float16)  # a second dtype
    copier = BlockCopier(capacity=4, num_gpu_blocks=N)
    copier.register(layers)
    assert "shares-kv" not in copier.gpu and len(copier.gpu) == len(layers) - 1
    pools: dict[torch.dtype, set[int]] = {}
    for host, _ in copier.host.values():
        pools.setdefault(host.dtype, set()).add(host.untyped_storage().data_ptr())
    assert {dt: len(ptrs) for dt, ptrs in pools.items()} == {torch.float32: 1, torch.float16: 1}
    hosts = list(copier.host.values())
    for i, (host, dim) in enumerate(hosts):  # the carved pieces do not overlap
        assert host.shape[dim] == 4
        host.fill_(float(i + 1))
    for i, (host, _) in enumerate(hosts):
        assert bool((host == float(i + 1)).all())
    before = layers[first].clone()
    copier.start(loads=[], saves=[(3, 1)])
    dim = block_dim(layers[first], N)
    assert torch.equal(copier.host[first][0].select(dim, 1), before.select(dim, 3))


@pytest.mark.parametrize(("name", "kv"), layouts())
def test_staged_copies_equal_block_by_block_copies(name: str, kv: torch.Tensor) -> None:
    """The CUDA path's gather/scatter through a staging tensor, run on CPU tensors."""
    dim = block_dim(kv, N)
    saves = [(6, 0), (1, 1), (4, 2), (0, 4)]  # (gpu block, host slot): scattered on the GPU
    assert Staged.worth_it(saves) and not Staged.worth_it([(1, 0), (2, 1)])
    host = host_like(kv, dim, capacity=5, pin=False)
    Staged(saves, kv.device).save(host, kv, dim)
    for g, h in saves:
        assert torch.equal(host.select(dim, h), kv.select(dim, g)), (g, h)
    assert not host.select(dim, 3).any()  # an untouched slot stays zero
    original = kv.clone()
    loads = [(5, 0), (2, 4), (3, 1)]  # (gpu block, host slot)
    Staged(loads, kv.device).load(kv, host, dim)
    for g, h in loads:
        assert torch.equal(kv.select(dim, g), host.select(dim, h)), (g, h)
    for g in {0, 1, 4, 6}:  # blocks no load names keep their contents
        assert torch.equal(kv.select(dim, g), original.select(dim, g))
