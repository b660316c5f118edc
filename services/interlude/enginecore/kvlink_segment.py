"""KV arenas: the worker side of `HostLinkConnector` (kvlink.py). A prefill engine's worker owns
one host shared-memory file, its *arena*, made once and reused: `capacity` slots, a slot being
one KV block of every distinct KV tensor of the model. A prompt's blocks go to a run of slots
(a *segment*), and a decode engine on the same host maps the same file and reads them back.

Why an arena and not a file per prompt: a fresh shared-memory file costs a page fault per 4 KiB
on first touch, and a copy between a GPU and unpinned memory goes through a bounce buffer. On an
H200 a 2,048-token Llama-3-8B prompt (256 MiB) took 212-271 ms to write and 67-80 ms to read
that way, against 56 ms to prefill it again (docs/disaggregation.md). The arena is faulted in
once and, on CUDA, registered with the driver (pinned) once per process, so each copy is one
contiguous DMA of the segment's slots; the GPU side gathers or scatters the blocks on the device.

Layout: `capacity` int64 *stamps* and the writer's `SlotLayout.signature`, then, page-aligned,
`capacity` slots; slot s holds the block of each tensor in name order, each block dense in its
tensor's dimension order minus the block dimension. Two engines of one model and config agree;
an arena of another size or signature is refused (`SegmentError`), never read past.

Stamps make reuse safe without locks: a writer zeroes the stamps of the slots it is about to fill
and stamps each with the segment's sequence number once the copy is done; a reader checks that
every slot it reads carries its segment's number before and after copying, so a segment that was
reclaimed and overwritten under it (its reader was too slow, past the TTL) is refused and the
prompt computed again, never used half-new.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from interlude.enginecore.swap_copy import block_dim, distinct_names

log = logging.getLogger(__name__)

PAGE = 4096
ARENA_SUFFIX = "arena"  # file names: <prefix><pid>-arena.r<rank>


class SegmentError(RuntimeError):
    """A segment is missing, was overwritten, or does not match this engine's KV layout."""


@dataclass(frozen=True)
class SlotLayout:
    """The engine's distinct KV tensors (layers sharing one are kept once), their block dims and
    each block's element count: what one arena slot holds."""

    tensors: tuple[tuple[torch.Tensor, int], ...]

    @classmethod
    def of(cls, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> SlotLayout:
        kvs = [kv_caches[name] for name in distinct_names(kv_caches, sorted(kv_caches))]
        dtypes = {kv.dtype for kv in kvs}
        if len(dtypes) != 1:
            raise SegmentError(f"KV tensors of several dtypes ({sorted(map(str, dtypes))})")
        return cls(tuple((kv, block_dim(kv, num_blocks)) for kv in kvs))

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0][0].dtype

    @property
    def device(self) -> torch.device:
        return self.tensors[0][0].device

    def block_shapes(self) -> list[list[int]]:
        return [[n for d, n in enumerate(kv.shape) if d != dim] for kv, dim in self.tensors]

    @property
    def slot_elements(self) -> int:
        return sum(math.prod(shape) for shape in self.block_shapes())

    @property
    def slot_bytes(self) -> int:
        return self.slot_elements * self.dtype.itemsize

    @property
    def signature(self) -> int:
        """Equal for engines whose slots hold the same blocks the same way."""
        text = f"{self.dtype}:{self.block_shapes()}".encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)

    def pieces(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Per tensor, its blocks within `rows` (n, slot_elements), shaped (n, *block shape)."""
        out, at = [], 0
        for shape in self.block_shapes():
            size = math.prod(shape)
            out.append(rows[:, at : at + size].view(rows.shape[0], *shape))
            at += size
        return out


def arena_bytes(layout: SlotLayout, capacity: int) -> int:
    return _data_offset(capacity) + capacity * layout.slot_bytes


def _data_offset(capacity: int) -> int:
    return -(-(capacity + 1) * 8 // PAGE) * PAGE


class Arena:
    """One mapping of an arena file. `create` makes (and owns) it; `open` maps a peer's."""

    def __init__(self, path: str, layout: SlotLayout, capacity: int) -> None:
        size = arena_bytes(layout, capacity)
        try:
            have = os.path.getsize(path)
        except OSError as e:
            raise SegmentError(f"KV arena {path} is gone: {e}") from e
        if have != size:
            raise SegmentError(f"KV arena {path}: {have} bytes, this engine's layout needs {size}")
        self.path, self.layout, self.capacity = path, layout, capacity
        raw = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        header = raw[: (capacity + 1) * 8].view(torch.int64)
        self.stamps, self._signature = header[:capacity], header[capacity:]
        data = raw[_data_offset(capacity) :]
        self.slots = data.view(layout.dtype).view(capacity, layout.slot_elements)
        self._raw, self._data = raw, data
        self._lock: int | None = None  # the owner's lock on the file (create)
        self.pinned = False

    def _check_layout(self) -> None:
        if int(self._signature.item()) != self.layout.signature:
            raise SegmentError(f"KV arena {self.path} was made for another KV layout")
        if self.layout.device.type == "cuda":
            self.pinned = _pin(self._data)

    @classmethod
    def create(cls, path: str, layout: SlotLayout, capacity: int) -> Arena:
        """Make the file, locked by this process for its lifetime (`sweep_dead`), fault its
        pages in (a first touch costs more than the copy itself) and map it."""
        need = arena_bytes(layout, capacity)
        room = _room(os.path.dirname(path) or ".")
        if room < need:
            # Faulting in pages a full tmpfs does not have kills the process with SIGBUS.
            raise SegmentError(
                f"the KV arena needs {need / 2**30:.2f} GiB in {os.path.dirname(path)}, which "
                f"has {room / 2**30:.2f} GiB free: lower --kv-link-arena-gib or enlarge it"
            )
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, arena_bytes(layout, capacity))
        os.replace(tmp, path)
        arena = cls(path, layout, capacity)
        arena._raw.zero_()
        arena._signature.fill_(layout.signature)
        arena._lock = fd
        arena._check_layout()
        return arena

    @classmethod
    def open(cls, path: str, layout: SlotLayout, capacity: int) -> Arena:
        """Map a peer's arena for reading; refused unless made for this engine's layout."""
        arena = cls(path, layout, capacity)
        arena._check_layout()
        return arena

    def close(self) -> None:
        """Unpin the mapping; the owner also removes the file and drops its lock."""
        if self.pinned:
            _cudart().cudaHostUnregister(self._data.data_ptr())
            self.pinned = False
        if self._lock is not None:
            unlink(self.path)
            os.close(self._lock)
            self._lock = None

    def write(self, start: int, seq: int, block_ids: list[int]) -> None:
        """Copy the engine's blocks `block_ids` (in order) into slots start.., stamped `seq`."""
        n = len(block_ids)
        self.stamps[start : start + n] = 0
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.layout.device)
        target = self.slots[start : start + n]
        on_cpu = self.layout.device.type == "cpu"
        rows = target if on_cpu else torch.empty_like(target, device=ids.device)
        for (kv, dim), piece in zip(self.layout.tensors, self.layout.pieces(rows), strict=True):
            piece.copy_(kv.index_select(dim, ids).movedim(dim, 0))
        if rows is not target:
            target.copy_(rows)  # one DMA; synchronous, so the stamps below follow the bytes
        self.stamps[start : start + n] = seq

    def read(self, start: int, seq: int, pairs: list[tuple[int, int]]) -> None:
        """Copy segment block i (slot start + i) into engine block g for each (g, i)."""
        lo = min(i for _, i in pairs)
        hi = max(i for _, i in pairs) + 1
        self._check(start + lo, start + hi, seq)
        rows = self.slots[start + lo : start + hi]
        if self.layout.device.type != "cpu":
            rows = rows.to(self.layout.device)
        self._check(start + lo, start + hi, seq)  # the bytes copied were the segment's
        dev = self.layout.device
        engine = torch.tensor([g for g, _ in pairs], dtype=torch.long, device=dev)
        at = torch.tensor([i - lo for _, i in pairs], dtype=torch.long, device=dev)
        for (kv, dim), piece in zip(self.layout.tensors, self.layout.pieces(rows), strict=True):
            kv.index_copy_(dim, engine, piece.index_select(0, at).movedim(0, dim))

    def _check(self, lo: int, hi: int, seq: int) -> None:
        if hi > self.capacity or not bool((self.stamps[lo:hi] == seq).all()):
            raise SegmentError(f"KV segment {seq} in {self.path} was overwritten or never written")


def _room(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _pin(data: torch.Tensor) -> bool:
    """Register the mapping with CUDA so copies to and from it are DMA at full speed."""
    err = _cudart().cudaHostRegister(data.data_ptr(), data.numel(), 0)
    if int(err) != 0:
        log.warning("KV arena not pinned (cudaHostRegister: %s): copies will be slower", err)
        return False
    return True


def rank_path(base: str, rank: int) -> str:
    return f"{base}.r{rank}"


def unlink(path: str) -> None:
    """Remove a file (gone already is fine)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep_dead(directory: str, stem: str) -> int:
    """Remove the arenas (and their markers) of writers that are gone, told by the lock each
    writer holds on its arena for its lifetime (the kernel drops it with the process); how many
    arenas went. Files of live writers are left alone."""
    gone = 0
    with contextlib.suppress(FileNotFoundError):
        names = os.listdir(directory)
        for name in names:
            if not name.startswith(stem) or f"{ARENA_SUFFIX}.r" not in name:
                continue
            if _held(os.path.join(directory, name)):
                continue
            prefix = name.split(ARENA_SUFFIX, 1)[0]
            for other in names:
                if other.startswith(prefix):
                    unlink(os.path.join(directory, other))
            gone += 1
    return gone


def _held(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True  # gone already: nothing to do
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
