"""What one simulator step adds to the run's waste and busy-time sums (`metrics.Accounting`).

Kept apart from the loop (`engine.py`) so the loop reads as the engine's step, and this as
DESIGN section 4's waste equations: memory held by paused requests (preserve), memory held by
everyone while the GPU recomputes dropped KV (recompute), and memory held while a synchronous
swap stalls the batch (stall).
"""

from __future__ import annotations

from interlude.sim.batch import Batch
from interlude.sim.kv import KVBook
from interlude.sim.metrics import Accounting
from interlude.sim.skip import block_growth


def account_step(
    acc: Accounting,
    batch: Batch,
    dt: float,
    k: int,
    stall: float,
    kv: KVBook,
    block_bytes: int,
    contended: bool,
) -> None:
    """Add `k` identical iterations of `dt` seconds (`stall` of them a swap's stall) to `acc`;
    `contended`: requests queue for memory meanwhile. Side effects: `acc` only."""
    span = k * dt
    acc.busy_s += span
    acc.iterations += k
    acc.steps += 1
    held = span * kv.paused_gpu * block_bytes
    acc.waste_preserve += held
    if contended:
        acc.waste_contended += held
    used = kv.gpu_total - kv.gpu_free
    acc.waste_stall += stall * used * block_bytes
    if k > 1 and batch.chunks:
        # A repeated chunk: memory in use and recomputed tokens change per iteration.
        x, n, _ = batch.chunks[0]
        growth = block_growth(batch, kv)
        reserved = growth(1)[0]
        for i in range(1, k + 1):
            rec = (
                batch.recompute_tokens if i == 1 else min(n, max(0, x.recompute_left - (i - 2) * n))
            )
            if rec:
                dec, chunk = growth(i)
                share = dt * rec / batch.tokens
                acc.recompute_s += share
                acc.waste_recompute += share * (used + dec - reserved + chunk) * block_bytes
        return
    if batch.recompute_tokens:
        share = (dt - stall) * batch.recompute_tokens / batch.tokens
        acc.recompute_s += share * k
        acc.waste_recompute += share * k * used * block_bytes
