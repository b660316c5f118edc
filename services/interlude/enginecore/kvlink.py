"""HostLinkConnector: our `KVConnectorBase_V1` that carries a prefilled prompt's KV from a prefill
engine to a decode engine through host shared memory, with vLLM's disaggregated-serving protocol
(`kv_transfer_params`, as its NIXL connector and toy proxy use it). Two engines on one host, CPU
build or CUDA; across hosts vLLM's NIXL connector does this job (docs/disaggregation.md).

Prefill side: a request whose `kv_transfer_params` say `do_remote_decode` is prefilled as usual
(the caller asks for one token). The step that computes its prompt's last token also copies the
prompt's blocks into a run of slots of this engine's arena (kvlink_segment.py) after the forward
(`wait_for_save`), so the segment is whole before the request's output leaves the engine;
`request_finished` publishes it (kvlink_slots.py: a marker file) and hands back the params a
decode engine needs (`do_remote_prefill`, where the segment is, the prompt's token count and
hash, the block size), and the blocks are freed at once. An arena with no room
hands over nothing, and the decode engine prefills the prompt itself.

Decode side: a request carrying those params claims the segment (renames its marker) and is
offered its tokens beyond the local prefix-cache hit as an *asynchronous* hit: vLLM allocates its
blocks and parks it in `WAITING_FOR_REMOTE_KVS`, the step's worker copies the segment's slots in
(`start_load_kv`) and reports the request received, the scheduler side releases the claim, and
vLLM admits the request at the next step, recomputing only the prompt's last token (it must
compute one to sample). A segment that expired, was overwritten, or was made for other tokens
or another layout is refused and the prompt is computed here (vLLM's `recompute` load-failure
policy, set in `EngineConfig`): nothing is lost, only time.

Invariants: a request takes remote KV at most once (a parked session that resumes later does not
look again); a segment is written once and claimed by at most one reader; its slots return to the
writer once the reader releases it or its TTL passes; an engine's arena and markers go with it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole
from vllm.v1.request import RequestStatus

from interlude.enginecore import kvlink_segment as segment
from interlude.enginecore.connector_base import StepwiseConnector
from interlude.enginecore.kvlink_handoff import (
    SEGMENT_KEY,
    LinkMetadata,
    LoadJob,
    SaveJob,
    Send,
    Where,
    arena_capacity,
    handoff_params,
    refusal,
    tokens_hash,
)
from interlude.enginecore.kvlink_slots import Handoffs, claim, release

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

DEFAULT_DIRECTORY = "/dev/shm"
DEFAULT_ARENA_GIB = 2.0
STEM = "interlude-kv-"


def wants_remote_decode(request: Request) -> bool:
    return bool((request.kv_transfer_params or {}).get("do_remote_decode"))


class HostLinkConnector(StepwiseConnector):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None
        extra = transfer.kv_connector_extra_config
        self.directory = str(extra.get("directory", DEFAULT_DIRECTORY))
        self.ttl_s = float(extra.get("ttl_s", 120.0))
        self.prefix = f"{STEM}{transfer.engine_id}-"
        self.arena_path = os.path.join(self.directory, f"{self.prefix}{segment.ARENA_SUFFIX}")
        self.block_size = vllm_config.cache_config.block_size
        self.num_blocks = kv_cache_config.num_blocks
        gib = float(extra.get("arena_gib", DEFAULT_ARENA_GIB))
        self.capacity = arena_capacity(kv_cache_config, gib * 2**30)
        self.handoffs = Handoffs(self.directory, self.prefix, self.capacity, self.ttl_s)
        self.sends: dict[str, Send] = {}
        self.unsent = 0  # prompts the arena had no room for
        self._offers: dict[str, int] = {}  # decode side: request -> local hit at its lookup
        self._claims: dict[str, tuple[str, int]] = {}  # decode side: request -> (marker, tokens)
        self._taken: set[str] = set()  # decode side: requests done with remote KV
        self._pending = LinkMetadata()
        self._reclaimed_at = 0.0
        # Worker side.
        self._layout: segment.SlotLayout | None = None
        self._arena: segment.Arena | None = None
        self._peers: dict[str, segment.Arena] = {}
        self._rank = 0
        self._received: set[str] = set()
        self._failed: set[int] = set()

    # ---- scheduler side: prefill ----------------------------------------------------------
    def _track_sends(self, so: SchedulerOutput) -> None:
        """Follow each prefill-side request's blocks, and plan the segment write of those whose
        prompt ends in this step."""
        progress: list[tuple[str, int]] = []
        for new in so.scheduled_new_reqs:
            if (send := self.sends.get(new.req_id)) is not None:
                send.block_ids = list(new.block_ids[0])
                progress.append((new.req_id, new.num_computed_tokens))
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if (send := self.sends.get(rid)) is None:
                continue
            added = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids and added is not None:
                send.block_ids = list(added[0])  # preempted and back: blocks allocated afresh
            elif added is not None:
                send.block_ids += added[0]
            progress.append((rid, cached.num_computed_tokens[i]))
        now = time.time()
        for rid, computed in progress:
            send = self.sends[rid]
            done = computed + so.num_scheduled_tokens.get(rid, 0) >= send.prompt_tokens
            if done and send.seq is None:
                blocks = -(-send.prompt_tokens // self.block_size)
                planned = self.handoffs.plan(blocks, now)
                if planned is None:
                    self.unsent += 1
                    self.sends.pop(rid)
                    log.warning("%s: the KV arena is full; the decode engine prefills it", rid)
                    continue
                send.seq, send.start = planned
                self._pending.saves.append(SaveJob(send.seq, send.start, send.block_ids[:blocks]))
        if now - self._reclaimed_at > 0.25:
            self._reclaimed_at = now
            self.handoffs.reclaim(now)

    def _handoff(self, send: Send, seq: int) -> dict[str, Any]:
        marker = self.handoffs.publish(seq, time.time())
        where = Where(self.arena_path, self.capacity, send.start, seq, marker)
        return handoff_params(self.prefix, where, send, self.block_size)

    # ---- scheduler side: decode -----------------------------------------------------------
    def _usable(self, request: Request) -> int:
        """Tokens of the request's remote segment it may take (0: none, or refused), claiming
        the segment the first time it is usable."""
        rid = request.request_id
        if rid in self._claims:
            return self._claims[rid][1]
        p = request.kv_transfer_params or {}
        if not p.get("do_remote_prefill") or SEGMENT_KEY not in p:
            return 0
        n = int(p.get("remote_num_tokens", 0))
        why = refusal(p, request.all_token_ids, self.block_size)
        if why is None and not claim(str(p[SEGMENT_KEY])):
            why = "expired, or another engine took it"
        if why is not None:
            log.warning("%s: remote KV refused (%s); prefilling here", rid, why)
            self._taken.add(rid)
            return 0
        self._claims[rid] = (str(p[SEGMENT_KEY]), n)
        return n

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        rid = request.request_id
        if rid in self._taken:
            return 0, False
        offered = max(0, self._usable(request) - num_computed_tokens)
        if offered == 0:
            return 0, False
        self._offers[rid] = num_computed_tokens
        return offered, True

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        if wants_remote_decode(request) and rid not in self.sends:
            self.sends[rid] = Send(
                request.num_prompt_tokens,
                list(blocks.get_block_ids()[0]),
                tokens_hash(request.prompt_token_ids or []),
            )
        local = self._offers.pop(rid, None)
        if local is None or num_external_tokens == 0:
            return
        p = request.kv_transfer_params or {}
        ids = blocks.get_block_ids()[0]
        start = local // self.block_size
        end = -(-(local + num_external_tokens) // self.block_size)
        pairs = [(ids[i], i) for i in range(start, end)]
        self._pending.loads.append(LoadJob(rid, Where.of(p), pairs))
        self._taken.add(rid)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._track_sends(scheduler_output)
        meta, self._pending = self._pending, LinkMetadata()
        return meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._offers.pop(rid, None)
        self._taken.discard(rid)
        if (claimed := self._claims.pop(rid, None)) is not None:
            release(claimed[0])  # ended before its blocks came (aborted): nobody reads them now
        send = self.sends.pop(rid, None)
        if send is None or send.seq is None:
            return False, None
        if request.status == RequestStatus.FINISHED_ABORTED:
            self.handoffs.drop(send.seq)
            return False, None
        return False, self._handoff(send, send.seq)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        for rid in connector_output.finished_recving or ():
            if (claimed := self._claims.pop(rid, None)) is not None:
                release(claimed[0])

    # ---- worker side ----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        self._layout = segment.SlotLayout.of(kv_caches, self.num_blocks)
        self._rank = get_tensor_model_parallel_rank()
        os.makedirs(self.directory, exist_ok=True)
        segment.sweep_dead(self.directory, STEM)
        path = segment.rank_path(self.arena_path, self._rank)
        self._arena = segment.Arena.create(path, self._layout, self.capacity)

    def _meta(self) -> LinkMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        assert isinstance(meta, LinkMetadata)
        return meta

    def _peer(self, job: LoadJob) -> segment.Arena:
        """The writer's arena, mapped once per writer (pinning it costs a first load more);
        mappings of writers that went away are dropped, their memory with them."""
        assert self._layout is not None
        for gone in [p for p in self._peers if not os.path.exists(p)]:
            self._peers.pop(gone).close()
        path = segment.rank_path(job.where.arena, self._rank)
        if path not in self._peers:
            self._peers[path] = segment.Arena.open(path, self._layout, job.where.capacity)
        return self._peers[path]

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is None or self._layout is None:
            return
        for job in meta.loads:
            try:
                self._peer(job).read(job.where.start, job.where.seq, job.pairs)
            except (segment.SegmentError, RuntimeError) as e:
                log.warning("%s: remote KV not loaded (%s); prefilling here", job.request_id, e)
                self._failed.update(g for g, _ in job.pairs)
            self._received.add(job.request_id)

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is None or self._arena is None:
            return
        for job in meta.saves:
            self._arena.write(job.start, job.seq, job.block_ids)

    def shutdown(self) -> None:
        # The arena goes with this engine: a decode engine that comes for a segment now finds
        # its marker gone (or its mapping's stamps wrong) and prefills the prompt itself.
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        self.handoffs.close()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        received, self._received = self._received, set()
        return None, (received or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed = self._failed, set()
        return failed
