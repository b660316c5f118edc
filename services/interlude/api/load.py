"""How a router reads an engine's load (`GET /v1/load`): one rule for the gateway's placement
and the simulator's cluster (`sim/cluster.py`), so the two place alike."""

from __future__ import annotations


def placement_score(
    kv_usage: float, contended_waste: float, waiting: float, max_num_seqs: float
) -> float:
    """Lower is better: the share of KV in use, the waste held while others wait, and the
    queue per sequence slot, so neither a full engine nor a waiting queue attracts more work."""
    return kv_usage + contended_waste + waiting / max(1.0, max_num_seqs)
