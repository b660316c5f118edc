"""Which of the operator's replicas acts: kopf's peering, the oldest replica first (pure).

Replicas that run with a peering object (`--peering`) each keep an entry in its status, renewed
within kopf's peering lifetime (60 s). kopf pauses a replica while a live peer of a *higher*
priority exists, and pauses every replica when two share the highest one; a paused replica
watches nothing and runs no timer, so it makes no decision and no write. A replica starts
paused until it has read the peering object.

`seniority` makes the priority the start time, the older the higher: a replica that starts
beside a running one stays paused behind it, so a rollout or a second replica never gives two
acting at once; when the active one stops cleanly kopf removes its entry and the next oldest
resumes at once, and when it dies its entry expires after the lifetime. A restarted process
keeps its pod's identity (`POD_ID`) and so replaces its old entry with a younger one.

What peering is not: a lease the active replica must hold to write. A replica cut off from the
API server keeps acting until it notices nothing, while the others take over when its entry
expires; its writes then fail their resourceVersion precondition (`kube.conditional`) rather
than overwrite what the new active replica wrote.
"""

from __future__ import annotations

# Ties within one millisecond are broken by a random part below this.
JITTER = 1000


def seniority(started_ns: int, jitter: int) -> int:
    """kopf's peering priority for a replica started at `started_ns` (ns since the epoch):
    older is higher. `jitter` in [0, JITTER) tells apart two started in the same millisecond
    (kopf would pause both). Within 2**53, so the number survives any JSON reader."""
    if not 0 <= jitter < JITTER:
        raise ValueError(f"jitter must be within [0, {JITTER}), got {jitter}")
    return -((started_ns // 1_000_000) * JITTER + jitter)
