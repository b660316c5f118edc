"""The `Policy` seam: one interface for every interception-handling policy.

Side effects: a policy may keep private state (learned durations, counters) updated through
`decide` and the `on_*` hooks; it never mutates the requests or the engine. Invariants the
engine relies on: `decide` names only paused requests in `Decision.kv`, swaps no more blocks
than `view.swap_budget_tokens` allows (minus the swap-ins it plans), and swaps no more than
`view.free_cpu_blocks`. The simulator raises `PolicyError` on a breach; the engine's scheduler
drops the breaking action and logs it (`InterludeScheduler._refuse`), so one policy bug does not
take every session down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from mypy_extensions import mypyc_attr

from interlude.policy.profile import Profile
from interlude.policy.types import UNKNOWN_TOOL, Decision, RequestView, SchedulerView, Traits


# An exception stays a Python class: mypyc cannot compile subclasses of builtin ones.
@mypyc_attr(native_class=False)
class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the seam's invariants."""


KeyArray = npt.NDArray[np.float64]  # row i: the numbers of request i's key tuple
RowArray = npt.NDArray[np.intp]


@dataclass(frozen=True)
class KeyRows:
    """`Policy.rank_keys` on an array, with the policy's own number (`rows`) for each request:
    an engine that keeps them beside its queue hands them back at the next re-rank (-1 for a
    request it has none for), and the policy need not look each request up again."""

    keys: KeyArray
    rows: RowArray


# Compiled (interlude.compiled), it still takes policies written in Python as subclasses.
@mypyc_attr(allow_interpreted_subclasses=True)
class Policy(ABC):
    name: ClassVar[str]
    traits: ClassVar[Traits]
    description: ClassVar[str]
    # The peer a configuration belongs to ("" for a policy of its own): sweep tables show
    # each peer at its best configuration for the workload, and say which one that was.
    family: ClassVar[str] = ""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    @abstractmethod
    def decide(self, view: SchedulerView) -> Decision:
        """Handle paused requests and order the queues for the next iteration."""

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        """Rank of `req` as it enters the waiting or swap queue; lower runs first.

        Asked once per entry: a queued request's own state does not change while it waits.
        A policy whose keys follow the batch state sets `Traits.rescore_queued`, and engines
        ask again at every iteration; either way the answer must not depend on how often it
        was asked. The default is FCFS by original arrival time (InferCept).
        """
        return (req.arrival,)

    def queue_keys(self, reqs: Sequence[RequestView], now: float) -> list[tuple[float, ...]]:
        """`queue_key` of many queued requests at once: engines re-rank whole queues with it
        (`Traits.rescore_queued`), so a policy may answer with a faster loop."""
        return [self.queue_key(r, now) for r in reqs]

    def rank_keys(
        self, reqs: Sequence[RequestView], now: float, rows: RowArray | None = None
    ) -> list[tuple[float, ...]] | KeyArray | KeyRows:
        """`queue_keys`, in whichever form the policy computes faster: that list, or one
        float64 array whose row i holds the numbers of `queue_keys(reqs, now)[i]`, in order,
        maybe with the policy's row numbers (`KeyRows`).

        Engines that sort in numpy (the simulator) ask this instead of `queue_keys`, with the
        same side effects, and sort an array without turning tuples into columns first.
        `rows`, when given, are the `KeyRows.rows` this policy gave for these requests, in
        `reqs`' order (-1: none given); a policy that gives none ignores them.
        """
        return self.queue_keys(reqs, now)

    def on_pause(self, req: RequestView, now: float) -> None:
        """`req` just stopped at a tool call (its `tool` and `paused_at` are set)."""
        return

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        """The call of `req` returned after `duration` seconds; `req` still shows that tool."""
        return

    def on_segment(self, req: RequestView, gen_tokens: int) -> None:
        """`req` generated a whole segment of `gen_tokens` tokens (before a call or the end)."""
        return

    def on_finish(self, req: RequestView, now: float) -> None:
        """`req` finished; forget anything kept about it."""
        return

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        """Running requests in the order the engine should preempt them when memory runs out.

        vLLM preempts the tail of its running queue, the request admitted last.
        """
        return sorted(running, key=lambda r: r.queue_time, reverse=True)


_GPU_TOKENS = attrgetter("gpu_tokens")


def holding_gpu(reqs: Iterable[RequestView]) -> Iterator[RequestView]:
    """The requests of `reqs` with KV on the GPU, in order. Policies look at every paused
    request at every iteration, and under load most hold none: they are passed over in C
    (token counts are never negative, so a count is true exactly when it is > 0)."""
    return filter(_GPU_TOKENS, reqs)


def paused_on_gpu(view: SchedulerView) -> Iterator[RequestView]:
    """`view`'s paused requests with KV on the GPU, in order (`holding_gpu`, over the engine's
    shorter list of KV holders when it gives one)."""
    held = view.paused_with_kv
    return holding_gpu(view.paused if held is None else held)


def call_key(r: RequestView) -> str:
    """What a request's call times are learned and predicted by: its tool when the request
    names one, else its kind. An agent's calls differ by tool by orders of magnitude (a file
    read returns in milliseconds, a test run in minutes), where the InferCept trace's tools
    are the request kinds. A real model's pause names no tool yet (`UNKNOWN_TOOL`: the engine's
    front end parses the call after the turn), and pooling every such call as one tool would
    lose the kinds."""
    return r.kind if r.tool in (None, "", UNKNOWN_TOOL) else r.tool


def by_arrival(r: RequestView) -> tuple[float, str]:
    return (r.arrival, r.request_id)


def swap_in_need(view: SchedulerView) -> int:
    """Tokens the engine will swap in this iteration if the whole budget goes to swap-ins first."""
    want = sum(r.cpu_tokens for r in view.swap_queue)
    return min(view.swap_budget_tokens, want)


def swap_out_budget_blocks(view: SchedulerView) -> int:
    """Whole blocks that may be swapped out this iteration after the planned swap-ins."""
    tokens = view.swap_budget_tokens - swap_in_need(view)
    return max(0, min(tokens // view.profile.block_size, view.free_cpu_blocks))
