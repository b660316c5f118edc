"""The policy's `RequestView` of a vLLM `Request`, and the per-request metadata we attach.

A request carries what only the caller knows (augmentation kind, session arrival, the tool it is
about to call) in `SamplingParams.extra_args["interlude"]`; each turn's params replace the last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.v1.request import Request, RequestStatus

from interlude.engine.parking import Parked
from interlude.policy import Phase

META_KEY = "interlude"
# The tool of a real model's pause: the frontend parses its name after the turn ends, so the
# scheduler (and the policy's duration prediction) sees only that some tool was called.
UNKNOWN_TOOL = "tool"


@dataclass(frozen=True)
class RequestMeta:
    """Caller-supplied facts about a session, carried in SamplingParams.extra_args."""

    kind: str = "unknown"  # augmentation type (the simulator's workload kinds)
    arrival: float = 0.0  # session arrival (time.time()); 0 = use the request's own
    tool: str | None = None  # the tool called at the end of this turn, if any
    calls_done: int = 0  # tool calls finished before this turn

    @classmethod
    def from_extra_args(cls, extra: dict[str, Any] | None) -> RequestMeta:
        raw = (extra or {}).get(META_KEY) or {}
        return cls(
            kind=str(raw.get("kind", "unknown")),
            arrival=float(raw.get("arrival", 0.0)),
            tool=raw.get("tool"),
            calls_done=int(raw.get("calls_done", 0)),
        )

    def to_extra_args(self) -> dict[str, Any]:
        return {
            META_KEY: {
                "kind": self.kind,
                "arrival": self.arrival,
                "tool": self.tool,
                "calls_done": self.calls_done,
            }
        }


def request_meta(r: Request) -> RequestMeta:
    params = r.sampling_params
    return RequestMeta.from_extra_args(params.extra_args if params is not None else None)


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


def view_of(
    r: Request, p: Parked | None, host_tokens: int, block_size: int, q_time: float, q_iter: int
) -> EngineRequestView:
    meta = request_meta(r)
    arrival = meta.arrival or r.arrival_time
    if p is not None:
        gpu, cpu = p.split(block_size)
        context = p.frontier
        phase = Phase.PAUSED
    else:
        context = r.num_tokens
        gpu = min(r.num_computed_tokens, context)
        cpu = min(host_tokens, context - gpu)
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
        scheduled_once=r.num_computed_tokens > 0 or r.num_output_tokens > 0,
    )
