"""A prefill engine's jobs in the engine's scheduler: the prompts it prefills for decode engines.

A prefill job is a request whose `kv_transfer_params` say `do_remote_decode`: one prompt, one
token, and its KV handed on (kvlink.py). Their order is TetriInfer's, `policy.prefill_jobs`'s
`PrefillBatches` (the simulator's prefill engines run the same rule): scheduling batches by
arrival, the shortest prompt first within one. Prefill jobs rank ahead of sessions (a prefill
engine serves a session only when it is the model's last engine) and behind swap-ins (class 0,
`queue.ranked`).
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm.v1.request import Request

from interlude.enginecore.kvlink import wants_remote_decode
from interlude.policy.prefill_jobs import SCHEDULING_BATCH, PrefillBatches

PREFILL_CLASS = 0.5  # between swap-ins (0) and everything else (1), `queue.ranked`'s


class PrefillOrder:
    """Queue keys of prefill jobs (`PrefillBatches` behind the class of prefill jobs)."""

    def __init__(self, batch: int = SCHEDULING_BATCH) -> None:
        self.batches = PrefillBatches(batch)

    def key(self, r: Request) -> tuple[float, ...] | None:
        """The job's key; None for a request that is not a prefill job."""
        if not wants_remote_decode(r):
            return None
        return (PREFILL_CLASS, *self.batches.key(r.request_id, r.num_prompt_tokens))

    def forget(self, request_id: str) -> None:
        self.batches.forget(request_id)


def queued_prefill_tokens(requests: Iterable[Request]) -> int:
    """Prompt tokens not computed yet over `requests`: a prefill engine's load (the gateway
    places prefills by it)."""
    return sum(
        r.num_prompt_tokens - r.num_computed_tokens
        for r in requests
        if r.num_computed_tokens < r.num_prompt_tokens
    )
