"""HostSwapConnector: our `KVConnectorBase_V1` that moves a parked request's KV blocks to a
host-memory pool and back (the policy's SWAP), on the CPU build as well as on CUDA.

Scheduler side (role SCHEDULER, inside the scheduler process): owns the host pool's slot
allocator and the per-request host copies. `InterludeScheduler` asks it to `save` blocks; on resume
vLLM asks `get_num_new_matched_tokens`, which offers the host copy beyond the local prefix-cache
hit, and `update_state_after_alloc` plans the copy back.
Worker side (role WORKER): a `BlockCopier` (swap_copy.py) holds the host tensors (pinned on
CUDA, copies on a side stream there) and issues the step's copies in `start_load_kv`, loads before
saves. vLLM zeroes newly allocated blocks before `start_load_kv`, so loads land safely.

Loads are spread over steps as the simulator spreads them (`sim/swapping.py`): a budgeted policy
takes the host copy as an *asynchronous* hit, so vLLM allocates its blocks and parks the
request in `WAITING_FOR_REMOTE_KVS`; each step then copies at most its share of
`Profile.swap_budget_tokens` (what the scheduler leaves after the step's saves, `begin_step`),
at least one block, in the order the loads started (`build_connector_meta`). The step that
copies a request's last block names it in `SwapMetadata.loaded`; the worker reports it back as
received (`get_finished`), and vLLM admits the request at the next step. So no copy, however
large, holds the batch. A SYNC-mode policy (no budget) takes the copy as a synchronous hit,
whole, at admission, and the batch waits for it.

Invariants: a host slot belongs to at most one request; a request's host copy covers its blocks
`first .. first + len(slots)` (the blocks before `first` were shared through the prefix cache
and not copied: the copy is offered only when the prefix cache still covers them); GPU blocks
being saved are not freed until the step that copies them has run (the scheduler frees them in
`update_from_output`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

from interlude.enginecore import link_clock
from interlude.enginecore.connector_base import StepwiseConnector
from interlude.enginecore.swap_copy import BlockCopier

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


# Where the scheduler's counters ride in `SchedulerStats.kv_connector_stats`: vLLM's
# MultiConnector routes each entry there to the connector class of that name.
STATS_KEY = "HostSwapConnector"


class QuietPromMetrics(KVConnectorPromMetrics):
    """vLLM's per-connector Prometheus hook, left empty: our stat logger
    (engine/metrics.py) exports the scheduler's counters itself."""

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        return


@dataclass
class SwapMetadata(KVConnectorMetadata):
    """One step's copies, scheduler -> worker: (gpu block, host slot) pairs per direction."""

    loads: list[tuple[int, int]] = field(default_factory=list)  # host -> GPU
    saves: list[tuple[int, int]] = field(default_factory=list)  # GPU -> host
    # Requests whose asynchronous load ends with this step's copies (or was abandoned): the
    # worker reports them received, and vLLM schedules them (or frees their blocks) after.
    loaded: list[str] = field(default_factory=list)
    # The step's copies are a SYNC-mode policy's, whole and at once: the batch waits for them
    # (on an emulated device, `link_clock`); a budgeted step's copies run beside the forward.
    sync: bool = False


@dataclass
class HostCopy:
    """A request's blocks in host memory: slot i holds the request's block `first + i`."""

    slots: list[int]
    tokens: int  # tokens its blocks up to the last copied one cover (it may be partly filled)
    first: int = 0  # leading blocks left to the prefix cache (shared, so not copied)


def host_blocks(vllm_config: VllmConfig) -> int:
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config  # type: ignore[union-attr]
    return int(extra.get("host_blocks", 0))


class HostSwapConnector(StepwiseConnector):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.num_gpu_blocks = kv_cache_config.num_blocks
        self.init_scheduler_side(vllm_config.cache_config.block_size, host_blocks(vllm_config))
        self._copier = BlockCopier(self.capacity, self.num_gpu_blocks)  # the worker side's

    def init_scheduler_side(self, block_size: int, capacity: int) -> None:
        """The scheduler side's state: an empty host pool of `capacity` blocks."""
        self.block_size = block_size
        self.capacity = capacity
        self._free_slots = list(range(capacity - 1, -1, -1))
        self.copies: dict[str, HostCopy] = {}
        self._local_hit: dict[str, int] = {}
        self._loaded: dict[str, int] = {}  # tokens planned for loading at the last admission
        self._pending = SwapMetadata()
        self.load_budget: int | None = None  # tokens this step may load (None: no limit)
        self._step_loads = 0  # tokens planned for loading this step
        # Asynchronous loads under way, in the order they started: the (GPU block, host slot)
        # pairs still to copy. A request stays here until the step that copies its last pair.
        self._loading: dict[str, list[tuple[int, int]]] = {}
        self.load_steps = 0  # steps that copied blocks back from host (a counter for stats)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped copy is a recompute, never lost output

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return QuietPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ---- scheduler side -------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def host_tokens(self, request_id: str) -> int:
        copy = self.copies.get(request_id)
        return copy.tokens if copy else 0

    def begin_step(self, load_budget: int | None) -> None:
        """A new step may load `load_budget` tokens from host (None: no limit, and loads are
        synchronous and whole)."""
        self.load_budget = load_budget
        self._step_loads = 0

    def loading_tokens(self, request_id: str) -> int:
        """Tokens of the request's host copy allocated on the GPU but not all copied yet (its
        asynchronous load is under way); 0 when none is."""
        return self._loaded.get(request_id, 0) if request_id in self._loading else 0

    @property
    def loads_pending(self) -> int:
        """Blocks still to copy back, over every load under way."""
        return sum(len(pairs) for pairs in self._loading.values())

    def save(self, request_id: str, gpu_blocks: list[int], tokens: int, first: int = 0) -> None:
        """Copy `gpu_blocks` (the request's next blocks, in order) to host this step; `first`:
        the request's leading blocks not copied (set by its first save)."""
        if len(gpu_blocks) > len(self._free_slots):
            raise RuntimeError(f"host pool full: {len(gpu_blocks)} > {len(self._free_slots)}")
        copy = self.copies.setdefault(request_id, HostCopy([], 0, first))
        for gpu in gpu_blocks:
            slot = self._free_slots.pop()
            copy.slots.append(slot)
            self._pending.saves.append((gpu, slot))
        copy.tokens = tokens

    def drop(self, request_id: str) -> None:
        """Forget a request's host copy and return its slots, and what a lookup that never
        reached an allocation left behind (a request that finished or was aborted while it
        waited for blocks)."""
        self._local_hit.pop(request_id, None)
        self._loaded.pop(request_id, None)
        if self._loading.pop(request_id, None) is not None:
            # Its blocks stay allocated until the worker reports the load over: say it is.
            self._pending.loaded.append(request_id)
        copy = self.copies.pop(request_id, None)
        if copy:
            self._free_slots.extend(copy.slots)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        copy = self.copies.get(request.request_id)
        if copy is None or num_computed_tokens < copy.first * self.block_size:
            # No copy, or the shared prefix it left to the prefix cache is gone from there:
            # the tokens after a gap cannot be used, all is recomputed.
            return 0, False
        # Never offer the request's last token: vLLM must compute at least one to sample.
        usable = min(copy.tokens, request.num_tokens - 1)
        offered = max(0, usable - num_computed_tokens)
        self._local_hit[request.request_id] = num_computed_tokens
        return offered, offered > 0 and self.load_budget is not None

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        local = self._local_hit.pop(rid, 0)
        copy = self.copies.get(rid)
        if copy is None or num_external_tokens == 0:
            return
        self._loaded[rid] = num_external_tokens
        ids = blocks.get_block_ids()[0]
        start, end = local // self.block_size, -(-(local + num_external_tokens) // self.block_size)
        pairs = [(ids[i], copy.slots[i - copy.first]) for i in range(start, end)]
        if self.load_budget is None:
            self._pending.loads.extend(pairs)  # synchronous: whole, this step
            self._step_loads += num_external_tokens
        else:
            self._loading[rid] = pairs

    def reload(self, request_id: str, gpu_blocks: list[int]) -> int:
        """Load the request's host copy back into `gpu_blocks` (fresh blocks at the positions it
        was copied from, from `first` on), over the next steps within the load budget, as an
        asynchronous load: vLLM holds the request until the worker reports it received. For a
        request swapped out in part, whose other blocks stayed on the GPU. The tokens loaded."""
        copy = self.copies[request_id]
        if len(gpu_blocks) > len(copy.slots):
            raise RuntimeError(f"{request_id}: {len(gpu_blocks)} blocks, {len(copy.slots)} copied")
        self._loading[request_id] = list(zip(gpu_blocks, copy.slots, strict=False))
        self._loaded[request_id] = tokens = len(gpu_blocks) * self.block_size
        return tokens

    def _plan_loads(self) -> None:
        """This step's share of the loads under way: whole blocks within the budget, at least
        one, in the order the loads started; a load whose last block goes now is named."""
        if not self._loading or self.load_budget is None:
            return
        room = max(1, (self.load_budget - self._step_loads) // self.block_size)
        for rid, pairs in list(self._loading.items()):
            if room == 0:
                break
            take = pairs[:room]
            del pairs[:room]
            room -= len(take)
            self._pending.loads.extend(take)
            self._step_loads += len(take) * self.block_size
            if not pairs:
                del self._loading[rid]
                self._pending.loaded.append(rid)

    def take_loaded(self, request_id: str) -> int:
        """Tokens loaded from host at the request's admission this step (0 if none)."""
        return self._loaded.pop(request_id, 0)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._plan_loads()
        meta, self._pending = self._pending, SwapMetadata()
        meta.sync = self.load_budget is None
        self.load_steps += bool(meta.loads)
        return meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self.drop(request.request_id)
        return False, None

    # ---- worker side ----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._copier.register(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._copier.mark_step()  # vLLM binds before the forward; copies wait for this point only

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SwapMetadata)
        self._copier.start(meta.loads, meta.saves)
        link_clock.report_copies((len(meta.loads) + len(meta.saves)) * self.block_size, meta.sync)

    def wait_for_save(self) -> None:
        self._copier.finish_saves()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # The step's loads were issued in `start_load_kv` (on CUDA, ahead of every later kernel
        # on the compute stream): a request whose last block came back may run from the next
        # step on.
        if not self.has_connector_metadata():
            return None, None
        meta = self._get_connector_metadata()
        assert isinstance(meta, SwapMetadata)
        return None, (set(meta.loaded) or None)


def find_swap(connector: object) -> HostSwapConnector | None:
    """Our host swap: the connector itself, or one of a MultiConnector's (the host link beside
    it); None when the engine has none (no policy)."""
    if isinstance(connector, HostSwapConnector):
        return connector
    subs = getattr(connector, "sub_connectors", [])
    return next((c for c in subs if isinstance(c, HostSwapConnector)), None)
