"""vLLM's per-token logprobs as the session's events carry them (`TokenLogprob`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from interlude.api.events import LOGPROB_FLOOR, TokenLogprob


def token_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, top: int
) -> list[TokenLogprob]:
    """One entry per sampled token: its logprob and the `top` most likely tokens (by vLLM's
    rank). vLLM gives each position the top tokens plus the sampled one; [] without logprobs."""
    if not logprobs:
        return []
    out = []
    for tid, ranked in zip(token_ids, logprobs, strict=False):
        sampled = ranked.get(tid)
        if sampled is None:  # vLLM always includes the sampled token; be safe if not
            continue
        best = sorted(ranked.values(), key=lambda lp: lp.rank or math.inf)[:top]
        out.append(
            TokenLogprob(
                _text(sampled.decoded_token),
                _finite(sampled.logprob),
                tuple((_text(lp.decoded_token), _finite(lp.logprob)) for lp in best),
            )
        )
    return out


def _finite(logprob: float) -> float:
    return max(float(logprob), LOGPROB_FLOOR)


def _text(token: str | None) -> str:
    return token or ""
