"""`interlude`: our policy. Min-waste handling that knows what a call costs, a memory-time ranked
queue, and a starvation guard.

What it does, and why each part beats an anchor:

* **Expected, not elapsed, interception time.** InferCept estimates a call's length as
  t_now - t_call, so every call starts as "free to preserve" and a 28 s human turn holds its
  KV until the estimate grows past the discard cost. We learn the duration distribution per
  tool (else per request kind) online (`Predictor`, `call_key`) and use the mean *residual*
  time E[D - t | D > t], so a chat call is converted at once and a calculator call is kept,
  from the first iteration.
* **Ski-rental guard.** Estimates can be wrong (a new kind, a drifting tool). Whatever the
  estimate says, once the preserve waste already paid exceeds the cost of converting, we
  convert: the classic break-even rule that never pays more than twice the optimum.
* **Pressure-aware.** Preserving only wastes memory somebody could use. While the free GPU
  blocks cover what the queues ask for, we do not discard (a recompute is pure loss then).
* **Swap only when it pays.** A budgeted swap costs no compute, but it takes host memory (a
  shared, small pool) and the resume must wait for the swap-in. We price a swap at its
  synchronous waste (InferCept's swap waste, an upper bound on the stall it can cause) and
  swap a request only when its expected preserve waste is larger, highest expected waste
  first, so host memory goes to the long calls and a calculator or environment call stays on
  the GPU; and only once most of the GPU KV is in use. Under pressure a swap within the budget
  is priced at its own cost, the request's memory while it is copied (`budgeted_swap_price`):
  a second-long call's KV then goes to host memory instead of being recomputed. Under
  pressure the host goes to the calls back soonest, and a context larger than one
  iteration's budget waits for the link rather than losing its rest (`_link_wait_waste`).
* **Cheapest preemption.** When decodes outgrow the free blocks the engine must preempt a
  running request; vLLM takes the one admitted last, we take the one with the smallest GPU
  footprint: it frees a block for the least recomputation (usually a request just admitted).
* **Admission with room to grow** (`admission`). vLLM admits whatever fits now and preempts
  when the decodes outgrow the memory; we keep free blocks for part of the running requests'
  predicted growth, which all but ends preemption (and its recompute) under load, and for
  paused requests whose calls are likely to end within 100 iterations' fixed cost (1 s on
  GPT-J; `return_horizon_iterations`).
* **Memory-time ranking.** Like LAMPS, waiting requests are ranked by the predicted KV area
  until their next call returns (short, light work first), which cuts the median, with
  LAMPS's starvation guard on top (`ranking.AreaRankedPolicy`, shared with `lamps`). Unlike
  LAMPS the key is fixed when the request enters its queue, under the handling this policy
  expects (preserve or discard): re-keyed every iteration as LAMPS keys (`variants.Rekeyed`)
  it kept the simulator's rates with a lower p99 past each edge, but on the real engine it
  made new conversations wait (at 5 sessions/s, in-process, median 15-17 against 11.3-11.5
  ms/token and mean TTFT 0.90-0.96 against 0.42-0.61 s; docs/policies.md). The virtual
  deadline of earlier versions (arrival + beta * area / KV capacity) is gone: off by default
  since it made a large pool's queue nearly FCFS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from operator import attrgetter, or_

from interlude.policy import admission, slots, waste
from interlude.policy.base import (
    call_key,
    paused_on_gpu,
    swap_out_budget_blocks,
)
from interlude.policy.interlude_config import InterludeConfig
from interlude.policy.predict import PAST
from interlude.policy.profile import Profile
from interlude.policy.ranking import AreaRankedPolicy
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    RequestView,
    SchedulerView,
    Traits,
)

_GPU, _CPU = attrgetter("gpu_tokens"), attrgetter("cpu_tokens")

# (request, C_other, under pressure) -> (swap waste, discard waste or 0.0).
_Wastes = Callable[[RequestView, int, bool], tuple[float, float]]


class InterludePolicy(AreaRankedPolicy):
    name = "interlude"
    # The engine's vLLM batching: every prefill in chunks of S, several a step. In the
    # simulator (InferCept trace, A100 profile, 6-9/s) it sustained the same rates as S in
    # total a step, with first tokens 21-30 % sooner on average at 6-7/s (docs/simulator.md).
    # InferCept's and LAMPS's steps, S tokens in all (vLLM's `max_num_batched_tokens` = S on
    # the engine): with up to `max_batched_tokens` a step (vLLM v1's own), steps of 8,192
    # tokens (208 ms on an H100) stretched every running request's memory-time at the bound,
    # and the shared trace on `llama3-8b-h100` held 28 req/s by the tail rule, not 30
    # (docs/policies.md, "One batching, one ranking").
    traits = Traits(batch_mode=BatchMode.CHUNKED)
    description = (
        "Min-waste handling with learned per-tool residual call time and a ski-rental "
        "guard, pressure-aware discard, swaps priced at their synchronous waste, "
        "smallest-footprint preemption, admission that keeps room for decode growth, "
        "memory-time ranking keyed at queue entry with starvation guard, InferCept's "
        "S-token steps."
    )

    # False: work every waste out straight from `waste` (tests compare the two).
    cache_terms = True

    def __init__(self, profile: Profile, config: InterludeConfig | None = None) -> None:
        super().__init__(profile)
        self.config = config or InterludeConfig()
        n = self.config.return_horizon_iterations
        # Seconds: the horizon `_return_reserve` asks the predictor about (None: no reserve).
        self.return_horizon_s = None if n is None else n * profile.fwd_c_ms / 1000.0
        # request -> (GPU tokens, context, its own terms of the wastes): see `_wastes`.
        self._terms: dict[str, tuple[int, int, float, float, float]] = {}
        # request -> its context when its last segment ended (to learn calls' returns).
        self._pause_ctx: dict[str, int] = {}

    def preemption_order(self, running: Sequence[RequestView]) -> list[RequestView]:
        """Smallest GPU footprint first: the cheapest recompute that frees a block. Promoted
        (starving) requests go last."""
        return sorted(
            running,
            key=lambda r: (
                self.starvation.promotion(r.request_id) is not None,
                r.gpu_tokens,
                -r.queue_time,
            ),
        )

    # --- the queue's keys (priced at entry: `AreaRankedPolicy.queue_key`) ----------------
    def entry_strategy(self, r: RequestView) -> Handling:
        """Preserve if the predicted call wastes less kept than recomputed, else discard."""
        p = self.profile
        c = round(r.context_tokens + self.tokens_ahead(r))
        keep = waste.preserve(p, self.predictor.duration(r.kind), c)
        conv = waste.chunked_discard(p, c, self.running_context, self.running_tokens)
        return Handling.PRESERVE if keep <= conv else Handling.DISCARD

    # --- handling ------------------------------------------------------------------------
    def memory_pressure(self, view: SchedulerView) -> bool:
        """True when the queues ask for more GPU blocks than are free."""
        return self._pressure_margin(view) < 0

    def _pressure_margin(self, view: SchedulerView) -> int:
        """Free GPU blocks minus what the queues ask for (negative: pressure). A waiting
        request asks for its pending tokens' blocks less those others hold already
        (`SchedulerView.shared_blocks`)."""
        p = view.profile
        free = view.free_gpu_blocks
        shared = view.shared_blocks
        # Decode growth: one block per running request is the next iteration's worst case.
        want = len(view.running)
        for r in view.swap_queue:
            if want > free:
                return free - want  # stop early: a long queue must not cost a full scan
            want += p.blocks(r.cpu_tokens)
        for r in view.waiting:
            if want > free:
                return free - want
            want += max(0, p.blocks(r.pending_tokens) - shared.get(r.request_id, 0))
        return free - want

    def _pressure_review(self, view: SchedulerView, margin: int) -> int:
        """The earliest iteration at which growth alone could use up a margin of free blocks.

        Each iteration, every decode may take a block and a prefill chunk up to S tokens.
        """
        p = view.profile
        per_iteration = len(view.running) + -(-p.saturation_tokens // p.block_size)
        return view.iteration + 1 + margin // per_iteration

    def decide(self, view: SchedulerView) -> Decision:
        requeue, review_iteration = self.observe(view)
        kv, review_at, pressure_review = self._handle_paused(view)
        if pressure_review is not None:
            review_iteration = min(review_iteration or pressure_review, pressure_review)
        if self.config.admission == "reserve-dynamic":
            limit = admission.reserve_dynamic_limit(
                view.profile,
                view.free_gpu_blocks - math.ceil(self._return_reserve(view)),
                view.running,
                view.waiting,
                self.predictor.segment_tokens,
                view.shared_blocks,
            )
        else:
            limit = admission.admit_limit(
                view.profile,
                view.free_gpu_blocks,
                view.running,
                view.waiting,
                self.predictor.segment_tokens,
                self.config.headroom,
                self._return_reserve(view),
                view.waiting_holds_kv is not False,
                view.shared_blocks,
            )
        return Decision(
            kv=kv,
            requeue=requeue,
            review_at=review_at,
            review_iteration=review_iteration,
            admit_limit=limit,
        )

    def _return_reserve(self, view: SchedulerView) -> float:
        """Blocks `admit_limit` keeps free, beyond the running requests' growth, for paused
        requests that may be back soon and for the swap queue (`return_horizon_s`)."""
        h = self.return_horizon_s
        if h is None or not view.waiting:
            return 0.0  # admit_limit sets no limit then: nothing to work out
        p = view.profile
        pred = self.predictor
        # (call key, kind) -> (share of such calls lasting at most h, tokens added on return).
        per_kind: dict[tuple[str, str], tuple[float, float]] = {}
        tokens = 0.0
        # Discarded requests queue again on return, ranked like any other: passed over in C
        # (most paused requests under load; token counts are never negative).
        held: Iterable[RequestView] | None = view.paused_with_kv
        if held is None:
            held = compress(view.paused, map(or_, map(_GPU, view.paused), map(_CPU, view.paused)))
        for r in held:
            k = per_kind.get(key := (call_key(r), r.kind))
            if k is None:
                k = per_kind[key] = (
                    pred.fraction_within(key[0], h),
                    pred.return_tokens(r.kind) + pred.segment_tokens(r.kind),
                )
            if k[0]:
                tokens += k[0] * (r.cpu_tokens + k[1])
        reserve = self.config.headroom * tokens / p.block_size
        for r in view.swap_queue:
            reserve += p.blocks(r.cpu_tokens + r.pending_tokens)
        return reserve

    def _handle_paused(
        self, view: SchedulerView
    ) -> tuple[tuple[KVAction, ...], float | None, int | None]:
        """KV actions, and when to look again: a time, and an iteration (pressure may start)."""
        margin = self._pressure_margin(view)
        pressure = margin < 0
        # Without pressure, decode growth may create it: look again before it can.
        pressure_review = (
            None if pressure or not view.paused else self._pressure_review(view, margin)
        )
        budget = swap_out_budget_blocks(view)
        if not pressure:
            idle, review = self._quiet(view, budget, pressure_review)
            actions: tuple[KVAction, ...] = ()
            review_at: float | None = None
            if not idle:
                actions, review_at, review = self._decide_paused(
                    view, False, budget, pressure_review
                )
            remaining = self.predictor.remaining_duration
            return slots.free_slots(view, actions, remaining, budget), review_at, review
        return self._decide_paused(view, pressure, budget, pressure_review)

    def _quiet(
        self, view: SchedulerView, budget: int, pressure_review: int | None
    ) -> tuple[bool, int | None]:
        """Without pressure: whether nothing is to be done yet, and the iteration to look again
        at. Nothing is when no swap is free, or while memory is mostly free: no swap until
        decode growth could fill it past the swap-ahead share."""
        if budget == 0:
            return True, pressure_review
        ahead = view.free_gpu_blocks - math.ceil(
            (1 - self.config.swap_ahead_usage) * view.profile.gpu_blocks
        )
        if ahead < 0:
            return False, None
        review = self._pressure_review(view, ahead)
        return True, review if pressure_review is None else min(review, pressure_review)

    def _decide_paused(
        self, view: SchedulerView, pressure: bool, budget: int, pressure_review: int | None
    ) -> tuple[tuple[KVAction, ...], float | None, int | None]:
        """Each paused request's KV action, most waste first, within the swap `budget`; when to
        look again at what is kept."""
        p, now = view.profile, view.now
        wastes = self._wastes(view) if self.cache_terms else self._wastes_reference(view)
        actions: list[KVAction] = []
        review_at: float | None = None
        # Host blocks not yet promised: to this iteration's swaps, or to blocks kept for the
        # link's next iterations (`link_ahead`, in the order the link will take them).
        host_left = view.free_cpu_blocks
        link_ahead = 0
        for keep, _, r in self._ranked_paused(view, pressure):
            assert r.paused_at is not None
            blocks = p.blocks(r.gpu_tokens)
            swap_cost, conv = wastes(r, view.running_context, pressure)
            wants_swap = keep > swap_cost
            if budget > 0 and wants_swap:
                n = min(blocks, budget)
                budget -= n
                host_left -= n
                actions.append(KVAction(r.request_id, Handling.SWAP, n))
                blocks -= n
            if blocks == 0:
                continue
            # What is kept is looked at again when its expected waste may have grown past
            # a conversion cost (the swap's, while host memory has room, or under pressure
            # the recompute's).
            cost = swap_cost if view.free_cpu_blocks else math.inf
            if pressure:
                paid = (now - r.paused_at) * r.context_tokens * p.kv_bytes_per_token
                if keep > conv or paid > conv:  # paid: waste.preserve so far
                    if wants_swap and blocks <= host_left - link_ahead:
                        wait = self._link_wait_waste(r, link_ahead + blocks)
                        if wait + swap_cost < conv:
                            # The link takes it within a few iterations: keep it until then.
                            link_ahead += blocks
                            pressure_review = view.iteration + 1
                            continue
                    actions.append(KVAction(r.request_id, Handling.DISCARD, blocks))
                    continue
                cost = min(cost, conv)
            elif cost == math.inf:
                continue
            t = self._kept_review(view, r, cost, conv if pressure else None)
            if t is not None:
                review_at = t if review_at is None else min(review_at, t)
        return tuple(actions), review_at, pressure_review

    def _ranked_paused(
        self, view: SchedulerView, pressure: bool
    ) -> list[tuple[float, float, RequestView]]:
        """The paused requests holding GPU KV as (expected preserve waste, expected time left
        in the call, request), in the order they get the swap budget and the host."""
        m = view.profile.kv_bytes_per_token
        remaining_duration = self.predictor.remaining_duration
        scored: list[tuple[float, float, RequestView]] = []
        # Most paused requests hold no GPU KV once the memory is full: filter in one pass.
        for r in [r for r in paused_on_gpu(view) if r.paused_at is not None]:
            assert r.paused_at is not None
            remaining = remaining_duration(call_key(r), view.now - r.paused_at)
            scored.append((remaining * r.context_tokens * m, remaining, r))
        if pressure:
            # Soonest back first: host memory is then the scarce part, and a copy there saves
            # one recompute however long the call, while it holds the host for the whole
            # call; so the host goes to the calls that give it back soonest, and the longest
            # calls, whose recompute is the smallest share of their pause, are dropped.
            scored.sort(key=lambda s: (s[1], s[2].arrival))
        else:
            # Highest expected preserve waste first: it gains the most from the swap budget.
            scored.sort(key=lambda s: (-s[0], s[2].arrival))
        return scored

    def _kept_review(
        self, view: SchedulerView, r: RequestView, cost: float, conv: float | None
    ) -> float | None:
        """When to look again at `r`, kept on the GPU: when its expected waste may have grown
        past `cost`, or under pressure (`conv`: the recompute's cost) when the paid waste
        reaches `conv` (the ski-rental guard); None if not in the future."""
        assert r.paused_at is not None
        per_second = r.context_tokens * view.profile.kv_bytes_per_token
        elapsed = view.now - r.paused_at
        rise = self.predictor.residual_rises_at(call_key(r), elapsed, cost / per_second)
        if conv is not None:
            paid_cross = conv / per_second + PAST
            rise = paid_cross if rise is None else min(rise, paid_cross)
        if rise is not None and r.paused_at + rise > view.now:
            return r.paused_at + rise
        return None

    def _link_wait_waste(self, r: RequestView, blocks_ahead: int) -> float:
        """What keeping `r` on the GPU wastes until the swap link has copied `blocks_ahead`
        blocks (those promised before it, then its own): its memory for that long.

        Under pressure a long context whose copy does not fit one iteration's swap budget
        would otherwise be discarded for its rest, and recomputed at its resume: on agent
        programs (contexts of 10-30k tokens, llama3-8b-h100) a whole context leaves the GPU
        over the link in tens of milliseconds, while its recompute costs seconds of every
        running request's memory (docs/policies.md)."""
        p = self.profile
        return p.t_swap(blocks_ahead * p.block_size) * r.context_tokens * p.kv_bytes_per_token

    # --- the wastes of one paused request ----------------------------------------------------
    def _wastes_reference(self, view: SchedulerView) -> _Wastes:
        """(synchronous swap waste, chunked-discard waste or 0.0 unless under pressure) of a
        paused request, straight from `waste`."""
        p = view.profile
        discard_waste = waste.chunked_discard_of(p, view.running_context, view.running_tokens)
        own = self.config.budgeted_swap_price

        def wastes(r: RequestView, c_other: int, pressure: bool) -> tuple[float, float]:
            if pressure and own:
                return waste.budgeted_swap_own(p, r.gpu_tokens), discard_waste(r.context_tokens)
            swap = waste.sync_swap(p, r.gpu_tokens, c_other + r.gpu_tokens)
            return swap, discard_waste(r.context_tokens) if pressure else 0.0

        return wastes

    def _wastes(self, view: SchedulerView) -> _Wastes:
        """`_wastes_reference`, fast: it runs for every paused request at every iteration.

        A paused request's GPU tokens and context change only when it is swapped or resumes,
        so the terms that depend on them alone (2 * T_swap(C_gpu) of `waste.sync_swap`,
        T_fwd(C_i) * C_i / 2 and a * C_i of `waste.chunked_discard_of`) are kept per request
        until they do; the products keep the equations' order of operations, so the numbers
        are those of `_wastes_reference` (a test runs both).
        """
        p = view.profile
        m = p.kv_bytes_per_token
        a = p.fwd_a_ms / 1000.0
        terms = self._terms
        own = self.config.budgeted_swap_price

        def wastes(r: RequestView, c_other: int, pressure: bool) -> tuple[float, float]:
            gpu, c_i = r.gpu_tokens, r.context_tokens
            t = terms.get(r.request_id)
            if t is None or t[0] != gpu or t[1] != c_i:
                t = (gpu, c_i, 2 * p.t_swap(gpu), p.t_fwd(c_i) * c_i / 2, a * c_i)
                terms[r.request_id] = t
            if not pressure:
                return t[2] * (c_other + gpu) * m, 0.0
            swap = t[2] * gpu * m if own else t[2] * (c_other + gpu) * m
            return swap, (t[3] + t[4] * c_other) * m

        return wastes

    def on_segment(self, req: RequestView, gen_tokens: int) -> None:
        super().on_segment(req, gen_tokens)
        # The context grew since the last segment ended by the call's returned tokens and
        # this segment's: learn the former (for `_return_reserve`).
        before = self._pause_ctx.get(req.request_id)
        if before is not None:
            returned = req.context_tokens - gen_tokens - before
            self.predictor.observe_return(req.kind, max(0, returned))
        self._pause_ctx[req.request_id] = req.context_tokens

    def on_resume(self, req: RequestView, now: float, duration: float) -> None:
        super().on_resume(req, now, duration)  # the kind's calls: to rank before a call
        if (key := call_key(req)) != req.kind:
            self.predictor.observe_duration(key, duration)
        self._terms.pop(req.request_id, None)

    def on_finish(self, req: RequestView, now: float) -> None:
        super().on_finish(req, now)
        self._terms.pop(req.request_id, None)
        self._pause_ctx.pop(req.request_id, None)
