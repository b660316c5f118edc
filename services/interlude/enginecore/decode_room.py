"""Decodes before prefill chunks: a running request's prefill chunk takes only the token budget
and the GPU blocks that the decodes after it in this step's running list leave.

vLLM's running loop schedules in list order, and the engine orders that list by the policy's
preemption order (highest rank first). A request mid-prefill that ranks high (a short request
just admitted, a resumed turn recomputing) would then take its whole chunk before the decodes
behind it: the chunk could use up the step's token budget, and the decodes would skip the
step; or its blocks, and a decode that finds none left preempts the tail, whose context is
then recomputed. Neither trade was chosen by a policy. The simulator reserves every decode's
token and block first and cuts chunks to what is left (`sim/batch.py`), as InferCept's vLLM v0
code did (running sequences append their slots before any prompt is scheduled), so the engine
cuts the chunk here, in the hook vLLM calls on every chunk before it allocates.

Stock vLLM (`BatchMode.V1`) keeps its own order: the `vllm` policy is that baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.request import Request, RequestStatus

from interlude.enginecore.moves import request_blocks


def tokens_to_compute(r: Request) -> int:
    """Tokens `r` would compute in a step without caps: 1 for a decode."""
    return r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens


def decode_need(r: Request, held_blocks: int, block_size: int) -> int:
    """New blocks decode `r` needs for its next token, holding `held_blocks`."""
    needed = (r.num_computed_tokens + block_size) // block_size
    return max(0, needed - held_blocks)


class DecodeRoom:
    """One step's cuts. Side effects: counts the tokens it lets running requests schedule, so
    call `begin_step` before vLLM's running loop and `cap` once per running request it asks
    about, in the loop's order."""

    def __init__(self, kv_cache_manager: Any, block_size: int) -> None:
        self.manager = kv_cache_manager  # vLLM's `KVCacheManager`: read, never changed here
        self.block_size = block_size
        self.budget = 0  # tokens of the step's budget not yet given to a running request

    def begin_step(self, token_budget: int) -> None:
        self.budget = token_budget

    def cap(
        self,
        request: Request,
        num_new_tokens: int,
        running: Sequence[Request],
    ) -> int:
        """The most of `num_new_tokens` the running `request` may compute now so that every
        decode after it in `running` still gets its token and its block. 0 when nothing is left
        for it (vLLM then passes over it this step instead of preempting). A request that is
        not running is left alone."""
        if request.status != RequestStatus.RUNNING:
            return num_new_tokens
        if num_new_tokens > 1:
            decodes, blocks = self._behind(request, running)
            free = self.manager.block_pool.get_num_free_blocks()
            room = (self.held(request.request_id) + free - blocks) * self.block_size
            num_new_tokens = min(
                num_new_tokens, room - request.num_computed_tokens, self.budget - decodes
            )
            num_new_tokens = max(0, num_new_tokens)
        self.budget -= num_new_tokens
        return num_new_tokens

    def held(self, request_id: str) -> int:
        """GPU blocks the request holds."""
        return len(request_blocks(self.manager, request_id))

    def _behind(self, request: Request, running: Sequence[Request]) -> tuple[int, int]:
        """The decodes after `request` in `running`: how many, and the blocks they need."""
        behind = False
        decodes = blocks = 0
        for r in running:
            if behind and tokens_to_compute(r) == 1:
                decodes += 1
                blocks += decode_need(r, self.held(r.request_id), self.block_size)
            behind = behind or r is request
        return decodes, blocks
