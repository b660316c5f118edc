"""The vocabulary shared by every policy and every engine that drives one.

The engine (simulator or vLLM scheduler) owns the requests and the KV blocks; each iteration it
shows the policy a read-only `SchedulerView` and applies the `Decision` it gets back. Policies
never mutate requests: they only read `RequestView`s and return frozen decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from interlude.policy.profile import Profile

# `SchedulerView.shared_blocks` of an engine without a prefix cache (read-only: one object
# serves every view).
NO_SHARED_BLOCKS: Mapping[str, int] = MappingProxyType({})

# `RequestView.tool` of a real model's pause: the engine's front end parses which tool the turn
# called only after the turn ends, so the scheduler (and a policy's prediction) sees only that
# some tool was called. A policy that predicts by tool falls back to the request's kind for it.
UNKNOWN_TOOL = "tool"


class Phase(enum.IntEnum):
    """A request's life, in order. Every phase >= FINISHED is final (`finished` is a comparison).

    A request cycles WAITING/SWAP_QUEUED -> RUNNING -> PAUSED -> ... once per tool call, so
    the order here is the order inside one cycle, not a promise that phases only grow.
    """

    WAITING = 0  # holds no KV anywhere; needs (re)compute of its whole context
    SWAP_QUEUED = 1  # resumed from a call; part of its KV is in host memory, waiting for swap-in
    RUNNING = 2  # admitted: holds GPU blocks, prefilling pending tokens or decoding
    PAUSED = 3  # stopped at a tool call, waiting for the result
    FINISHED = 4  # generated its last segment
    FAILED = 5  # could never be served (e.g. context larger than the KV space)


class Handling(enum.Enum):
    """What to do with a paused request's GPU blocks."""

    PRESERVE = "preserve"  # keep them on the GPU
    SWAP = "swap"  # copy them to host memory, then free them on the GPU
    DISCARD = "discard"  # free them; the tokens are recomputed on resume


class SwapMode(enum.Enum):
    BUDGETED = "budgeted"  # pipelined with compute, at most `swap_budget_tokens` per iteration
    SYNC = "sync"  # whole context at once, the batch stalls for the copy


class BatchMode(enum.Enum):
    # vLLM v0: a prefill-only iteration whenever a whole prompt fits, else a decode iteration.
    PREFILL_FIRST = "prefill-first"
    # InferCept: decodes plus prefill chunks up to the saturation point S per iteration.
    CHUNKED = "chunked"
    # vLLM v1 as the engine runs a policy: decodes plus prefill chunks of at most S tokens per
    # request (`long_prefill_token_threshold`), up to `max_batched_tokens` per iteration.
    THRESHOLD = "threshold"
    # vLLM v1 as it ships (0.32): decodes plus prefill chunks up to `max_batched_tokens` per
    # iteration, with no cap per request.
    V1 = "v1"


class RequestView(Protocol):
    """Read-only facts about one request, as the policy sees them.

    Token counts: `context_tokens = gpu_tokens + cpu_tokens + pending_tokens`, where pending
    tokens have no KV yet (never computed, or dropped and to be recomputed).
    """

    @property
    def request_id(self) -> str: ...
    @property
    def kind(self) -> str: ...  # augmentation type of the whole request
    @property
    def arrival(self) -> float: ...  # original arrival time (seconds)
    @property
    def queue_time(self) -> float: ...  # when it entered its current queue (or was admitted)
    @property
    def queue_iteration(self) -> int: ...  # the engine iteration of that moment
    @property
    def phase(self) -> Phase: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def gpu_tokens(self) -> int: ...
    @property
    def cpu_tokens(self) -> int: ...
    @property
    def pending_tokens(self) -> int: ...
    @property
    def generated_tokens(self) -> int: ...  # in the current segment
    @property
    def calls_done(self) -> int: ...
    @property
    def tool(self) -> str | None: ...  # the tool of the call in progress (PAUSED) or last call
    @property
    def paused_at(self) -> float | None: ...  # start of the call in progress
    @property
    def scheduled_once(self) -> bool: ...  # has run at least one iteration
    # What the trace says the current segment will do, where the engine knows it (the
    # simulator, from the trace; the vLLM engine cannot: None). Oracle policies read these:
    # tokens the segment generates in all (`generated_tokens` of them so far), and seconds
    # its call lasts (0.0 when the segment ends the request).
    @property
    def oracle_gen_tokens(self) -> int | None: ...
    @property
    def oracle_call_s(self) -> float | None: ...


@dataclass(frozen=True)
class Traits:
    """Static properties of a policy that shape how the engine batches and swaps."""

    batch_mode: BatchMode
    swap_mode: SwapMode = SwapMode.BUDGETED
    # The policy's queue keys depend on the batch state, not only on the request (LAMPS
    # re-ranks its queues every iteration): after each `decide`, engines ask `queue_keys` again
    # for every queued request, which keeps its entry time and its place among equal keys.
    rescore_queued: bool = False
    # Freed KV stays in the engine's prefix cache until its blocks are reused, least recently
    # freed first, and a request that computed its context once finds its leading blocks again
    # (vLLM v1's automatic prefix caching, on in the engine). False: the paper's vLLM v0
    # baselines, which had none (`sim/prefix_cache.py`).
    prefix_cache: bool = True


@dataclass(frozen=True)
class SchedulerView:
    """Everything a policy may look at in one iteration. Built by the engine, never mutated."""

    now: float
    iteration: int
    profile: Profile
    running: Sequence[RequestView]
    waiting: Sequence[RequestView]
    swap_queue: Sequence[RequestView]
    paused: Sequence[RequestView]
    free_gpu_blocks: int
    free_cpu_blocks: int
    # Tokens the running requests schedule next iteration (1 per decode + pending prefill).
    running_tokens: int
    # Context held by running requests: C_other in the waste equations.
    running_context: int
    # N with T_swap(N) = T_fwd(batch): swap-in + swap-out tokens this iteration (budgeted mode).
    swap_budget_tokens: int
    # Shortcuts an engine may give when it keeps them anyway (the simulator does: under load
    # most of thousands of paused and waiting requests hold no KV, and policies look at every
    # one at every iteration). None: policies work them out from the lists above.
    # The paused requests with GPU or host KV, in `paused` order.
    paused_with_kv: Sequence[RequestView] | None = None
    # False only when no waiting request has KV on the GPU.
    waiting_holds_kv: bool | None = None
    # Waiting request id -> blocks of its context that requests holding KV already hold
    # (prefix-cache hits on blocks in use, such as a system prompt and tool declarations
    # another conversation shares): admitting it allocates that many fewer. vLLM's own
    # admission counts them so. Only engines with a prefix cache fill it, for the queue's
    # head; the simulator has no prefix cache, so it stays empty there.
    shared_blocks: Mapping[str, int] = field(default_factory=lambda: NO_SHARED_BLOCKS)


@dataclass(frozen=True)
class KVAction:
    """Move or free `blocks` of a paused request's GPU blocks this iteration.

    PRESERVE needs no action. Partial actions take whole blocks; asking for at least the
    request's GPU block count moves or frees all of them.
    """

    request_id: str
    handling: Handling
    blocks: int

    def __post_init__(self) -> None:
        if self.handling is Handling.PRESERVE:
            raise ValueError("KVAction: PRESERVE is the absence of an action")
        if self.blocks < 1:
            raise ValueError(f"KVAction for {self.request_id}: blocks must be >= 1")


@dataclass(frozen=True)
class Decision:
    """A policy's answer for one iteration.

    Queue order is the policy's through `Policy.queue_key`, asked once when a request enters
    the waiting or swap queue; `requeue` names queued requests whose key has changed since
    (e.g. promoted by a starvation guard): the engine asks again and moves them.
    `review_at` / `review_iteration` tell an engine that skips identical iterations when this
    decision could change without any event.
    `hold` is admission control: requests of `view.waiting` the engine must not admit this
    iteration (they keep their place; requests behind them may go ahead). Ids that are not in
    the waiting queue are ignored. Program-level schedulers (ThunderAgent) need it: they keep
    a whole program out while the KV of the programs already in does not leave room.
    `admit_limit` is admission control by count: the engine admits at most that many requests
    of `view.waiting` that hold no GPU KV this iteration, in queue order (held ones aside; a
    resumed session that kept its KV, queued in vLLM but running at once in the simulator, is
    never held by it); None sets no limit. It
    costs the policy a look at the queue's head only, where `hold` must name every request
    kept out (`interlude` keeps free blocks for the running requests' decode growth with it).
    """

    kv: tuple[KVAction, ...] = ()
    requeue: tuple[str, ...] = ()
    review_at: float | None = None
    review_iteration: int | None = None
    hold: frozenset[str] = frozenset()
    admit_limit: int | None = None

    def __post_init__(self) -> None:
        if self.admit_limit is not None and self.admit_limit < 0:
            raise ValueError(f"Decision.admit_limit must be >= 0, got {self.admit_limit}")
