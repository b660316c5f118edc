"""The policy's `RequestView` of a vLLM `Request`, and the per-request metadata we attach.

A request carries what only the caller knows (augmentation kind, session arrival, the tool it is
about to call) in `SamplingParams.extra_args["interlude"]`; each turn's params replace the last.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.parking import Parked
from interlude.policy import Phase

META_KEY = "interlude"
T = TypeVar("T")


@dataclass(frozen=True)
class RequestMeta:
    """Caller-supplied facts about a session, carried in SamplingParams.extra_args."""

    kind: str = "unknown"  # augmentation type (the simulator's workload kinds)
    arrival: float = 0.0  # session arrival (time.time()); 0 = use the request's own
    tool: str | None = None  # the tool called at the end of this turn, if any
    calls_done: int = 0  # tool calls finished before this turn
    # The caller's id of the request (the engine core knows it under another): how a resumed
    # turn started is reported under it (`ParkedMoves.turn_starts`).
    caller_id: str | None = None

    @classmethod
    def from_extra_args(cls, extra: dict[str, Any] | None) -> RequestMeta:
        raw = (extra or {}).get(META_KEY) or {}
        return cls(
            kind=str(raw.get("kind", "unknown")),
            arrival=float(raw.get("arrival", 0.0)),
            tool=raw.get("tool"),
            calls_done=int(raw.get("calls_done", 0)),
            caller_id=raw.get("caller_id"),
        )

    def to_extra_args(self) -> dict[str, Any]:
        return {
            META_KEY: {
                "kind": self.kind,
                "arrival": self.arrival,
                "tool": self.tool,
                "calls_done": self.calls_done,
                "caller_id": self.caller_id,
            }
        }


def request_meta(r: Request) -> RequestMeta:
    params = r.sampling_params
    return RequestMeta.from_extra_args(params.extra_args if params is not None else None)


class MetaCache:
    """`request_meta` parsed once per turn, not once per view: the scheduler builds views of
    every running, queued and parked request at every step, and a request's meta changes only
    when the next turn's SamplingParams replace the last."""

    def __init__(self) -> None:
        self._by_id: dict[str, tuple[object, RequestMeta]] = {}  # id -> (params, meta)

    def get(self, r: Request) -> RequestMeta:
        hit = self._by_id.get(r.request_id)
        if hit is not None and hit[0] is r.sampling_params:
            return hit[1]
        meta = request_meta(r)
        self._by_id[r.request_id] = (r.sampling_params, meta)
        return meta

    def forget(self, request_id: str) -> None:
        self._by_id.pop(request_id, None)


@dataclass(frozen=True)
class EngineRequestView:
    """A snapshot satisfying `interlude.policy.RequestView` (plain attributes suffice)."""

    request_id: str
    kind: str
    arrival: float
    queue_time: float
    queue_iteration: int
    phase: Phase
    context_tokens: int
    gpu_tokens: int
    cpu_tokens: int
    pending_tokens: int
    generated_tokens: int
    calls_done: int
    tool: str | None
    paused_at: float | None
    scheduled_once: bool
    # The engine cannot know what a turn will generate or how long its tool will take.
    oracle_gen_tokens: int | None = None
    oracle_call_s: float | None = None


def view_of(
    r: Request,
    p: Parked | None,
    host_tokens: int,
    block_size: int,
    q_time: float,
    q_iter: int,
    meta: RequestMeta | None = None,
    ran: bool = False,
    loading: int = 0,
) -> EngineRequestView:
    """`ran`: the scheduler has scheduled `r` before. vLLM's session update clears a resumed
    turn's outputs, and a resume whose KV left the GPU restarts from token 0, so `r` alone
    would say a session back from a call never ran (the simulator's request says it did).
    `loading`: tokens of its host copy allocated on the GPU but still being copied back (vLLM
    counts them computed already); they show as on the host until the copy is done."""
    meta = meta if meta is not None else request_meta(r)
    arrival = meta.arrival or r.arrival_time
    if p is not None:
        gpu, cpu = p.split(block_size)
        context = p.frontier
        phase = Phase.PAUSED
    else:
        context = r.num_tokens
        gpu = min(r.num_computed_tokens - loading, context)
        # The host copy covers the context from its start: only what lies past the GPU's part
        # is still on the host (none, once a load has come back).
        cpu = max(0, min(host_tokens, context) - gpu)
        if r.is_finished():
            phase = Phase.FINISHED
        elif r.status == RequestStatus.RUNNING:
            phase = Phase.RUNNING
        else:
            phase = Phase.SWAP_QUEUED if cpu else Phase.WAITING
    return EngineRequestView(
        request_id=r.request_id,
        kind=p.kind if p else meta.kind,
        arrival=arrival,
        queue_time=q_time,
        queue_iteration=q_iter,
        phase=phase,
        context_tokens=context,
        gpu_tokens=gpu,
        cpu_tokens=cpu,
        pending_tokens=context - gpu - cpu,
        generated_tokens=len(r.output_token_ids),
        calls_done=p.calls_done if p else meta.calls_done,
        tool=p.tool if p else meta.tool,
        paused_at=p.paused_at if p else None,
        scheduled_once=ran or r.num_computed_tokens > 0 or r.num_output_tokens > 0,
    )


class _FromSnapshot(Generic[T]):
    """A read-only attribute of a `QueuedView`, read from its snapshot under the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, view: QueuedView, owner: type | None = None) -> T:
        value: T = getattr(view._snap, self._name)
        return value


class QueuedView:
    """What `Policy.queue_key` sees: the snapshot taken at the queue entry, except `phase` and
    `queue_time`, read from the request when asked. Policies keep these views: the starvation
    guard checks, iterations later, that the request still waits since that entry (the
    simulator's requests are live objects). A snapshot would say it waits forever, and every
    request queued after it had run would be promoted 100 iterations later."""

    __slots__ = ("_entered", "_request", "_snap")

    def __init__(
        self,
        snap: EngineRequestView,
        request: Request,
        entered: Mapping[str, tuple[float, int]],  # request id -> (queue time, iteration)
    ) -> None:
        self._snap = snap
        self._request = request
        self._entered = entered

    @property
    def phase(self) -> Phase:
        r = self._request
        if r.is_finished():
            return Phase.FINISHED
        if r.status == RequestStatus.RUNNING:
            return Phase.RUNNING
        if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            return Phase.PAUSED
        return self._snap.phase  # still queued: WAITING or SWAP_QUEUED as it entered

    @property
    def queue_time(self) -> float:
        entry = self._entered.get(self._snap.request_id)
        return entry[0] if entry is not None else self._snap.queue_time

    # The rest is the snapshot's, as it was at the queue entry.
    request_id = _FromSnapshot[str]()
    kind = _FromSnapshot[str]()
    arrival = _FromSnapshot[float]()
    queue_iteration = _FromSnapshot[int]()
    context_tokens = _FromSnapshot[int]()
    gpu_tokens = _FromSnapshot[int]()
    cpu_tokens = _FromSnapshot[int]()
    pending_tokens = _FromSnapshot[int]()
    generated_tokens = _FromSnapshot[int]()
    calls_done = _FromSnapshot[int]()
    tool = _FromSnapshot[str | None]()
    paused_at = _FromSnapshot[float | None]()
    scheduled_once = _FromSnapshot[bool]()
    oracle_gen_tokens = _FromSnapshot[int | None]()
    oracle_call_s = _FromSnapshot[float | None]()
