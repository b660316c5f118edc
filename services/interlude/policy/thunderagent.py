"""ThunderAgent's program-aware scheduler, on one engine.

Source: H. Kang et al., "ThunderAgent: A Simple, Fast and Program-Aware Agentic Inference
System", ICML 2026, arXiv:2602.13692 (https://arxiv.org/abs/2602.13692); released code
https://github.com/ThunderAgent-org/ThunderAgent (also HaoKang-Timmy/ThunderAgent),
`ThunderAgent/scheduler/router.py` and `ThunderAgent/backend/state.py`, read at a7eef77.

ThunderAgent is a router in front of vLLM. A *program* (one agent run: our request, whose
turns are its segments) is REASONING while it has an LLM request in flight and ACTING while its
tool runs; the router tracks which programs are ACTIVE on the backend and which it PAUSED.
From the code:

* **Capacity.** remaining = KV capacity in tokens - (sum of the active programs' tokens, an
  acting one weighted by `acting_weight` = 1.0) - `buffer_tokens` (100) per active program.
  Its `shared_tokens` (prefix-cache savings read from vLLM) is 0 here: the simulator shares no
  prefixes.
* **Admission.** A new program starts only if nobody is waiting in the paused pool and
  remaining >= its tokens + buffer; otherwise it joins the pool. A paused program's next turn
  waits until the scheduler resumes it. Waiting is `Decision.hold`.
* **Periodic check** every `interval_s` (the code's `scheduler_interval`, 5 s): first resume
  from the pool in priority order (programs whose tool returned, then new programs, then those
  still acting; each group smallest first), taking each whose tokens + buffer still fit the
  remaining capacity (with one engine the code's best-fit-decreasing placement reduces to
  this); then, while remaining < 0, pause ACTING programs smallest first (their KV may go:
  DISCARD here, vLLM's prefix-cache LRU there), and if that is not enough mark REASONING
  programs, smallest first, to pause at their next tool boundary.
* A resumed turn reaches vLLM then, so it queues FCFS by that moment (`queue_key`).
* Upstream's `--use-acting-token-decay` (off by default there and here, `acting_decay`): on the
  resume side an acting program counts 2^-(seconds acting) of its tokens, so a long tool call
  stops blocking resumes after a few seconds.

Where we differ, and why:

* Upstream's loop marks *every* reasoning program once pausing the acting ones is not enough
  (marking does not change its `remaining_capacity()`); we stop when the marked programs'
  tokens cover the overflow, the purpose of its `future_paused_tokens` counter.
* Upstream force-resumes a program that waited 30 minutes. With one engine and nothing active
  that would leave the GPU idle, so we resume the first candidate at once when no program is
  active (a program larger than capacity - buffer could otherwise never start).
* Token counts are exact (upstream estimates a new program's prompt as characters / 5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from interlude.policy.base import Policy
from interlude.policy.profile import Profile
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    Phase,
    RequestView,
    SchedulerView,
    Traits,
)

SCHEDULER_INTERVAL_S = 5.0  # upstream `scheduler_interval` default
BUFFER_PER_PROGRAM = 100  # upstream `BUFFER_PER_PROGRAM`: decode headroom, tokens
ACTING_TOKEN_WEIGHT = 1.0  # upstream `acting_token_weight` default


class ThunderAgentPolicy(Policy):
    name = "thunderagent"
    traits = Traits(batch_mode=BatchMode.CHUNKED)
    description = (
        "Program-level admission (start a program only while the live programs' KV plus a "
        "buffer fits), a check every 5 s that pauses acting programs smallest first under "
        "pressure and resumes paused ones smallest first while they fit (ThunderAgent)."
    )
    # Upstream's `--use-acting-token-decay` when the constructor does not say (a registered
    # configuration sets it, `ThunderAgentDecayPolicy`).
    decays: ClassVar[bool] = False

    def __init__(
        self,
        profile: Profile,
        interval_s: float = SCHEDULER_INTERVAL_S,
        buffer_tokens: int = BUFFER_PER_PROGRAM,
        acting_weight: float = ACTING_TOKEN_WEIGHT,
        acting_decay: bool | None = None,
    ) -> None:
        super().__init__(profile)
        if interval_s <= 0 or buffer_tokens < 0 or acting_weight < 0:
            raise ValueError("thunderagent: interval_s > 0, buffer_tokens >= 0, weight >= 0")
        self.interval_s = interval_s
        self.buffer_tokens = buffer_tokens
        self.acting_weight = acting_weight
        self.acting_decay = self.decays if acting_decay is None else acting_decay
        self.capacity = profile.gpu_blocks * profile.block_size
        self.active: set[str] = set()  # programs registered with the backend
        self.pool: dict[str, int] = {}  # paused programs -> order they were paused in
        self.marked: set[str] = set()  # reasoning programs to pause at their next call
        self.started: set[str] = set()  # programs that have been active once
        self.seen: set[str] = set()  # programs the scheduler knows (new ones are not)
        self._seq = 0
        self._sent_at: dict[str, float] = {}  # resume time: when the turn reaches vLLM
        self._next_check: float | None = None

    # --- accounting ----------------------------------------------------------------------
    def tokens(self, r: RequestView) -> float:
        """A program's tokens as the capacity sees them (acting ones weighted)."""
        weight = self.acting_weight if r.phase is Phase.PAUSED else 1.0
        return weight * r.context_tokens

    def remaining(self, programs: dict[str, RequestView], now: float | None = None) -> float:
        """Capacity left; given `now` (resume side, `acting_decay`), an acting program counts
        2^-(seconds acting) of its tokens (upstream `remaining_capacity_with_decay`)."""
        used = 0.0
        for rid in self.active:
            r = programs.get(rid)
            if r is None:
                continue
            tokens = self.tokens(r)
            if now is not None and r.phase is Phase.PAUSED and r.paused_at is not None:
                tokens = r.context_tokens * 2.0 ** -(now - r.paused_at)
            used += tokens
        return self.capacity - used - self.buffer_tokens * len(self.active)

    def _pause(self, rid: str) -> None:
        self.active.discard(rid)
        self.marked.discard(rid)
        self._seq += 1
        self.pool[rid] = self._seq

    def _resume(self, rid: str, now: float) -> None:
        del self.pool[rid]
        self.active.add(rid)
        self.started.add(rid)
        self._sent_at[rid] = now

    # --- the scheduler -------------------------------------------------------------------
    def decide(self, view: SchedulerView) -> Decision:
        queued = [*view.waiting, *view.swap_queue]
        # Every live program by id: needed only when a program arrives, at a check, or with
        # nothing active (most iterations have none of these, and the dict costs a pass over
        # every live request).
        everyone: dict[str, RequestView] | None = None

        def live() -> dict[str, RequestView]:
            nonlocal everyone
            if everyone is None:
                everyone = {r.request_id: r for r in (*view.running, *queued, *view.paused)}
            return everyone

        self._see(view, queued, live)
        resumed = self._check(view.now, live)
        p = view.profile
        kv = tuple(
            KVAction(r.request_id, Handling.DISCARD, p.blocks(r.gpu_tokens))
            for r in view.paused
            if r.request_id in self.pool and r.gpu_tokens > 0
        )
        pool = self.pool
        hold = frozenset(r.request_id for r in view.waiting if r.request_id in pool)
        waiting = {r.request_id for r in queued} if resumed else set()
        return Decision(
            kv=kv,
            hold=hold,
            requeue=tuple(rid for rid in resumed if rid in waiting),
            review_at=self._next_check if (self.active or self.pool) else None,
        )

    def _see(
        self,
        view: SchedulerView,
        queued: list[RequestView],
        live: Callable[[], dict[str, RequestView]],
    ) -> None:
        """Programs met for the first time join the active set or the pool; marked programs
        that reached their tool boundary pause."""
        for r in (*view.running, *view.paused):
            if r.request_id not in self.seen:  # on the GPU already: it was let in before us
                self.seen.add(r.request_id)
                self.active.add(r.request_id)
                self.started.add(r.request_id)
        # Marked programs pause at their tool boundary (upstream: after the request returns).
        if self.marked:
            for r in view.paused:
                if r.request_id in self.marked:
                    self._pause(r.request_id)
        # New programs: admitted on arrival only if the pool is empty and they fit.
        new = sorted(
            (r for r in queued if r.request_id not in self.seen),
            key=lambda r: (r.arrival, r.request_id),
        )
        for r in new:
            self.seen.add(r.request_id)
            rid = r.request_id
            if not self.pool and self.remaining(live()) >= r.context_tokens + self.buffer_tokens:
                self.active.add(rid)
                self.started.add(rid)
            else:
                self._seq += 1
                self.pool[rid] = self._seq

    def _check(self, now: float, live: Callable[[], dict[str, RequestView]]) -> list[str]:
        """The periodic check (every `interval_s`): resume what fits, pause until safe; and
        with nothing active, the first candidate starts anyway. The programs resumed."""
        resumed: list[str] = []
        if self._next_check is None:
            self._next_check = now
        if now >= self._next_check:
            resumed += self._greedy_resume(live(), now)
            self._pause_until_safe(live())
            while self._next_check <= now:
                self._next_check += self.interval_s
        if not self.active and self.pool:
            # Nothing runs and nothing will free memory: start the first candidate anyway.
            first = self._candidates(live())[:1]
            for rid in first:
                self._resume(rid, now)
            resumed += first
        return resumed

    def _candidates(self, programs: dict[str, RequestView]) -> list[str]:
        """The pool in resume priority: returned from a call, new, still acting; smallest
        first in each group (upstream `_greedy_resume`)."""

        def rank(rid: str) -> tuple[int, int, int]:
            r = programs[rid]
            if r.phase is Phase.PAUSED:
                group = 2
            elif rid not in self.started:
                group = 1
            else:
                group = 0
            return (group, r.context_tokens, self.pool[rid])

        return sorted((rid for rid in self.pool if rid in programs), key=rank)

    def _greedy_resume(self, programs: dict[str, RequestView], now: float) -> list[str]:
        remaining = self.remaining(programs, now if self.acting_decay else None)
        if remaining <= self.buffer_tokens:
            return []
        resumed = []
        for rid in self._candidates(programs):
            need = programs[rid].context_tokens + self.buffer_tokens
            if need <= remaining:
                remaining -= need
                self._resume(rid, now)
                resumed.append(rid)
        return resumed

    def _pause_until_safe(self, programs: dict[str, RequestView]) -> None:
        remaining = self.remaining(programs)
        if remaining >= 0:
            return
        live = [programs[rid] for rid in self.active if rid in programs]
        for r in smallest_first(x for x in live if x.phase is Phase.PAUSED):
            if remaining >= 0:
                return
            self._pause(r.request_id)
            remaining += self.tokens(r) + self.buffer_tokens
        # Not enough: reasoning programs pause at their next tool boundary.
        future = sum(programs[rid].context_tokens for rid in self.marked if rid in programs)
        for r in smallest_first(x for x in live if x.phase is not Phase.PAUSED):
            if remaining + future >= 0:
                return
            if r.request_id not in self.marked:
                self.marked.add(r.request_id)
                future += r.context_tokens

    def queue_key(self, req: RequestView, now: float) -> tuple[float, ...]:
        # A turn reaches vLLM when it is sent: on its return, or when a held one is resumed.
        return (max(req.queue_time, self._sent_at.get(req.request_id, -1.0)),)

    def on_finish(self, req: RequestView, now: float) -> None:
        rid = req.request_id
        self.active.discard(rid)
        self.marked.discard(rid)
        self.pool.pop(rid, None)
        self.started.discard(rid)
        self.seen.discard(rid)
        self._sent_at.pop(rid, None)


def smallest_first(programs: Iterable[RequestView]) -> list[RequestView]:
    return sorted(programs, key=lambda r: (r.context_tokens, r.arrival, r.request_id))


class ThunderAgentDecayPolicy(ThunderAgentPolicy):
    """ThunderAgent with upstream's `--use-acting-token-decay`: on the resume side an acting
    program counts 2^-(seconds acting) of its tokens, so a long tool call stops holding
    capacity against resumes after a few seconds (off by default upstream). A peer runs at
    its best configuration per workload; the tables say which one that was."""

    name = "thunderagent-decay"
    family = "thunderagent"
    description = (
        "ThunderAgent with acting-token decay: an acting program's tokens count "
        "2^-(seconds acting) when paused programs are resumed (upstream's option)."
    )

    decays = True
