"""KV segments: a prefilled prompt's KV blocks in one host shared-memory file, the worker side of
`HostLinkConnector` (kvlink.py).

A segment holds `n` blocks of every distinct KV tensor of the model, one dense stretch per tensor
in name order, each laid out in its tensor's stride order (`dense_layout`), so a block is the same
dense pieces in the file and in the engine. Two engines of the same model and config agree on the
layout; a segment of another size is refused (`SegmentError`), never read past.

Writes go to a temporary name and are renamed into place, so a reader sees a whole segment or
none. The reader owns a segment once it has loaded it and unlinks it; the writer sweeps segments
nobody took within `ttl_s` (a decode request that never came).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass

import torch

from interlude.enginecore.swap_copy import block_dim, dense_layout, storage_key


class SegmentError(RuntimeError):
    """A segment is missing or does not match this engine's KV layout."""


@dataclass(frozen=True)
class KVLayout:
    """The engine's distinct KV tensors (layers sharing one are kept once) and their block dims."""

    tensors: tuple[tuple[torch.Tensor, int], ...]

    @classmethod
    def of(cls, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> KVLayout:
        unique: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
        for name in sorted(kv_caches):
            unique.setdefault(storage_key(kv_caches[name]), name)
        kvs = [kv_caches[name] for name in unique.values()]
        dtypes = {kv.dtype for kv in kvs}
        if len(dtypes) != 1:
            raise SegmentError(f"KV tensors of several dtypes ({sorted(map(str, dtypes))})")
        return cls(tuple((kv, block_dim(kv, num_blocks)) for kv in kvs))

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0][0].dtype

    def elements(self, blocks: int) -> int:
        """Elements of a segment of `blocks` blocks."""
        return sum(math.prod(dense_layout(kv, dim, blocks)[0]) for kv, dim in self.tensors)

    def views(self, flat: torch.Tensor, blocks: int) -> list[torch.Tensor]:
        """Per KV tensor, the segment's `blocks` blocks shaped (and strided) like the tensor."""
        out, at = [], 0
        for kv, dim in self.tensors:
            dense, back = dense_layout(kv, dim, blocks)
            n = math.prod(dense)
            out.append(flat[at : at + n].view(dense).permute(back))
            at += n
        return out


def write(layout: KVLayout, path: str, block_ids: list[int]) -> None:
    """Copy the engine's blocks `block_ids` (in order) into a new segment at `path`."""
    tmp = f"{path}.tmp"
    flat = torch.from_file(
        tmp, shared=True, size=layout.elements(len(block_ids)), dtype=layout.dtype
    )
    ids = torch.tensor(block_ids, dtype=torch.long)
    for (kv, dim), view in zip(layout.tensors, layout.views(flat, len(block_ids)), strict=True):
        view.copy_(kv.index_select(dim, ids.to(kv.device)))
    del flat
    os.replace(tmp, path)


def read(layout: KVLayout, path: str, pairs: list[tuple[int, int]], blocks: int) -> None:
    """Copy segment block s into engine block g for each (g, s); the segment holds `blocks`."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise SegmentError(f"KV segment {path} is gone: {e}") from e
    want = layout.elements(blocks) * layout.dtype.itemsize
    if size != want:
        raise SegmentError(f"KV segment {path}: {size} bytes, this engine's layout needs {want}")
    flat = torch.from_file(path, shared=False, size=layout.elements(blocks), dtype=layout.dtype)
    gpu = torch.tensor([g for g, _ in pairs], dtype=torch.long)
    seg = torch.tensor([s for _, s in pairs], dtype=torch.long)
    for (kv, dim), view in zip(layout.tensors, layout.views(flat, blocks), strict=True):
        kv.index_copy_(dim, gpu.to(kv.device), view.index_select(dim, seg).to(kv.device))


def unlink(path: str) -> None:
    """Remove a segment (gone already is fine: the writer's sweep may have taken it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep(directory: str, prefix: str, ttl_s: float, now: float | None = None) -> int:
    """Remove this writer's segments (`prefix`*) older than `ttl_s`; how many went."""
    now = time.time() if now is None else now
    gone = 0
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            if now - entry.stat().st_mtime > ttl_s:
                os.unlink(entry.path)
                gone += 1
        except FileNotFoundError:
            continue
    return gone
