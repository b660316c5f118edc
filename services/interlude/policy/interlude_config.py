"""`interlude`'s knobs (`InterludeConfig`), each with the runs that set its value."""

from __future__ import annotations

from dataclasses import dataclass

ADMISSIONS = ("headroom", "reserve-dynamic")


@dataclass(frozen=True)
class InterludeConfig:
    """The knobs of `interlude`'s admission and swaps, with the values the benchmark uses.

    Swept on the shared trace (GPT-J-6B profile, seeds 0 and 1, 7.5 and 8 req/s, the edge of
    overload), then checked on the generated mixed workload at 3 and 4 req/s; docs/policies.md
    has the runs. (The queue's knob, a virtual deadline's `deadline_beta`, was removed on
    2026-11-30: off by default since it made a large pool's queue nearly FCFS.)
    """

    # Free blocks kept for this share of the running requests' predicted growth (0: admit
    # whatever fits, as vLLM does). On the shared trace at 7.5 req/s, 1800 s, the p99
    # normalized latency was 853 ms/token at 0, 546 at 0.25, 563 at 0.5 and 623 at 1 (0.25
    # and 0.5 are within noise; 0.5 keeps more room when predictions run short).
    headroom: float = 0.5
    # How admission reserves room for growth: "headroom" (above) or TetriInfer's
    # "reserve-dynamic" (`admission.reserve_dynamic_limit`: the growth until the running
    # request predicted to end first ends). Measured against each other and greedy admission
    # in docs/policies.md.
    admission: str = "headroom"
    # Free blocks also kept, `headroom` x, for paused requests that may be back soon: those
    # holding KV (on the GPU or swapped out), each weighted by the share of its kind's calls
    # that lasted at most this many seconds; a swapped one for its whole context, a kept one
    # for what it adds (the call's returned tokens and its next segment). Requests in the
    # swap queue (back, waiting for their swap-in) are certain and kept for in full. None:
    # only running requests are reserved for, as before. On the ToolBench-like workload
    # (2.25 req/s, 1800 s) the p99 normalized latency was 1,072 ms/token without it, and
    # 224 / 347 / 542 with 1 / 2 / 4 s; short, because an admitted request holds its blocks
    # for longer than a call that lasts longer is worth reserving for (docs/policies.md).
    # The horizon is engine time, this many iterations of the model's fixed cost
    # (`Profile.fwd_c_ms`): 1 s on GPT-J (10 ms), where it was tuned, and 0.4 s on the tiny
    # CPU model (4 ms), whose admitted requests free their blocks sooner. On the CPU engine
    # (markup sessions, 2-8/s, one round) 1 s had held room for nearly every paused session:
    # at 8/s mean TTFT 2.29 s and p99 221 ms/token, against 1.27 s and 179 at 100 iterations
    # (and 0.36 s and 72 with no return reserve at all; docs/engine.md).
    return_horizon_iterations: float | None = 100.0
    # Under memory pressure a swap within the budget is priced at what it costs: the
    # request's own memory while its KV is copied out and back (2 T_swap(C) C M), not
    # InferCept's synchronous waste, which charges every running request's memory for a
    # stall that a budgeted swap does not cause. Without pressure the synchronous price
    # stays: a swap then frees nothing anyone needs, and the resume waits for the swap-in.
    budgeted_swap_price: bool = True
    # Without pressure a swap frees memory nobody needs yet, and the resume must wait for
    # the swap-in: swap then only while more than this share of the GPU KV is in use, when
    # pressure is an arrival or two away and the link is idle now (0: whenever a swap pays,
    # as before). ToolBench-like, median ms/token: 1 req/s 4.62 at 0, 4.51 at 0.5, 4.47 at
    # 0.75 (thunderagent, which never swaps, 4.48); 2 req/s 6.04 / 6.05 / 6.07, and with no
    # swap at all without pressure 8.11 (recomputing 6.35M tokens against 1.67M).
    swap_ahead_usage: float = 0.75

    def __post_init__(self) -> None:
        if self.headroom < 0:
            raise ValueError(f"InterludeConfig.headroom must be >= 0, got {self.headroom}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"InterludeConfig.admission must be one of {ADMISSIONS}")
        if self.return_horizon_iterations is not None and self.return_horizon_iterations < 0:
            raise ValueError(
                "InterludeConfig.return_horizon_iterations must be >= 0 or None, "
                f"got {self.return_horizon_iterations}"
            )
        if not 0 <= self.swap_ahead_usage <= 1:
            raise ValueError(
                f"InterludeConfig.swap_ahead_usage must be in [0, 1], got {self.swap_ahead_usage}"
            )
