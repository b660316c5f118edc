"""BlockCopier: the worker side of the host swap; moves whole KV blocks between the engine's KV
tensors and a host pool of `capacity` blocks per layer.

* CPU build: gathers and scatters with `index_select` / `index_copy_`; done when `start` returns.
* CUDA: the host pool is pinned and copies run on a side stream, one piece per run of
  consecutive blocks (`runs`) and index of the dimensions before the block one. Scattered GPU
  blocks (a parked request's blocks rarely sit together) are first gathered into a staging
  tensor on the GPU (`Staged`: one `index_select` per layer), so the host link sees one piece
  per run of host slots, not one per block: on an H200, 256 scattered blocks of Llama-3-8B
  moved at 2.8 GB/s block by block, launch-bound, against 54 GB/s for one large copy. A
  step's saves overlap its forward pass (the policy's swap budget assumes they do). `mark_step`
  (when vLLM binds the step's metadata, before the forward) records where the step starts; the
  copies wait for that point only, not for the forward. `start` makes the compute stream wait
  for the loads (the forward reads them); `finish_saves`, called after the forward is launched,
  makes it wait for the saves, so later kernels (which may reuse the saved blocks once the
  scheduler frees them) run after the copy. The CPU never waits.

Host memory is one pool per dtype (one pinned allocation on CUDA, not one per layer: pinning is
slow and pinned allocations are few and costly), carved into a tensor per KV tensor. Layers
that share one KV tensor (vLLM's cross-layer KV sharing) get one host tensor and are copied once.

Invariants: loads are issued before saves, on one stream, because a host slot freed by a load may
be handed to a save in the same step; each host tensor has its KV tensor's memory layout (its
strides, in the same order), so a block is the same dense pieces on both sides.
"""

from __future__ import annotations

import itertools
import math

import torch

Pairs = list[tuple[int, int]]  # (gpu block, host slot)


def block_dim(kv: torch.Tensor, num_blocks: int) -> int:
    """The dimension of a KV tensor that indexes blocks (vLLM's layouts differ by backend)."""
    return next(d for d, n in enumerate(kv.shape) if n == num_blocks)


def dense_layout(kv: torch.Tensor, dim: int, capacity: int) -> tuple[list[int], list[int]]:
    """(dense shape, permutation back to `kv`'s dimension order) of a host tensor like `kv` with
    `capacity` blocks along `dim`, laid out in memory the way `kv` is (same stride order)."""
    shape = list(kv.shape)
    shape[dim] = max(1, capacity)
    strides = kv.stride()
    order = sorted(range(kv.dim()), key=lambda d: -strides[d])  # outermost first
    return [shape[d] for d in order], [order.index(d) for d in range(kv.dim())]


def host_like(kv: torch.Tensor, dim: int, capacity: int, pin: bool) -> torch.Tensor:
    """A zeroed host tensor shaped like `kv` with `capacity` blocks along `dim`, laid out in
    memory the way `kv` is (same stride order), so block pieces match one to one."""
    return host_pool([(kv, dim)], capacity, pin)[0]


def host_pool(kvs: list[tuple[torch.Tensor, int]], capacity: int, pin: bool) -> list[torch.Tensor]:
    """`host_like` for each (KV tensor, block dim), carved out of one zeroed allocation per
    dtype (pinned when `pin`)."""
    layouts = [dense_layout(kv, dim, capacity) for kv, dim in kvs]
    sizes: dict[torch.dtype, int] = {}
    for (kv, _), (dense, _) in zip(kvs, layouts, strict=True):
        sizes[kv.dtype] = sizes.get(kv.dtype, 0) + math.prod(dense)
    pools = {dt: torch.zeros(n, dtype=dt, pin_memory=pin) for dt, n in sizes.items()}
    offset = dict.fromkeys(sizes, 0)
    out = []
    for (kv, _), (dense, back) in zip(kvs, layouts, strict=True):
        n, at = math.prod(dense), offset[kv.dtype]
        offset[kv.dtype] = at + n
        out.append(pools[kv.dtype][at : at + n].view(dense).permute(back))
    return out


def storage_key(kv: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """What makes two KV tensors the same memory: layers sharing KV get the same tensor."""
    return (kv.untyped_storage().data_ptr(), int(kv.storage_offset()), tuple(kv.shape), kv.stride())


def distinct_names(kv_caches: dict[str, torch.Tensor], order: list[str] | None = None) -> list[str]:
    """One layer name per distinct KV tensor, the first in `order` (default: the dict's) of the
    layers sharing it: what to copy once."""
    unique: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name in order if order is not None else kv_caches:
        unique.setdefault(storage_key(kv_caches[name]), name)
    return list(unique.values())


def runs(pairs: Pairs) -> list[tuple[int, int, int]]:
    """(dst start, src start, length) of the stretches where both sides' blocks are
    consecutive: a request's blocks are often allocated together, and host slots are handed
    out in order, so a swap of n blocks is usually a few runs, not n blocks."""
    out: list[tuple[int, int, int]] = []
    for d, s in sorted(pairs):
        if out and d == out[-1][0] + out[-1][2] and s == out[-1][1] + out[-1][2]:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((d, s, 1))
    return out


def copy_blocks(dst: torch.Tensor, src: torch.Tensor, dim: int, pairs: Pairs) -> None:
    """dst block d <- src block s for each (d, s), a run of consecutive blocks at a time,
    piece by piece (asynchronous on CUDA): one copy per run and leading index, where a copy
    per block and layer would be thousands of small copies for a real model."""
    for d, s, n in runs(pairs):
        to_run, from_run = dst.narrow(dim, d, n), src.narrow(dim, s, n)
        lead = [range(k) for k in dst.shape[:dim]]
        for idx in itertools.product(*lead):
            to_run[idx].copy_(from_run[idx], non_blocking=True)


class Staged:
    """One direction of a step's copies through a GPU staging tensor: GPU blocks gathered
    (saves) or scattered (loads) by one indexing kernel per layer, the host side copied by
    `copy_blocks`, a piece per run of consecutive host slots. Built once per step, used for
    every layer; position i of the staging tensor holds host slot `slots[i]`'s block."""

    def __init__(self, pairs: Pairs, device: torch.device) -> None:
        by_slot = sorted((h, g) for g, h in pairs)  # pairs are (gpu block, host slot)
        self.slots = [(h, i) for i, (h, _) in enumerate(by_slot)]  # (host slot, staging index)
        ids = torch.tensor([g for _, g in by_slot], dtype=torch.long)
        self.gpu_ids = ids.to(device, non_blocking=True)

    @staticmethod
    def worth_it(pairs: Pairs) -> bool:
        """True when gathering saves host-link copies: the GPU side is more scattered than the
        host side (else the runs copy directly, without the extra pass over GPU memory)."""
        return len(runs(pairs)) > len(runs([(h, h) for _, h in pairs]))

    def _staging(self, kv: torch.Tensor, dim: int) -> torch.Tensor:
        """An empty GPU tensor of len(slots) blocks laid out as `kv` (and so as its host)."""
        dense, back = dense_layout(kv, dim, len(self.slots))
        return torch.empty(dense, dtype=kv.dtype, device=kv.device).permute(back)

    def save(self, host: torch.Tensor, kv: torch.Tensor, dim: int) -> None:
        """host[slots] <- kv[gpu_ids], asynchronously on the current stream."""
        staged = self._staging(kv, dim)
        staged.copy_(kv.index_select(dim, self.gpu_ids))
        copy_blocks(host, staged, dim, self.slots)

    def load(self, kv: torch.Tensor, host: torch.Tensor, dim: int) -> None:
        """kv[gpu_ids] <- host[slots], asynchronously on the current stream."""
        staged = self._staging(kv, dim)
        copy_blocks(staged, host, dim, [(i, h) for h, i in self.slots])
        kv.index_copy_(dim, self.gpu_ids, staged)


def _event() -> torch.cuda.Event:
    return torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves it unannotated


def _stream() -> torch.cuda.Stream:
    return torch.cuda.Stream()  # type: ignore[no-untyped-call]


class BlockCopier:
    def __init__(self, capacity: int, num_gpu_blocks: int) -> None:
        self.capacity = capacity
        self.num_gpu_blocks = num_gpu_blocks
        self.cuda = torch.cuda.is_available()
        self._stream = _stream() if self.cuda else None
        self._saved: torch.cuda.Event | None = None
        self._step_start: torch.cuda.Event | None = None
        self.host: dict[str, tuple[torch.Tensor, int]] = {}  # layer -> (host tensor, block dim)
        self.gpu: dict[str, torch.Tensor] = {}

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Keep one entry per distinct KV tensor (the first layer's name for a shared one) and
        its host tensor, carved from one pool."""
        names = distinct_names(kv_caches)
        dims = [block_dim(kv_caches[n], self.num_gpu_blocks) for n in names]
        hosts = host_pool(
            [(kv_caches[n], d) for n, d in zip(names, dims, strict=True)], self.capacity, self.cuda
        )
        for name, dim, host in zip(names, dims, hosts, strict=True):
            self.gpu[name] = kv_caches[name]
            self.host[name] = (host, dim)

    def mark_step(self) -> None:
        """Before the step's forward: copies issued later wait for the work queued before now
        (KV written by earlier steps, vLLM's zeroing of new blocks), not for the forward."""
        if self.cuda:
            self._step_start = _event()
            self._step_start.record(torch.cuda.current_stream())

    def start(self, loads: Pairs, saves: Pairs) -> None:
        """Issue this step's copies; on return the loads are visible to the forward pass."""
        if not (loads or saves):
            return
        if self._stream is None:
            self._copy_on_cpu(loads, saves)
            return
        compute = torch.cuda.current_stream()
        if self._step_start is not None:
            self._stream.wait_event(self._step_start)
        else:  # not marked: wait for everything queued so far
            self._stream.wait_stream(compute)
        device = next(iter(self.gpu.values())).device
        with torch.cuda.stream(self._stream):
            staged_loads = Staged(loads, device) if Staged.worth_it(loads) else None
            staged_saves = Staged(saves, device) if Staged.worth_it(saves) else None
            for name, kv in self.gpu.items():
                host, dim = self.host[name]
                if staged_loads is not None:
                    staged_loads.load(kv, host, dim)
                else:
                    copy_blocks(kv, host, dim, loads)
            loaded = _event()
            loaded.record(self._stream)
            for name, kv in self.gpu.items():
                host, dim = self.host[name]
                if staged_saves is not None:
                    staged_saves.save(host, kv, dim)
                else:
                    copy_blocks(host, kv, dim, [(h, g) for g, h in saves])
            self._saved = _event()
            self._saved.record(self._stream)
        compute.wait_event(loaded)

    def finish_saves(self) -> None:
        """After the forward: later GPU work is ordered after this step's saves."""
        if self._saved is not None:
            torch.cuda.current_stream().wait_event(self._saved)
            self._saved = None

    def _copy_on_cpu(self, loads: Pairs, saves: Pairs) -> None:
        # (to the KV tensor?, its block ids, host slots): index tensors once per step, not
        # once per layer; loads stay before saves.
        moves = [
            (to_kv, torch.tensor([g for g, _ in pairs]), torch.tensor([h for _, h in pairs]))
            for to_kv, pairs in ((True, loads), (False, saves))
            if pairs
        ]
        for name, kv in self.gpu.items():
            host, dim = self.host[name]
            for to_kv, g, h in moves:
                if to_kv:
                    kv.index_copy_(dim, g, host.index_select(dim, h))
                else:
                    host.index_copy_(dim, h, kv.index_select(dim, g))
