"""InterludeScheduler: vLLM's v1 scheduler, with the policy deciding what happens to parked
streaming-input sessions and in which order queued requests run.

vLLM parks a streaming-input request that ends a turn (`WAITING_FOR_STREAMING_REQ`) with all its
blocks, forever: Preserve for everyone. Here, once per `schedule()`, the policy sees a
`SchedulerView` (the same one the simulator builds) and its `Decision` is applied:
* DISCARD frees the parked request's GPU blocks now. Its block hashes stay, so on resume the
  prefix cache may still find them (counted as restored); the rest is recomputed by chunked
  prefill, in chunks no larger than the profile's S while other requests run (EngineConfig
  sets vLLM's `long_prefill_token_threshold`).
* SWAP copies the next blocks to the host pool through `HostSwapConnector`, within the budget,
  and frees them after the step that copied them (`moves.py`). On resume the host copy comes
  back as an asynchronous connector load, a share of the step's swap budget per step, and the
  request runs from the step after its last block (`swap.py`).
* Queues are `PolicyQueue`s ranked by `Policy.queue_key` (a parked request sits dormant in
  `kv_holding_waiting`, out of vLLM's way, and is keyed when it resumes), asked again at every
  step for a policy with `Traits.rescore_queued`; the running list is ordered so vLLM's tail
  preemption takes the policy's `preemption_order`.
* Decodes go first: a running request's prefill chunk takes only the budget and blocks the
  decodes after it leave (`decode_room.py`, the simulator's rule), but for stock vLLM.
Settings arrive through `additional_config["interlude"]` (see engine/config.py), because vLLM
builds the scheduler itself, in the engine-core process.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.capacities import emulated_bytes_per_token, real_capacities
from interlude.enginecore.decode_room import DecodeRoom
from interlude.enginecore.moves import ParkedMoves
from interlude.enginecore.parking import Parked, ParkingLot
from interlude.enginecore.policy_queue import DORMANT, Entry, PolicyQueue, held_ids, ranked
from interlude.enginecore.prefill_order import PrefillOrder
from interlude.enginecore.prefix_share import shared_blocks
from interlude.enginecore.request_views import RequestViews
from interlude.enginecore.scheduler_stats import scheduler_payload
from interlude.enginecore.swap import STATS_KEY, find_swap
from interlude.enginecore.turn_grammar import TurnGrammars
from interlude.enginecore.views import EngineRequestView, QueuedView
from interlude.policy import (
    Decision,
    Handling,
    PolicyError,
    Profile,
    SchedulerView,
    SwapMode,
    make_policy,
)
from interlude.policy.admission import holds_no_kv
from interlude.policy.types import UNKNOWN_TOOL, BatchMode

log = logging.getLogger(__name__)
PARKED = RequestStatus.WAITING_FOR_STREAMING_REQ
# While only parked sessions are left and the policy asked to be asked again later
# (`Decision.review_at`), vLLM would stop stepping; the scheduler keeps it stepping, sleeping
# at most this long per empty step, so a new request waits at most this much longer.
IDLE_REVIEW_POLL_S = 0.01


class InterludeScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config
        settings = dict(extra.get("interlude", {})) if isinstance(extra, dict) else {}
        named = Profile.from_dict(settings["profile"], source="additional_config")
        device = emulated_bytes_per_token(self.vllm_config.model_config.hf_config)
        profile = real_capacities(named, self.kv_cache_config, self.block_size, device)
        profile = dataclasses.replace(
            profile,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            max_batched_tokens=self.scheduler_config.max_num_batched_tokens,
        )
        self.profile = profile
        # Not `self.policy`: vLLM's base class uses that name for FCFS/PRIORITY.
        self.ipolicy = make_policy(settings.get("policy", "interlude"), profile)
        self.swap = find_swap(self.connector)
        groups = len(self.kv_cache_config.kv_cache_groups)
        if self.swap is not None and groups > 1:
            # The host pool copies the blocks of one group; a second group's KV (sliding
            # window, hybrid attention) would come back wrong after a swap.
            raise ValueError(
                f"this model has {groups} KV-cache groups (sliding-window or hybrid attention); "
                "host swap handles one: start the engine with host_blocks=0 (no swapping)"
            )
        block_bytes = profile.kv_bytes_per_token * self.block_size
        self.lot = ParkingLot(self.block_size, block_bytes)
        self.moves = ParkedMoves(self, self.swap, self.lot)
        self.grammars = TurnGrammars()  # each session turn's own structured-output grammar
        self._review_at: float | None = None  # the last decision's, while sessions are parked
        self.iteration = 0
        self._last_tick = time.time()
        # Whether requests were left queued after the last step: the span until this step was
        # then contended (read at the start of a step, a request that just arrived would make
        # an idle gap before it look contended).
        self._queued_after_step = False
        self._worked = False  # the last step scheduled tokens
        self.views = RequestViews(self.swap, self.lot, self.block_size)
        self.prefill_order = PrefillOrder()
        self.decode_room = DecodeRoom(self.kv_cache_manager, self.block_size)
        self.queues = (PolicyQueue(self._queue_key), PolicyQueue(self._queue_key))
        self.waiting, self.kv_holding_waiting = self.queues
        # The policy has not yet settled on the parked requests: a pause it has not seen, or a
        # decision whose effects another step must carry out (see `has_requests`).
        self._unsettled = False
        self._stats_stale = False  # KV freed outside a step (an abort): step once more
        self.held_request_steps = 0  # (request, step) pairs the policy kept from admission
        self.policy_errors = 0  # decisions or actions refused as broken (`_refuse`)

    # ---- views ------------------------------------------------------------------------------
    def _view(self, r: Request, now: float) -> EngineRequestView:
        return self.views.view(r, now, self.iteration)

    def _queue_key(self, r: Request) -> tuple[float, ...]:
        now = time.time()
        self.views.entered[r.request_id] = (now, self.iteration)
        if r.status == PARKED:
            # Waiting for its tool, not for the GPU: keyed when it resumes, and not shown to
            # the policy's queue hooks now (the starvation guard would count it as waiting).
            return DORMANT
        if (key := self.prefill_order.key(r)) is not None:
            return key  # a prefill job for a decode engine: TetriInfer's order, not the policy's
        view = QueuedView(self._view(r, now), r, self.views.entered)
        return ranked(view, self.ipolicy.queue_key(view, now))

    def _rescore_keys(self, requests: list[Request], now: float) -> list[tuple[float, ...]]:
        """The keys of requests already queued, asked again (`Traits.rescore_queued`): unlike
        `_queue_key` this leaves their queue entry times alone."""
        fixed = [self.prefill_order.key(r) for r in requests]  # prefill jobs keep theirs
        rest = [r for r, key in zip(requests, fixed, strict=True) if key is None]
        it, entered = self.iteration, self.views.entered
        views = [QueuedView(self.views.queued(r, now, it), r, entered) for r in rest]
        keys = self.ipolicy.queue_keys(views, now)
        keyed = iter([ranked(v, k) for v, k in zip(views, keys, strict=True)])
        return [key if key is not None else next(keyed) for key in fixed]

    def scheduler_view(self, now: float, running: list[EngineRequestView]) -> SchedulerView:
        queued = [r for q in (self.kv_holding_waiting, self.waiting) for r in q]
        it = self.iteration
        pairs = [(r, self.views.queued(r, now, it)) for r in queued if r.status != PARKED]
        views = [v for _, v in pairs]
        # Counted again each step (holders come and go), for waiting requests with no KV.
        fresh = [r for r, v in pairs if v.cpu_tokens == 0 and holds_no_kv(v)]
        parked = self.lot.parked.values()
        paused = [self.views.paused(p, self.requests[p.request_id], now, it) for p in parked]
        batch = sum(max(1, r.num_tokens - r.num_computed_tokens) for r in self.running)
        return SchedulerView(
            now=now,
            iteration=self.iteration,
            profile=self.profile,
            running=running,
            waiting=[v for v in views if v.cpu_tokens == 0],
            swap_queue=[v for v in views if v.cpu_tokens > 0],
            paused=paused,
            free_gpu_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            free_cpu_blocks=self.swap.free_slots if self.swap else 0,
            running_tokens=batch,
            running_context=sum(r.num_computed_tokens for r in self.running),
            swap_budget_tokens=self.profile.swap_budget_tokens(batch) if self.swap else 0,
            shared_blocks=shared_blocks(
                self.kv_cache_manager, fresh, self.profile.max_batched_tokens
            ),
        )

    # ---- the step ---------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """One engine step: the time since the last accounted (`_begin_step`), the policy's
        decision on the parked and queued requests applied (`_consult`), the queues and the
        running list arranged as it wants (`_arrange`), vLLM's own scheduling
        (`_vllm_schedule`), then the step's bookkeeping (`_after_step`). Runs every step: the
        parts add a few calls per step and no work per request."""
        started = time.perf_counter()
        now = self._begin_step()
        # Decisions touch parked requests only, so one view of the running ones serves both.
        # With requests queued the policy decides too: it may hold some out (`Decision.hold`).
        queued = len(self.waiting) + len(self.kv_holding_waiting)
        waiting = queued > self.num_waiting_for_streaming_input
        consult = bool(self.lot.parked) or waiting
        needed = consult or len(self.running) > 1
        running = [self._view(r, now) for r in self.running] if needed else []
        self._unsettled = False
        hold: set[str] = set()
        self.moves.begin_step()
        self._review_at = None
        if consult:
            hold = self._consult(now, running)
        held = self._arrange(now, running, hold, waiting)
        before = {r.request_id for r in self.running}
        out, vllm_s = self._vllm_schedule(throttle_prefills)
        self._after_step(out, now, held, before)
        self.lot.counters.add_step(time.perf_counter() - started, vllm_s)
        return out

    def _begin_step(self) -> float:
        """Start a step: count it, let the queues forget what vLLM popped, wait out an idle
        review (`_wait_for_review`), and account the time since the last step to the parking
        lot (waste, contended or not) and to busy time. The step's wall-clock time."""
        self.iteration += 1
        for q in self.queues:
            q.forget_popped()
        self._wait_for_review()
        now = time.time()
        used = self.kv_cache_manager.block_pool.num_gpu_blocks - 1
        used -= self.kv_cache_manager.block_pool.get_num_free_blocks()
        self.lot.tick(now - self._last_tick, used, contended=self._queued_after_step)
        if self._worked:
            self.lot.counters.busy_s += now - self._last_tick
        self._last_tick = now
        return now

    def _consult(self, now: float, running: list[EngineRequestView]) -> set[str]:
        """Ask the policy and apply its decision (`_apply`); the ids it holds out of admission
        this step. A policy that raises PolicyError is logged and counted, and decides nothing.
        Sets `_unsettled` and `_review_at`."""
        view = self.scheduler_view(now, running)
        try:
            decision = self.ipolicy.decide(view)
        except PolicyError:
            # A policy bug must not take the engine core, and every session, down with
            # it: this step goes on as if the policy had decided nothing.
            log.exception("%s failed to decide; no decision this step", self.ipolicy.name)
            self.policy_errors += 1
            decision = Decision()
        self._unsettled = self._apply(decision)
        self._review_at = decision.review_at
        return held_ids(decision, view.waiting)

    def _arrange(
        self, now: float, running: list[EngineRequestView], hold: set[str], waiting: bool
    ) -> list[tuple[PolicyQueue, list[Entry]]]:
        """Arrange what vLLM will see: the queues ranked again (a policy that rescores them),
        the held requests set aside (returned, to put back after the step), the running list
        sorted so vLLM's tail preemption follows the policy's order."""
        if waiting and self.ipolicy.traits.rescore_queued:
            # Its keys follow the batch state (LAMPS): rank the queues again, after `decide`
            # has seen this step's batch.
            for q in self.queues:
                q.rescore(lambda rs: self._rescore_keys(rs, now))
        # Held requests are out of vLLM's reach for this step; it admits those behind them.
        self.held_request_steps += len(hold)
        held = [(q, q.set_aside(hold)) for q in self.queues] if hold else []
        if len(running) > 1:
            order = self.ipolicy.preemption_order(running)
            rank = {v.request_id: i for i, v in enumerate(order)}
            # vLLM preempts the tail: the policy's first victim goes last.
            self.running.sort(key=lambda r: -rank[r.request_id])
        return held

    def _vllm_schedule(self, throttle_prefills: bool) -> tuple[SchedulerOutput, float]:
        """vLLM's own `schedule`, with the swap connector's load budget set and the parked
        sessions that hold no slot left out of its count; its output and its seconds."""
        # vLLM counts every parked session against `max_num_seqs`; one whose KV has left the
        # GPU holds no slot here (its model-runner row went when it stopped being scheduled)
        # and takes one again when it resumes, as in the simulator. vLLM changes the counter
        # only outside `schedule`, so it is lowered for the call and put back after.
        released = self._released_slots()
        if self.swap is not None:
            self.swap.begin_step(self._load_budget())
        self.num_waiting_for_streaming_input -= released
        self.decode_room.begin_step(self.max_num_scheduled_tokens)
        vllm_started = time.perf_counter()
        try:
            out = super().schedule(throttle_prefills)
        finally:
            self.num_waiting_for_streaming_input += released
        return out, time.perf_counter() - vllm_started

    def _after_step(
        self,
        out: SchedulerOutput,
        now: float,
        held: list[tuple[PolicyQueue, list[Entry]]],
        before: set[str],
    ) -> None:
        """After vLLM's scheduling: the held requests back in their queues, the requests it
        admitted recorded (queue time, ran), how their KV came back (`account_admissions`),
        a stall broken (`unstall`), and whether requests were left queued and work done."""
        for q, entries in held:
            q.put_back(entries)
        for r in self.running:
            if r.request_id not in before:
                # A running request's queue time is its admission (the RequestView contract,
                # as in the simulator): the wait it saw is admission minus queue entry.
                self.views.entered[r.request_id] = (now, self.iteration)
                self.views.ran.add(r.request_id)
        self.moves.account_admissions(out, now)
        if out.total_num_scheduled_tokens == 0 and not self.running:
            # Not when admission is blocked by the slot limit: freeing blocks would not help.
            slots = self.num_waiting_for_streaming_input - self._released_slots()
            if slots < self.max_num_active_reqs:
                self.moves.unstall(self._view, now)
        # Parked sessions sit in the queues too (vLLM counts them apart); only the others wait.
        queued = len(self.waiting) + len(self.kv_holding_waiting)
        self._queued_after_step = queued > self.num_waiting_for_streaming_input
        self._worked = out.total_num_scheduled_tokens > 0

    def _apply(self, decision: Any) -> bool:
        """Carry out a decision; whether any parked KV moved (then the policy may act again)."""
        moved = False
        copying: set[str] = set()  # requests with blocks being copied out this step
        for action in decision.kv:
            p = self.lot.parked.get(action.request_id)
            if p is None or not p.on_gpu:
                self._refuse(f"{action} names no parked GPU request")
                continue
            request = self.requests[action.request_id]
            if action.handling is Handling.SWAP:
                try:
                    moved |= self.moves.swap_out(request, p, action.blocks, self.ipolicy.name) > 0
                except PolicyError as exc:
                    self._refuse(str(exc))
                    continue
                copying.add(p.request_id)
            elif action.handling is Handling.DISCARD:
                moved = True
                self.moves.discard(request, p, copying=p.request_id in copying)
        if decision.requeue:
            ids = set(decision.requeue)
            for q in self.queues:
                q.rekey(ids)
        return moved

    def _load_budget(self) -> int | None:
        """Tokens this step may load from host: the swap budget left after its saves, as in the
        simulator (a SYNC-mode policy loads whole, stalling the batch, and has no budget)."""
        if self.ipolicy.traits.swap_mode is SwapMode.SYNC:
            return None
        batch = sum(max(1, r.num_tokens - r.num_computed_tokens) for r in self.running)
        return max(0, self.profile.swap_budget_tokens(batch) - self.moves.saved_tokens)

    def _wait_for_review(self) -> None:
        """Nothing to run, and only a later review keeps the engine stepping: sleep towards it
        (bounded, so that a new request is not kept waiting) instead of spinning."""
        review = self._review_at
        if review is None or self.running or self._unsettled or not self.lot.parked:
            return
        if len(self.waiting) + len(self.kv_holding_waiting) > self.num_waiting_for_streaming_input:
            return
        time.sleep(min(max(0.0, review - time.time()), IDLE_REVIEW_POLL_S))

    def _released_slots(self) -> int:
        """Parked sessions whose KV is off the GPU: they hold no `max_num_seqs` slot."""
        return sum(1 for p in self.lot.parked.values() if not p.on_gpu)

    def _reserve_prefill_lookahead(self, request: Request, computed: int, new: int) -> int:
        # vLLM's last word on a chunk before it allocates: decodes go first (`decode_room`).
        new = super()._reserve_prefill_lookahead(request, computed, new)
        if self.ipolicy.traits.batch_mode is BatchMode.V1:
            return new
        return self.decode_room.cap(request, new, self.running)

    def _inflight_prefill_reserved_blocks(self) -> int:
        # vLLM admits an asynchronous load only into the blocks that in-flight prefills will not
        # need, because a remote transfer may hold its blocks for long. Ours finish within a
        # few steps (every step copies at least one block), and the simulator admits a swap-in
        # as vLLM admits any request: when its whole sequence fits the free blocks.
        return 0

    def _refuse(self, why: str) -> None:
        """Drop one action that breaks the seam's rules; the request it names keeps its KV
        where it is (parked KV left in place is a preserve: nothing is lost, only memory)."""
        log.error("%s: refused an action: %s", self.ipolicy.name, why)
        self.policy_errors += 1

    def has_requests(self) -> bool:
        """vLLM stops stepping when only parked sessions are left, so a pause that leaves the
        engine idle would never reach the policy (and a vllm-style discard would silently become
        a preserve). Step on, with empty batches, until a decision changes nothing (a step
        that plans frees after a copy is one that moved KV, so it is covered). This ends:
        every KV action moves parked blocks off the GPU, and nothing moves them back before
        the request resumes."""
        review = self._review_at is not None and bool(self.lot.parked)
        return super().has_requests() or self._unsettled or self._stats_stale or review

    def add_request(self, request: Request) -> None:
        self.grammars.note(self.requests.get(request.request_id), request)
        super().add_request(request)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        # An abort (a cancelled session, a client gone) frees KV outside any step; step once
        # more so the stats (KV usage, the gateway's routing input) do not keep the old value.
        self._stats_stale = True
        return super().finish_requests(request_ids, finished_status)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)
        self.moves.after_step()  # the step that copied blocks has run: they may go now
        return result

    # ---- lifecycle hooks ----------------------------------------------------------------------
    def _handle_stopped_request(self, request: Request) -> bool:
        generated = len(request.output_token_ids)
        finished = super()._handle_stopped_request(request)
        if finished or request.status != PARKED:
            return finished
        now = time.time()
        meta = self.views.metas.get(request)
        tool = meta.tool
        stops = (request.sampling_params.stop_token_ids or []) if request.sampling_params else []
        # The last token, not `stop_reason`: vLLM keeps a session's stop_reason across turns.
        if tool is None and request.output_token_ids and request.output_token_ids[-1] in stops:
            # A real model's turn ended at a tool-call stop token; which tool it named is parsed
            # in the frontend, so the policy predicts this pause without the tool's name.
            tool = UNKNOWN_TOOL
        if tool is None:
            return False  # the session's last turn: it ends as soon as its input stream closes
        p = Parked(
            request_id=request.request_id,
            kind=meta.kind,
            arrival=meta.arrival,
            paused_at=now,
            tool=tool,
            calls_done=meta.calls_done,
            frontier=request.num_computed_tokens,
            gpu_blocks=len(self.kv_cache_manager.get_block_ids(request.request_id)[0]),
        )
        self.lot.park(p)
        self._unsettled = True
        view = self._view(request, now)
        self.ipolicy.on_segment(view, generated)
        self.ipolicy.on_pause(view, now)
        return False

    def _update_request_as_session(self, session: Request, update: Any) -> None:
        now = time.time()
        p = self.lot.parked.get(session.request_id)
        if p is not None:
            self.ipolicy.on_resume(self._view(session, now), now, now - p.paused_at)
            self.lot.unpark(session.request_id)
            self.lot.resumed_at[session.request_id] = now
            self.lot.counters.resumed_tokens += p.frontier
        super()._update_request_as_session(session, update)
        self.grammars.install(session, update)
        if p is not None and p.on_gpu and p.freed_blocks:
            # Swapped out in part: its copied blocks come back under the ones that stayed.
            loading = self.moves.reload_in_place(session, p)
            if loading:
                self.lot.cold[session.request_id] = loading  # counted at its admission
                self.queues[1].rekey({session.request_id})
                return
            # No room to load into: what stayed is not a usable context on its own (its first
            # blocks are gone), so it comes back like a whole swap, from host and recompute.
            self.moves.release(session, p)
        if p is not None and not p.on_gpu:
            # Its KV is gone from the GPU: start over from token 0 so vLLM looks up the prefix
            # cache and the host pool, then recomputes the rest.
            self.lot.cold[session.request_id] = p.frontier
            session.num_computed_tokens = 0
            if session in self.kv_holding_waiting:
                self.kv_holding_waiting.remove_request(session)
                self.waiting.add_request(session)
            return
        if p is not None:
            if self.swap:
                self.swap.drop(session.request_id)  # an unfinished swap-out is abandoned
            self.lot.counters.bump(self.lot.counters.resumes, "preserve")
        # Parked, it sat in `kv_holding_waiting` under the dormant key; with new tokens to
        # prefill it is a request to rank now (no-op when it was running, not queued).
        self.queues[1].rekey({session.request_id})

    def _preempt_request(
        self, request: Request, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        c = self.lot.counters
        c.bump(c.recompute_tokens, "preempt", request.num_computed_tokens)
        super()._preempt_request(request, timestamp, drop_stale_output)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        now = time.time()
        self.ipolicy.on_finish(self._view(request, now), now)
        self.lot.forget(request.request_id)
        self.grammars.forget(request.request_id)
        self.views.forget(request.request_id)
        self.prefill_order.forget(request.request_id)
        return super()._free_request(request, delay_free_blocks)

    def make_stats(self, *args: Any, **kwargs: Any) -> SchedulerStats | None:
        self._stats_stale = False
        stats = super().make_stats(*args, **kwargs)
        if stats is not None:
            payload = dict(stats.kv_connector_stats or {})
            payload[STATS_KEY] = scheduler_payload(self)
            stats.kv_connector_stats = payload
        return stats
