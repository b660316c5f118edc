"""What the two ends of the host link (kvlink.py) exchange: the handoff a prefill engine answers
in `kv_transfer_params` (vLLM's keys beside ours), the decode side's check of it, and the jobs
each end's scheduler side hands its workers for a step. No vLLM state here, only data.

The handoff: `do_remote_prefill`, `remote_num_tokens`, `remote_tokens_hash`, `remote_block_size`
(what the prompt was), and where its KV is: `interlude_segment` (the marker a reader claims),
`interlude_arena` (the writer's arena, less the rank suffix), `interlude_capacity`,
`interlude_slot` (the segment's first slot) and `interlude_seq` (the stamp its slots carry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig

SEGMENT_KEY = "interlude_segment"  # the kv_transfer_params key that marks our segments (marker)


def tokens_hash(token_ids: Any) -> str:
    """What identifies a prompt's tokens across engines (the segment is only for these)."""
    return hashlib.blake2b(
        b"".join(int(t).to_bytes(4, "little") for t in token_ids), digest_size=16
    ).hexdigest()


def arena_capacity(kv_cache_config: KVCacheConfig, arena_bytes: float) -> int:
    """Slots of an engine's arena: what `arena_bytes` hold, at most four times the engine's own
    blocks (more than the prompts it can have prefilled and not yet handed over)."""
    per_block = sum(
        g.kv_cache_spec.page_size_bytes * len(g.layer_names)
        for g in kv_cache_config.kv_cache_groups
    )
    return max(1, min(4 * kv_cache_config.num_blocks, int(arena_bytes // max(1, per_block))))


@dataclass(frozen=True)
class Where:
    """Where a segment is: the writer's arena, its size, the segment's slots and marker."""

    arena: str
    capacity: int
    start: int
    seq: int
    marker: str

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Where:
        return cls(
            str(params["interlude_arena"]),
            int(params["interlude_capacity"]),
            int(params["interlude_slot"]),
            int(params["interlude_seq"]),
            str(params[SEGMENT_KEY]),
        )


@dataclass
class Send:
    """A prefill-side request: its prompt and the blocks that hold it."""

    prompt_tokens: int
    block_ids: list[int]
    token_hash: str
    seq: int | None = None  # set by the step that writes its segment
    start: int = 0


def handoff_params(engine: str, where: Where, send: Send, block_size: int) -> dict[str, Any]:
    """The `kv_transfer_params` a prefill engine answers for a prompt it wrote."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine,
        SEGMENT_KEY: where.marker,
        "interlude_arena": where.arena,
        "interlude_capacity": where.capacity,
        "interlude_slot": where.start,
        "interlude_seq": where.seq,
        "remote_num_tokens": send.prompt_tokens,
        "remote_tokens_hash": send.token_hash,
        "remote_block_size": block_size,
    }


def refusal(params: Mapping[str, Any], token_ids: Sequence[int], block_size: int) -> str | None:
    """Why a decode engine must not take this handoff for a request of `token_ids` (None: it
    may): blocks of another size, more tokens than the request has, or other tokens."""
    n = int(params.get("remote_num_tokens", 0))
    if int(params.get("remote_block_size", 0)) != block_size:
        return f"block size {params.get('remote_block_size')} != {block_size}"
    if not 0 < n <= len(token_ids):
        return f"{n} tokens for a request of {len(token_ids)}"
    if tokens_hash(token_ids[:n]) != params.get("remote_tokens_hash"):
        return "made for other tokens"
    return None


@dataclass
class SaveJob:
    seq: int
    start: int  # first slot
    block_ids: list[int]


@dataclass
class LoadJob:
    request_id: str
    where: Where
    pairs: list[tuple[int, int]]  # (engine block, segment block)


@dataclass
class LinkMetadata(KVConnectorMetadata):
    """One step's segment writes and reads, scheduler -> worker."""

    saves: list[SaveJob] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
