"""KV block bookkeeping for the simulator: it only counts.

Every change to where a request's tokens live goes through `KVBook`, which converts token
counts per location into blocks (ceil(tokens / block_size)) and moves the difference in or out
of the GPU and CPU pools, so `free + sum(blocks held) == total` holds for each pool by
construction (on the GPU also counting blocks loading and those shared heads pin); `check`
verifies it against the requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from mypy_extensions import mypyc_attr

from interlude.policy.profile import Profile
from interlude.policy.types import Phase
from interlude.sim.config import SimulationError
from interlude.sim.prefix_cache import PrefixCache
from interlude.sim.request import SimRequest


# An exception stays a Python class: mypyc cannot compile subclasses of builtin ones.
@mypyc_attr(native_class=False)
class OutOfBlocks(RuntimeError):
    """An allocation asked for more blocks than are free (a simulator bug, never a policy's)."""


@mypyc_attr(native_class=False)
class IntegrityError(AssertionError):
    """Block or token conservation broke."""


class KVBook:
    def __init__(self, profile: Profile, prefix_cache: bool = False) -> None:
        self.bs = profile.block_size
        self.gpu_total = profile.gpu_blocks
        self.cpu_total = profile.cpu_blocks
        self.gpu_free = self.gpu_total
        self.cpu_free = self.cpu_total
        # GPU blocks held for the whole run by prompt heads many requests share
        # (`sim/shared_heads.py`): no request's, never freed.
        self.pinned = 0
        # GPU blocks held by PAUSED requests (the preserve waste), kept up to date here so the
        # simulator need not sum it every step; the engine adds and removes a request's blocks
        # when it pauses and resumes.
        self.paused_gpu = 0
        # PAUSED requests with any GPU tokens: the `max_num_seqs` slots parked sessions hold,
        # counted here so the simulator need not scan the paused requests every step.
        self.paused_holders = 0
        # PAUSED requests with GPU or host KV, in the order they paused (a paused request
        # never gains KV, so this is `paused` less those that lost theirs, in its order): the
        # view's `paused_with_kv`.
        self.paused_kv: dict[str, SimRequest] = {}
        # GPU blocks allocated to host copies still being loaded (`swapping.Loads`): no
        # request's tokens are in them yet.
        self.loading = 0
        # Free GPU blocks that still hold what a request freed (vLLM's prefix cache).
        self.cache = PrefixCache(self.gpu_total, prefix_cache)

    def use_prefix_cache(self, enabled: bool) -> None:
        """Start a new prefix cache over today's free blocks (an engine that changes policy
        while it holds no request, `Simulator.set_policy`)."""
        self.cache = PrefixCache(self.gpu_total, enabled)
        self.cache.sync(self.gpu_free)

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.bs)

    def pin(self, blocks: int) -> None:
        """Hold `blocks` free GPU blocks for good: shared heads (`sim/shared_heads.py`)."""
        if blocks < 0 or blocks > self.gpu_free:
            raise SimulationError(f"shared heads need {blocks} GPU blocks, {self.gpu_free} free")
        self.gpu_free -= blocks
        self.pinned += blocks
        self.cache.sync(self.gpu_free)

    def set_gpu(self, r: SimRequest, tokens: int) -> None:
        bs = self.bs
        delta = -(-tokens // bs) + (-r.gpu_tokens // bs)  # ceil(new) - ceil(old)
        if delta > self.gpu_free:
            raise OutOfBlocks(f"{r.request_id}: needs {delta} GPU blocks, {self.gpu_free} free")
        self.gpu_free -= delta
        if r.phase is Phase.PAUSED:
            self.paused_gpu += delta
            self.paused_holders += (tokens > 0) - (r.gpu_tokens > 0)
            if tokens == 0 and r.cpu_tokens == 0:
                self.paused_kv.pop(r.request_id, None)
        r.gpu_tokens = tokens

    def pause(self, r: SimRequest) -> None:
        """`r` just became PAUSED: its GPU blocks count as paused from now on."""
        self.paused_gpu += self.blocks(r.gpu_tokens)
        self.paused_holders += r.gpu_tokens > 0
        if r.gpu_tokens or r.cpu_tokens:
            self.paused_kv[r.request_id] = r

    def unpause(self, r: SimRequest) -> None:
        """`r` is about to leave PAUSED (its call returned)."""
        self.paused_gpu -= self.blocks(r.gpu_tokens)
        self.paused_holders -= r.gpu_tokens > 0
        self.paused_kv.pop(r.request_id, None)

    def set_cpu(self, r: SimRequest, tokens: int) -> None:
        delta = self.blocks(tokens) - self.blocks(r.cpu_tokens)
        if delta > self.cpu_free:
            raise OutOfBlocks(f"{r.request_id}: needs {delta} CPU blocks, {self.cpu_free} free")
        self.cpu_free -= delta
        if r.phase is Phase.PAUSED and tokens == 0 and r.gpu_tokens == 0:
            self.paused_kv.pop(r.request_id, None)
        r.cpu_tokens = tokens

    def reserve_load(self, blocks: int) -> None:
        if blocks > self.gpu_free:
            raise OutOfBlocks(f"a load needs {blocks} GPU blocks, {self.gpu_free} free")
        self.gpu_free -= blocks
        self.loading += blocks

    def release_load(self, blocks: int) -> None:
        self.gpu_free += blocks
        self.loading -= blocks

    def grow_cost(self, r: SimRequest, tokens: int) -> int:
        """GPU blocks `r` needs to add `tokens` more tokens on the GPU."""
        return self.blocks(r.gpu_tokens + tokens) - self.blocks(r.gpu_tokens)

    def drop_gpu(self, r: SimRequest, blocks: int) -> int:
        """Free up to `blocks` whole blocks of `r`'s GPU tokens; return the tokens dropped.
        Dropping them all leaves them in the prefix cache for `r` (vLLM frees a request whole,
        and finds its blocks again when it comes back); a part of them is found by nobody."""
        if blocks >= self.blocks(r.gpu_tokens):
            return self.free_cached(r)
        return self.shrink_gpu(r, min(r.gpu_tokens, blocks * self.bs))

    def free_cached(self, r: SimRequest) -> int:
        """Free all of `r`'s GPU tokens into the prefix cache, where `r` may find them again
        (a preemption, a discard); return the tokens freed."""
        g = r.gpu_tokens
        self.cache.freed(self.gpu_free, r.request_id, g, self.blocks(g), self.bs)
        self.set_gpu(r, 0)
        return g

    def shrink_gpu(self, r: SimRequest, tokens: int) -> int:
        """Free `r`'s last `tokens` GPU tokens, for nobody to find again (a copy to host, a
        partial drop); return them."""
        left = r.gpu_tokens - tokens
        self.cache.freed_anonymous(self.gpu_free, self.blocks(r.gpu_tokens) - self.blocks(left))
        self.set_gpu(r, left)
        return tokens

    def swap_out(self, r: SimRequest, tokens: int, first: bool) -> None:
        """Free `r`'s GPU blocks of `tokens` tokens just copied to host (`first`: the copy's first
        piece). The engine copies a request's blocks in order from its first and frees each
        piece with its hashes, the last with the request, so vLLM's prefix cache keeps them
        (`PrefixCache.freed_piece`); a copy that does not start the host copy of the whole
        computed context (some of it was discarded) is found by nobody."""
        if r.recompute_left:
            self.shrink_gpu(r, tokens)
            return
        self._free_piece(r, tokens, first)

    def _free_piece(self, r: SimRequest, tokens: int, first: bool) -> None:
        """Free `r`'s next `tokens` GPU tokens, in order from its first, into the prefix cache as
        its next piece (`PrefixCache.freed_piece`; `first`: the piece starts its context)."""
        g = r.gpu_tokens
        freed = self.blocks(g) - self.blocks(g - tokens)
        partial = int(tokens == g and g % self.bs > 0)  # the last block, never cached
        self.cache.freed_anonymous(self.gpu_free, partial)
        self.cache.freed_piece(self.gpu_free + partial, r.request_id, freed - partial, first)
        self.set_gpu(r, g - tokens)

    def take_cached(self, r: SimRequest) -> int:
        """`r` holds no KV and is admitted: take what the prefix cache still holds of its
        context onto the GPU (whole blocks, leaving a token to compute); return the tokens,
        which `r` no longer computes."""
        hit = self.cache.lookup(r.request_id, r.pending_tokens, self.gpu_free, self.bs)
        if hit:
            self.cache.hit(r.request_id, hit, self.bs)
            self.set_gpu(r, hit)
            r.pending_tokens -= hit
            r.recompute_left -= min(hit, r.recompute_left)
            r.prefix_hit_tokens += hit
        return hit

    def take_cached_copy(self, r: SimRequest, past_copy: bool = False) -> int:
        """`r` swapped out whole and its host copy is about to come back: take what the prefix
        cache still holds of it onto the GPU, so only the rest is loaded (the engine asks vLLM's
        prefix cache first and its connector offers the host copy's tokens past the hit,
        `enginecore/swap.py`); return the tokens taken, which leave the host copy. `past_copy`:
        the tokens after the copy were freed into the cache behind it (`release_stayed`), and
        a hit may run on into them, which then are not recomputed."""
        if r.gpu_tokens or not r.cpu_tokens or (r.recompute_left and not past_copy):
            # Only a host copy of the whole computed context starts where the cache does.
            return 0
        hit = self.cache.lookup(
            r.request_id, r.cpu_tokens + r.pending_tokens, self.gpu_free, self.bs
        )
        if not past_copy:
            hit = min(hit, r.cpu_tokens // self.bs * self.bs)
        if hit:
            self.cache.hit(r.request_id, hit, self.bs)
            beyond = max(0, hit - r.cpu_tokens)
            self.set_cpu(r, r.cpu_tokens - (hit - beyond))
            self.set_gpu(r, hit)
            r.pending_tokens -= beyond
            r.recompute_left -= min(beyond, r.recompute_left)
            r.prefix_hit_tokens += hit
        return hit

    def release_stayed(self, r: SimRequest) -> None:
        """`r`, copied to host in part by a SYNC-mode policy, resumes: a synchronous load cannot
        go under the blocks that stayed on the GPU, so the engine frees them and `r` comes
        back like a whole swap (`InterludeScheduler._update_request_as_session`). They join
        the prefix cache behind the copied ones (found with them while those are whole, by
        `take_cached_copy(past_copy=True)`) and are recomputed unless found."""
        g = r.gpu_tokens
        self._free_piece(r, g, first=False)
        r.pending_tokens += g
        r.recompute_left += g

    def untake_cached_copy(self, r: SimRequest, hit: int) -> None:
        """Undo `take_cached_copy` for a load given up (`swapping.Loads.abandon`): the blocks go
        back to the cache and the tokens to the host copy, or, with host memory taken
        meanwhile, to be recomputed."""
        self.free_cached(r)
        r.prefix_hit_tokens -= hit
        try:
            self.set_cpu(r, r.cpu_tokens + hit)
        except OutOfBlocks:
            r.pending_tokens += hit
            r.recompute_left += hit

    def untake_cached(self, r: SimRequest, hit: int) -> None:
        """Undo `take_cached` for an admission that did not happen: the blocks go back to the
        cache, as the newest, for `r`."""
        self.cache.freed(self.gpu_free, r.request_id, hit, self.blocks(hit), self.bs)
        r.prefix_hit_tokens -= hit
        self.set_gpu(r, 0)
        r.pending_tokens += hit
        r.recompute_left += hit

    def release(self, r: SimRequest) -> None:
        """Free everything `r` holds (it finished, or leaves this engine)."""
        self.shrink_gpu(r, r.gpu_tokens)
        self.set_cpu(r, 0)

    def check(self, live: Iterable[SimRequest]) -> None:
        gpu = cpu = paused = holders = 0
        with_kv = set()
        for r in live:
            if r.phase is Phase.PAUSED:
                paused += self.blocks(r.gpu_tokens)
                holders += r.gpu_tokens > 0
                if r.gpu_tokens or r.cpu_tokens:
                    with_kv.add(r.request_id)
            gpu += self.blocks(r.gpu_tokens)
            cpu += self.blocks(r.cpu_tokens)
            if r.gpu_tokens + r.cpu_tokens + r.pending_tokens != r.context_tokens:
                raise IntegrityError(f"token conservation broke: {r}")
            if min(r.gpu_tokens, r.cpu_tokens, r.pending_tokens, r.recompute_left) < 0:
                raise IntegrityError(f"negative token count: {r}")
        if (
            self.gpu_free + gpu + self.loading + self.pinned != self.gpu_total
            or min(self.gpu_free, self.loading) < 0
        ):
            raise IntegrityError(
                f"GPU blocks: free {self.gpu_free} + used {gpu} + loading {self.loading}"
                f" + pinned {self.pinned} != total {self.gpu_total}"
            )
        if paused != self.paused_gpu:
            raise IntegrityError(f"paused GPU blocks: counted {self.paused_gpu}, held {paused}")
        if holders != self.paused_holders:
            raise IntegrityError(f"paused holders: counted {self.paused_holders}, are {holders}")
        if with_kv != set(self.paused_kv):
            raise IntegrityError(
                f"paused with KV: listed {sorted(self.paused_kv)}, are {sorted(with_kv)}"
            )
        if (broken := self.cache.check(self.gpu_free)) is not None:
            raise IntegrityError(broken)
        if self.cpu_free + cpu != self.cpu_total or self.cpu_free < 0:
            raise IntegrityError(
                f"CPU blocks: free {self.cpu_free} + swapped {cpu} != total {self.cpu_total}"
            )
