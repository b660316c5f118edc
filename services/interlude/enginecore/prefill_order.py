"""A prefill engine's jobs: the prompts it prefills for decode engines (TetriInfer section 3.3).

A prefill job is a request whose `kv_transfer_params` say `do_remote_decode`: one prompt, one
token, and its KV handed on (kvlink.py). TetriInfer ranks them shortest-job-first by prompt
length, its best, within *scheduling batches*: jobs are grouped by arrival into batches of
`batch`, a batch runs before the next, and within one the shorter prompt goes first, so a long
prompt waits behind at most a batch of shorter ones that came after it. Prefill jobs rank ahead
of sessions (a prefill engine serves a session only when it is the model's last engine) and
behind swap-ins (class 0, `scheduler._ranked`). The simulator has no prefill engines yet: this
order is the engine's alone (docs/disaggregation.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from vllm.v1.request import Request

from interlude.enginecore.kvlink import wants_remote_decode

PREFILL_CLASS = 0.5  # between swap-ins (0) and everything else (1), `scheduler._ranked`'s
SCHEDULING_BATCH = 16


class PrefillOrder:
    """Queue keys of prefill jobs. Invariant: a job keeps its batch for as long as it is known
    (re-keying, after a preemption or a rescore, gives the same key)."""

    def __init__(self, batch: int = SCHEDULING_BATCH) -> None:
        if batch < 1:
            raise ValueError(f"PrefillOrder: batch must be >= 1, got {batch}")
        self.batch = batch
        self._seq: dict[str, int] = {}
        self._next = itertools.count()

    def key(self, r: Request) -> tuple[float, ...] | None:
        """The job's key; None for a request that is not a prefill job."""
        if not wants_remote_decode(r):
            return None
        seq = self._seq.get(r.request_id)
        if seq is None:
            seq = self._seq[r.request_id] = next(self._next)
        return (PREFILL_CLASS, float(seq // self.batch), float(r.num_prompt_tokens), float(seq))

    def forget(self, request_id: str) -> None:
        self._seq.pop(request_id, None)


def queued_prefill_tokens(requests: Iterable[Request]) -> int:
    """Prompt tokens not computed yet over `requests`: a prefill engine's load (the gateway
    places prefills by it)."""
    return sum(
        r.num_prompt_tokens - r.num_computed_tokens
        for r in requests
        if r.num_computed_tokens < r.num_prompt_tokens
    )
