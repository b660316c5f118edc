"""A simulated request: the mutable state the simulator keeps, readable as a `RequestView`."""

from __future__ import annotations

from typing import Protocol

from interlude.policy.types import Phase
from interlude_workloads import Segment, TraceRequest


class DecodeClock:
    """Tokens every decoding request has gained so far: each iteration that runs the decodes
    adds one to all of them at once, so the simulator counts it here instead of per request
    (see `SimRequest.decode_join`)."""

    __slots__ = ("ticks",)

    def __init__(self) -> None:
        self.ticks = 0


class SimRequest:
    """One arrival of a trace request.

    Token bookkeeping (the invariant checked by `Simulator.check_integrity`):
    `context_tokens == gpu_tokens + cpu_tokens + pending_tokens`; of the pending tokens the
    first `recompute_left` were computed once and dropped, so computing them is recomputation.

    While a request decodes, its four growing counts (GPU, context, output and generated tokens)
    follow a `DecodeClock` (`decode_join`): it is then a `DecodingRequest`, which reads them as
    stored + ticks, so an iteration costs the simulator one addition, not one per decode. Every
    other request keeps plain attributes, as fast to read as before.
    """

    __slots__ = (
        "_clock",
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
        "prefix_hit_tokens",
        "queue_iteration",
        "queue_time",
        "recompute_left",
        "recomputed_tokens",
        "request_id",
        "resumed_at",
        "run_seq",
        "scheduled_once",
        "segment",
        "segments",
        "shared_head_tokens",
        "swapped_tokens",
        "tool",
        "tool_time",
    )

    def __init__(
        self, request_id: str, trace: TraceRequest, arrival: float, shared_head_tokens: int = 0
    ) -> None:
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
        self.resumed_at: float | None = None  # its call returned; its turn has no token yet
        self.scheduled_once = False
        # Order of entry into the running set (the simulator's running dict keeps that order).
        self.run_seq = 0
        self._clock: DecodeClock | None = None  # set while decoding
        # Metrics.
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.tool_time = 0.0
        self.output_tokens = 0  # generated tokens plus tokens returned by tools
        self.recomputed_tokens = 0
        self.prefix_hit_tokens = 0  # found again in the prefix cache instead of recomputed
        # Its prompt's first tokens, found in its group's shared head (`sim/shared_heads.py`):
        # never computed, never its own; `trace` is the rest of it.
        self.shared_head_tokens = shared_head_tokens
        self.swapped_tokens = 0  # out + in

    @property
    def decoding(self) -> bool:
        """True while the counts follow a `DecodeClock`."""
        return self._clock is not None

    def decode_join(self, clock: DecodeClock) -> None:
        """Start decoding: from now on the four counts grow with `clock`."""
        t = clock.ticks
        self.gpu_tokens -= t
        self.context_tokens -= t
        self.output_tokens -= t
        self.generated_tokens -= t
        self._clock = clock
        self.__class__ = DecodingRequest  # same slots; only the four reads change

    def decode_leave(self) -> None:
        """Stop decoding: the counts become plain numbers again, as they stand now."""
        self.__class__ = SimRequest
        assert self._clock is not None
        t = self._clock.ticks
        self.gpu_tokens += t
        self.context_tokens += t
        self.output_tokens += t
        self.generated_tokens += t
        self._clock = None

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


class _Slot(Protocol):
    def __get__(self, obj: SimRequest, owner: type | None = None) -> int: ...


# The stored values, under the properties of `DecodingRequest`.
_GPU: _Slot = SimRequest.__dict__["gpu_tokens"]
_CONTEXT: _Slot = SimRequest.__dict__["context_tokens"]
_OUTPUT: _Slot = SimRequest.__dict__["output_tokens"]
_GENERATED: _Slot = SimRequest.__dict__["generated_tokens"]


class DecodingRequest(SimRequest):
    """A `SimRequest` while it decodes (see `SimRequest.decode_join`): its four growing counts
    read as stored + clock ticks and cannot be assigned."""

    __slots__ = ()
    _clock: DecodeClock

    def _frozen(self) -> None:
        raise RuntimeError(f"{self.request_id}: a decoding request's counts follow its clock")

    @property
    def gpu_tokens(self) -> int:
        return _GPU.__get__(self) + self._clock.ticks

    @gpu_tokens.setter
    def gpu_tokens(self, value: int) -> None:
        self._frozen()

    @property
    def context_tokens(self) -> int:
        return _CONTEXT.__get__(self) + self._clock.ticks

    @context_tokens.setter
    def context_tokens(self, value: int) -> None:
        self._frozen()

    @property
    def output_tokens(self) -> int:
        return _OUTPUT.__get__(self) + self._clock.ticks

    @output_tokens.setter
    def output_tokens(self, value: int) -> None:
        self._frozen()

    @property
    def generated_tokens(self) -> int:
        return _GENERATED.__get__(self) + self._clock.ticks

    @generated_tokens.setter
    def generated_tokens(self, value: int) -> None:
        self._frozen()
