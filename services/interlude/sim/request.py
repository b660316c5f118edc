"""A simulated request: the mutable state the simulator keeps, readable as a `RequestView`."""

from __future__ import annotations

from interlude.policy.types import Phase
from interlude_loadgen import Segment, TraceRequest


class SimRequest:
    """One arrival of a trace request.

    Token bookkeeping (the invariant checked by `Simulator.check_integrity`):
    `context_tokens == gpu_tokens + cpu_tokens + pending_tokens`; of the pending tokens the
    first `recompute_left` were computed once and dropped, so computing them is recomputation.
    """

    __slots__ = (
        "arrival",
        "calls_done",
        "context_tokens",
        "cpu_tokens",
        "finished_at",
        "first_token_at",
        "generated_tokens",
        "gpu_tokens",
        "kind",
        "output_tokens",
        "paused_at",
        "pending_tokens",
        "phase",
        "queue_iteration",
        "queue_time",
        "recompute_left",
        "recomputed_tokens",
        "request_id",
        "scheduled_once",
        "segment",
        "segments",
        "swapped_tokens",
        "tool",
        "tool_time",
    )

    def __init__(self, request_id: str, trace: TraceRequest, arrival: float) -> None:
        self.request_id = request_id
        self.kind = trace.kind
        self.arrival = arrival
        self.queue_time = arrival
        self.queue_iteration = 0
        self.phase = Phase.WAITING
        self.segments: tuple[Segment, ...] = trace.segments
        self.segment = 0
        self.context_tokens = trace.prompt_tokens
        self.gpu_tokens = 0
        self.cpu_tokens = 0
        self.pending_tokens = trace.prompt_tokens
        self.recompute_left = 0
        self.generated_tokens = 0
        self.calls_done = 0
        self.tool: str | None = None
        self.paused_at: float | None = None
        self.scheduled_once = False
        # Metrics.
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.tool_time = 0.0
        self.output_tokens = 0  # generated tokens plus tokens returned by tools
        self.recomputed_tokens = 0
        self.swapped_tokens = 0  # out + in

    @property
    def target(self) -> int:
        """Tokens to generate in the current segment."""
        return self.segments[self.segment].gen_tokens

    # The trace's truth, for oracle policies (`RequestView.oracle_*`).
    @property
    def oracle_gen_tokens(self) -> int:
        return self.segments[self.segment].gen_tokens

    @property
    def oracle_call_s(self) -> float:
        call = self.segments[self.segment].call
        return 0.0 if call is None else call.duration_s

    def __repr__(self) -> str:
        return (
            f"SimRequest({self.request_id} {self.phase.name} ctx={self.context_tokens} "
            f"gpu={self.gpu_tokens} cpu={self.cpu_tokens} pending={self.pending_tokens} "
            f"seg={self.segment}/{len(self.segments)} gen={self.generated_tokens})"
        )
