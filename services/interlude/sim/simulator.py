"""An iteration-level discrete-event simulator of a vLLM-like engine with tool calls.

Each step shows the policy a `SchedulerView`, applies its `Decision` (KV actions, queue order),
swaps in, forms a batch, and advances the virtual clock by T_fwd(batch tokens) (plus a stall for
synchronous swaps). A decode-only step with nothing else going on is identical to the ones after
it until the next event (an arrival, a tool's return, a segment's end, a memory boundary, or the
policy's review time), so one step covers all of them at once.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from interlude.policy.base import Policy
from interlude.policy.batching import budgeted_per_step
from interlude.policy.profile import Profile
from interlude.policy.types import Decision, Phase, SchedulerView, SwapMode
from interlude.sim.accounting import account_step
from interlude.sim.batch import Batch, Batcher
from interlude.sim.config import SimConfig, SimulationError
from interlude.sim.integrity import check_engine
from interlude.sim.kv import KVBook, OutOfBlocks
from interlude.sim.metrics import Accounting, RunMetrics, summarize
from interlude.sim.ranked_queue import PREEMPTED, RankedQueue
from interlude.sim.request import SimRequest
from interlude.sim.running import Running
from interlude.sim.shared_heads import own_arrivals
from interlude.sim.skip import chunk_repeats, extend_chunk, memory_limit
from interlude.sim.swapping import Loads, SwapIns, apply_kv, swap_in
from interlude_workloads import Arrival

# An arrival or a call's return this close past the clock is due now. The clock is a float sum
# (a skipped run of k iterations adds k x dt where single steps add dt k times), and an event
# that falls on an iteration boundary (a call whose duration is a whole number of iterations)
# must be seen at the same iteration either way: seconds, far below any iteration.
EVENT_EPS = 1e-9


class Simulator:
    def __init__(
        self,
        profile: Profile,
        policy: Policy,
        arrivals: Sequence[Arrival],
        config: SimConfig | None = None,
        rate: float = 0.0,
        observer: Callable[[Simulator, Batch, int], None] | None = None,
    ) -> None:
        """`observer(sim, batch, k)` sees every step's batch before its tokens are emitted
        (k identical iterations); tests use it to check per-iteration invariants."""
        self.p = profile
        self.policy = policy
        self.config = config or SimConfig()
        self.rate = rate
        self.observer = observer
        self.kv = KVBook(profile, policy.traits.prefix_cache)
        self.batcher = Batcher(profile, policy, self.kv)
        capacity = profile.gpu_blocks * profile.block_size
        for a in arrivals:
            if a.request.max_context > capacity:
                raise SimulationError(
                    f"request {a.request.request_id!r} reaches {a.request.max_context} tokens of "
                    f"context; profile {profile.name!r} holds {capacity} on the GPU"
                )
        # Heads many requests share are held once (with a prefix cache).
        ordered, pinned = own_arrivals(arrivals, profile.block_size, policy.traits.prefix_cache)
        self.kv.pin(pinned)
        self.requests = [SimRequest(a.arrival_id, a.request, a.time_s, h) for a, h in ordered]
        self._next_arrival = 0
        self.running = Running(profile.block_size)
        self.waiting = RankedQueue()
        self.swap_queue = RankedQueue()
        self.loads = Loads()  # host copies coming back, still in `swap_queue`
        self.paused: dict[str, SimRequest] = {}
        self._returns: list[tuple[float, int, SimRequest]] = []
        self._entering: list[tuple[RankedQueue, SimRequest]] = []
        self._seq = 0
        self._review_iteration: int | None = None  # of the last decision
        self.open = 0  # arrived and not finished
        self.now = 0.0
        self.iteration = 0
        self.acc = Accounting()
        self.finish_log: list[str] = []  # request ids in finishing order (tests use it)
        # Seconds from a call's return to its turn's first token, one per timed resume.
        self.resume_waits: list[float] = []
        # A cluster's hooks (`sim/cluster.py`); a lone engine has none. `handoff(sim, r)`: a
        # prefill engine's job computed its prompt and leaves, its KV freed here. `reprefill(
        # sim, r)`: a resumed request holding no KV may leave to be prefilled elsewhere (True:
        # it left). `bound`: no request arrives from outside before this time.
        self.handoff: Callable[[Simulator, SimRequest], None] | None = None
        self.reprefill: Callable[[Simulator, SimRequest], bool] | None = None
        self.bound = math.inf

    # --- the loop ------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> RunMetrics:
        horizon = self.config.horizon_s
        last_report = 0.0
        while True:
            self._handle_events()
            if self.open == 0 and self._next_arrival == len(self.requests):
                break
            if horizon is not None and self.now >= horizon:
                break
            self._advance()
            if progress is not None and self.now - last_report >= 10.0:
                last_report = self.now
                progress(self.now)
        arrived = self.requests[: self._next_arrival]
        return summarize(
            self.policy.name, self.rate, arrived, self.now, self.acc, self.p.gpu_kv_bytes
        )

    def _busy(self) -> bool:
        # Paused KV on the GPU is the policy's to handle even when nothing else runs.
        busy = self.running or self.waiting or self.swap_queue or self._entering
        return bool(busy or self.kv.paused_gpu)

    def _advance(self) -> None:
        if self._busy():
            self._step()
        else:
            self._idle_until(self._next_event_time(None))
        if self.config.check_integrity:
            self.check_integrity()

    # --- in a cluster (`sim/cluster.py` interleaves engines on one clock) ----------------
    def next_time(self) -> float:
        """When this engine acts next: now while it has work, else at its next own event
        (an arrival or a call's return); inf when it has nothing at all."""
        if self._busy():
            return self.now
        t = self._next_own_event(None)
        return math.inf if t is None else t

    def next_return(self) -> float:
        """When this engine's next paused call returns; inf when none is out."""
        return self._returns[0][0] if self._returns else math.inf

    def set_policy(self, policy: Policy) -> None:
        """Run `policy` from now on; only while the engine holds no request (a cluster's
        engine changing role)."""
        if self.open or self.paused:
            raise SimulationError("an engine changes policy only when it holds no request")
        self.policy = policy
        self.batcher = Batcher(self.p, policy, self.kv)
        self.kv.use_prefix_cache(policy.traits.prefix_cache)
        self._review_iteration = None

    def tick(self) -> None:
        """One pass of `run`'s loop: the events due, then one step, or idling to the next
        event (never past `bound`)."""
        self._handle_events()
        if self.open or self._next_arrival < len(self.requests) or self._returns:
            self._advance()

    def take(self, r: SimRequest, at: float) -> None:
        """`r` joins this engine at `at` (not before its clock): into the swap queue when it
        brings a host copy of its KV, else the waiting queue. Its `arrival` is kept."""
        if at > self.now:
            self._idle_until(at)
        self.open += 1
        r.phase = Phase.SWAP_QUEUED if r.cpu_tokens else Phase.WAITING
        self._enqueue(self.swap_queue if r.cpu_tokens else self.waiting, r)

    def _step(self) -> None:
        view, decision, fresh_limit = self._decide()
        out = apply_kv(decision, view, self.paused, self.kv, self.policy)
        self._requeue(decision)
        sync = self.policy.traits.swap_mode is SwapMode.SYNC
        # Swap-ins copy within what the iteration's swap-outs left of the budget, as the
        # engine's scheduler plans its saves first (`_load_budget`).
        budget = max(0, view.swap_budget_tokens - out.blocks * self.p.block_size)
        ins = swap_in(self.swap_queue, self.running, self.kv, self.p, budget, sync, self.loads)
        swapped_out, swapped_in, stall = out.tokens, ins.tokens, out.stall_s + ins.stall_s
        batch = self.batcher.form(
            self.running,
            self.waiting,
            self.now,
            self.iteration,
            decision.hold,
            decision.admit_limit,
            self._parked_slots(),
            ins.reserve,
        )
        for r in batch.preempted:  # vLLM puts preempted requests back at the queue's head
            self.waiting.push(r, (), PREEMPTED)
        if batch.tokens == 0 and swapped_in + swapped_out == 0 and stall == 0:
            self._nothing_ran(batch, ins, decision)
            return
        dt = self.p.t_fwd(batch.tokens)
        if self.policy.traits.swap_mode is SwapMode.BUDGETED:
            dt = max(dt, self.p.t_swap(swapped_in + swapped_out))
        dt += stall
        # A load under way changes the next iterations (copies, then a request joining), and
        # one that joined may change the policy's next decision.
        jumps = fresh_limit and not decision.kv and not self.loads and not ins.joined
        k = self._repeats(batch, dt, decision) if jumps and stall == 0 else 1
        contended = bool(self.waiting or self.swap_queue)
        account_step(self.acc, batch, dt, k, stall, self.kv, self.p.block_bytes, contended)
        if k > 1 and batch.chunks:
            extend_chunk(batch, self.kv, k - 1)
        if self.observer is not None:
            self.observer(self, batch, k)
        t0 = self.now
        self.now += k * dt
        self.iteration += k
        self._complete(batch, k, t0 + dt)

    def _decide(self) -> tuple[SchedulerView, Decision, bool]:
        """The policy's decision for this iteration, with the queues re-keyed and the entering
        requests ranked as it asks; and whether its admission limit still holds (False: one
        of the entering requests may now head the queue, so the next iteration decides
        afresh)."""
        if self._review_iteration is not None and self._review_iteration <= self.iteration:
            # The policy may promote a queued request now (a starvation guard): a promoted
            # request's key no longer carries its strategy, so the re-rank left for later must
            # happen first, with the batch state it was asked for (LAMPS keeps the strategy of
            # its last unpromoted rank).
            self.waiting.settle()
        view = self._view()
        decision = self.policy.decide(view)
        self._review_iteration = decision.review_iteration
        if self.policy.traits.rescore_queued:  # keys follow the batch state (LAMPS)
            keys = self.policy.rank_keys  # queue_keys, maybe as one array
            now = self.now
            self.swap_queue.rekey(lambda rs, rows=None: keys(rs, now, rows))
            # The waiting queue's order is read when the batcher admits from it: re-ranked
            # then, with this iteration's keys, and not in iterations that admit nothing from
            # its ranked part (keys must not depend on how often they are asked, so the
            # admissions are the same; a view may show the order of the last re-rank).
            self.waiting.rekey_later(lambda rs, rows=None: keys(rs, now, rows))
        fresh_limit = decision.admit_limit is None or not self._entering
        self._rank_entering()
        return view, decision, fresh_limit

    def _nothing_ran(self, batch: Batch, ins: SwapIns, decision: Decision) -> None:
        """An iteration that computed and copied nothing: its reserve goes back, and time
        passes only when the simulation is blocked on memory held by paused requests."""
        self.kv.gpu_free += batch.reserved_blocks
        if batch.preempted:
            return  # the preemption freed memory: schedule again at once, no time passes
        if ins.blocked is not None and not self.running:
            # A loaded copy cannot join and nothing runs to free memory: give its blocks
            # back and load it again later, as the engine's scheduler unstalls.
            self.loads.abandon(ins.blocked, self.kv)
            return
        # Blocked on memory held by paused requests: wait for something to change.
        self._idle_until(self._next_event_time(decision))

    def _repeats(self, batch: Batch, dt: float, decision: Decision) -> int:
        """How many identical iterations `batch` runs before anything changes (1: none can
        be skipped), for an iteration with no KV moves, no loads and no stall."""
        if batch.preempted:
            return 1
        if not batch.chunks:
            return self._jump_length(batch, dt, decision)
        chunk = chunk_repeats(batch, self.p, self.policy.traits.batch_mode)
        return min(self._jump_length(batch, dt, decision), chunk) if chunk else 1

    # --- events --------------------------------------------------------------------------
    def _handle_events(self) -> None:
        while self._next_arrival < len(self.requests):
            r = self.requests[self._next_arrival]
            if r.arrival > self.now + EVENT_EPS:
                break
            self._next_arrival += 1
            self.open += 1
            self._enqueue(self.waiting, r)
        while self._returns and self._returns[0][0] <= self.now + EVENT_EPS:
            _, _, r = heapq.heappop(self._returns)
            self._resume(r)

    def _next_event_time(self, decision: Decision | None) -> float | None:
        t = self._next_own_event(decision)
        if self.now < self.bound < math.inf and (t is None or self.bound < t):
            return self.bound
        return t

    def _next_own_event(self, decision: Decision | None) -> float | None:
        times = []
        if self._next_arrival < len(self.requests):
            times.append(self.requests[self._next_arrival].arrival)
        if self._returns:
            times.append(self._returns[0][0])
        review = decision.review_at if decision is not None else None
        if review is not None and review > self.now:
            times.append(review)
        return min(times) if times else None

    def _idle_until(self, t: float | None) -> None:
        if t is None:
            raise SimulationError(
                f"deadlock at t={self.now:.3f}s: running={len(self.running)} "
                f"waiting={len(self.waiting)} swap={len(self.swap_queue)} "
                f"paused={len(self.paused)} free_gpu={self.kv.gpu_free}; head: "
                f"{self.waiting.items[:1] or self.swap_queue.items[:1]}"
            )
        if self.config.horizon_s is not None:
            t = min(t, self.config.horizon_s)
        gap = t - self.now
        held = gap * self._paused_gpu_bytes()
        self.acc.waste_preserve += held
        if self.waiting or self.swap_queue:
            self.acc.waste_contended += held
        self.now = t

    def _resume(self, r: SimRequest) -> None:
        call = r.segments[r.segment].call
        assert call is not None  # only paused requests have returns scheduled
        r.tool_time += call.duration_s
        self.policy.on_resume(r, self.now, call.duration_s)
        del self.paused[r.request_id]
        self.kv.unpause(r)
        r.segment += 1
        r.generated_tokens = 0
        r.calls_done += 1
        r.paused_at = None
        answer = call.return_tokens + self.config.answer_markup_tokens
        r.context_tokens += answer
        r.pending_tokens += answer
        r.output_tokens += call.return_tokens
        r.resumed_at = self.now
        held = r.gpu_tokens + r.cpu_tokens
        if self.reprefill is not None and held == 0 and self.reprefill(self, r):
            self.open -= 1  # it left to be prefilled on another engine
            return
        if r.cpu_tokens > 0:
            r.phase = Phase.SWAP_QUEUED
            if r.gpu_tokens and self.policy.traits.swap_mode is SwapMode.SYNC:
                self.kv.release_stayed(r)  # the engine's rule: back like a whole swap
            self._enqueue(self.swap_queue, r)
        elif r.gpu_tokens > 0:
            r.phase = Phase.RUNNING
            if r.pending_tokens == 0:  # decodes at once: no turn's first token to time
                r.resumed_at = None
            self.running.add(r, prefilling=r.pending_tokens > 0)
        else:
            r.phase = Phase.WAITING
            self._enqueue(self.waiting, r)

    def _enqueue(self, queue: RankedQueue, r: SimRequest) -> None:
        """`r` enters `queue`; it is ranked after the policy's next look at the batch.

        Ranking waits for that look so the policy ranks with the batch state of the moment,
        whether or not the iterations before were skipped in one step.
        """
        r.queue_time, r.queue_iteration = self.now, self.iteration
        self._entering.append((queue, r))

    def _rank_entering(self) -> None:
        for queue, r in self._entering:
            queue.push(r, self.policy.queue_key(r, self.now))
        self._entering.clear()

    # --- policy --------------------------------------------------------------------------
    def _with_entering(self, queue: RankedQueue) -> list[SimRequest]:
        """The queue as the policy sees it: ranked requests, then those not yet ranked."""
        if not self._entering:
            return queue.items
        new = [r for q, r in self._entering if q is queue]
        return queue.items + new if new else queue.items

    def _view(self) -> SchedulerView:
        running = list(self.running.all.values())
        step = self.batcher.step if budgeted_per_step(self.batcher.mode) else None
        tokens, context = self.running.load(self.p, step)
        return SchedulerView(
            now=self.now,
            iteration=self.iteration,
            profile=self.p,
            running=running,
            waiting=self._with_entering(self.waiting),
            swap_queue=self._with_entering(self.swap_queue),
            paused=list(self.paused.values()),
            paused_with_kv=list(self.kv.paused_kv.values()),
            waiting_holds_kv=False,  # preemption and discards free a request's GPU KV
            free_gpu_blocks=self.kv.gpu_free,
            free_cpu_blocks=self.kv.cpu_free,
            running_tokens=tokens,
            running_context=context,
            swap_budget_tokens=self.p.swap_budget_tokens(tokens),
        )

    def _requeue(self, d: Decision) -> None:
        for rid in d.requeue:
            for queue in (self.waiting, self.swap_queue):
                r = next((q for q in queue if q.request_id == rid), None)
                if r is not None:
                    queue.remove(r)
                    queue.push(r, self.policy.queue_key(r, self.now))

    # --- time ----------------------------------------------------------------------------
    def _jump_length(self, batch: Batch, dt: float, d: Decision) -> int:
        k = self.config.max_jump
        t_next = self._next_event_time(d)
        if t_next is not None:
            k = min(k, max(1, math.ceil((t_next - EVENT_EPS - self.now) / dt)))
        if d.review_iteration is not None:
            k = min(k, max(1, d.review_iteration - self.iteration))
        if self.config.horizon_s is not None:
            k = min(k, max(1, math.ceil((self.config.horizon_s - self.now) / dt)))
        if batch.decodes:
            k = min(k, self.running.decoding.min_left())
        if batch.decodes or batch.chunks:
            k = memory_limit(batch, self.kv, k)
        return k

    def _parked_slots(self) -> int:
        """Paused requests that hold `max_num_seqs` slots: those with KV on the GPU (the
        engine's rule: vLLM counts every parked session, ours only those whose KV stayed).
        Counted only when the cap could bind (`KVBook` keeps the count)."""
        if len(self.running) + len(self.paused) < self.p.max_num_seqs:
            return 0
        return self.kv.paused_holders

    def _paused_gpu_bytes(self) -> int:
        return self.kv.paused_gpu * self.p.block_bytes

    # --- results of an iteration ---------------------------------------------------------
    def _complete(self, batch: Batch, k: int, first_end: float) -> None:
        kv = self.kv
        kv.gpu_free += batch.reserved_blocks
        if batch.decodes:
            # Every decode gains k tokens: the cohort counts it once (`running.py`). Their blocks
            # were reserved by the batcher or checked by the memory limit of the jump; decodes
            # are RUNNING, so the paused-block count is untouched.
            decoding = self.running.decoding
            grown = decoding.growth(k)
            if grown > kv.gpu_free:
                raise OutOfBlocks(f"decodes need {grown} GPU blocks, {kv.gpu_free} free")
            kv.gpu_free -= grown
            for r in decoding.advance(k):
                self._end_segment(r)
        for r, _, _ in batch.chunks:
            if r.pending_tokens == 0 and r.phase is Phase.RUNNING:
                self._emit_first(r, first_end)

    def _emit_first(self, r: SimRequest, at: float) -> None:
        """`r` finished its prefill at `at` and sampled a token (a prefill engine's job
        leaves instead: the engine it goes to samples)."""
        if self.handoff is not None:
            self.running.remove(r)
            self.kv.release(r)
            self.open -= 1
            self.policy.on_finish(r, self.now)  # finished here
            self.handoff(self, r)
            return
        if r.resumed_at is not None:
            self.resume_waits.append(at - r.resumed_at)
            r.resumed_at = None
        self.kv.set_gpu(r, r.gpu_tokens + 1)
        r.context_tokens += 1
        r.generated_tokens += 1
        r.output_tokens += 1
        if r.first_token_at is None:
            r.first_token_at = at
        if r.generated_tokens >= r.target:
            self._end_segment(r)
        else:
            self.running.prefill_done(r)

    def _end_segment(self, r: SimRequest) -> None:
        """`r` generated its segment: it pauses at the segment's call, or finishes."""
        self.policy.on_segment(r, r.generated_tokens)
        self.running.remove(r)
        call = r.segments[r.segment].call
        if call is None:
            r.phase, r.finished_at = Phase.FINISHED, self.now
            self.kv.release(r)
            self.open -= 1
            self.finish_log.append(r.request_id)
            self.policy.on_finish(r, self.now)
            return
        r.phase, r.paused_at, r.tool = Phase.PAUSED, self.now, call.tool
        self.kv.pause(r)
        self.paused[r.request_id] = r
        self._seq += 1
        heapq.heappush(self._returns, (self.now + call.duration_s, self._seq, r))
        self.policy.on_pause(r, self.now)

    def check_integrity(self) -> None:
        """Block and token conservation, and what the view promises its policy."""
        check_engine(self)
