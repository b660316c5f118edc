"""The running requests, kept so that an iteration costs the simulator O(events), not O(batch).

Every iteration that runs decodes adds one token to each decoding request. Rather than touch each
of them, `Decoding` advances one `DecodeClock` (a decoding `SimRequest` reads its counts as
stored + ticks) and keeps what the batcher and the skip logic need as running sums: how many
decodes need a new block next (a histogram of GPU tokens modulo the block size), the context they
hold, and when each one's segment is generated (a heap). Requests join when they start to decode
and leave when they pause, finish or are preempted; the work is per join and leave.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from interlude.policy.batching import StepBudget, next_step_tokens
from interlude.policy.profile import Profile
from interlude.sim.request import DecodeClock, SimRequest


class Decoding:
    """The running requests that decode (no tokens pending), in the order they joined."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.clock = DecodeClock()
        self.members: dict[str, SimRequest] = {}
        # Members by (GPU tokens - ticks) mod block size: constant while a request decodes.
        self._hist = [0] * block_size
        self._ctx = 0  # sum of (context tokens - ticks) over members
        # (tick at which the member's segment is generated, its run_seq, member); entries of
        # requests that left are skipped when they surface (run_seq tells a later stint apart).
        self._ends: list[tuple[int, int, SimRequest]] = []

    def __len__(self) -> int:
        return len(self.members)

    def join(self, r: SimRequest) -> None:
        t = self.clock.ticks
        self.members[r.request_id] = r
        self._hist[(r.gpu_tokens - t) % self.bs] += 1
        self._ctx += r.context_tokens - t
        heapq.heappush(self._ends, (t + r.target - r.generated_tokens, r.run_seq, r))
        r.decode_join(self.clock)

    def leave(self, r: SimRequest) -> None:
        r.decode_leave()
        t = self.clock.ticks
        del self.members[r.request_id]
        self._hist[(r.gpu_tokens - t) % self.bs] -= 1
        self._ctx -= r.context_tokens - t

    def context(self) -> int:
        """Context tokens the members hold."""
        return self._ctx + len(self.members) * self.clock.ticks

    def residues(self) -> list[int]:
        """Members by GPU tokens mod block size, now (index 0: those that need a new block to
        decode one more token)."""
        t = self.clock.ticks % self.bs
        h = self._hist
        return h[-t:] + h[:-t] if t else h[:]

    def need(self) -> int:
        """GPU blocks the members need to decode one more token each."""
        return self._hist[-self.clock.ticks % self.bs]

    def growth(self, k: int) -> int:
        """GPU blocks the members add by decoding `k` more tokens each."""
        if k == 1:
            return self.need()
        bs = self.bs
        hist = self.residues()
        # A member with q tokens in its last block (q = 0: the block is full) crosses into a
        # new block ceil(k / bs) times when q = 0, else floor((q + k - 1) / bs) times.
        total = hist[0] * -(-k // bs)
        for q in range(max(1, bs - k + 1), bs):
            if hist[q]:
                total += hist[q] * ((q + k - 1) // bs)
        return total

    def _valid(self, entry: tuple[int, int, SimRequest]) -> bool:
        r = entry[2]
        return r.decoding and r.run_seq == entry[1]

    def min_left(self) -> int:
        """Fewest tokens any member still generates in its segment (there must be members)."""
        ends = self._ends
        while not self._valid(ends[0]):
            heapq.heappop(ends)
        return ends[0][0] - self.clock.ticks

    def advance(self, k: int) -> list[SimRequest]:
        """Every member decodes `k` tokens; return those whose segment is now generated, in the
        order they entered the running set."""
        self.clock.ticks += k
        ticks = self.clock.ticks
        ends = self._ends
        done = []
        while ends and ends[0][0] <= ticks:
            entry = heapq.heappop(ends)
            if self._valid(entry):
                done.append(entry[2])
        if len(done) > 1:
            done.sort(key=lambda r: r.run_seq)
        return done


class Running:
    """The running requests in the order they entered, split into decoding and prefilling ones.

    A request enters prefilling when admitted (its first chunk is in the batch being formed) or
    when it resumes with tokens to prefill, decoding when it resumes with none; a prefilling
    request moves to decoding when its prefill ends and it samples its first token.
    """

    def __init__(self, block_size: int) -> None:
        self.all: dict[str, SimRequest] = {}
        self.decoding = Decoding(block_size)
        # Prefilling requests, in the order they entered (the order of `all`).
        self.prefilling: dict[str, SimRequest] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self.all)

    def __bool__(self) -> bool:
        return bool(self.all)

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(self.all.values())

    def add(self, r: SimRequest, prefilling: bool) -> None:
        self._seq += 1
        r.run_seq = self._seq
        self.all[r.request_id] = r
        if prefilling:
            self.prefilling[r.request_id] = r
        else:
            self.decoding.join(r)

    def remove(self, r: SimRequest) -> None:
        del self.all[r.request_id]
        if r.decoding:
            self.decoding.leave(r)
        else:
            del self.prefilling[r.request_id]

    def prefill_done(self, r: SimRequest) -> None:
        """`r` has prefilled everything and sampled a token: it decodes from now on."""
        del self.prefilling[r.request_id]
        self.decoding.join(r)

    def load(self, p: Profile, threshold: StepBudget | None = None) -> tuple[int, int]:
        """(tokens the running requests schedule next iteration, context they hold);
        `threshold`: the budget of a `BatchMode.THRESHOLD` iteration."""
        context = self.decoding.context()
        pending = []
        for r in self.prefilling.values():
            pending.append(r.pending_tokens)
            context += r.context_tokens
        if threshold is not None:
            return next_step_tokens(threshold, len(self.decoding), pending), context
        # Prefill beyond S waits for later iterations (the chunked budget; a v0 prefill
        # iteration has no decodes, so S is also a fair guess of what it hides a swap behind).
        return len(self.decoding) + min(sum(pending), p.saturation_tokens), context
