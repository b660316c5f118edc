"""TetriInfer's decode placement (Hu et al., "Inference without Interference", section 3.4),
pure: the decode engines' loads and a request's needs in, the engine to send it to out.

A request's decode is *heavy* when its predicted length (the length predictor's bucket,
`interlude.lengthpred`) reaches `heavy_tokens`, else light. Heavy decodes hold their KV for
long and grow it: an engine full of them leaves light requests waiting for memory. The rule
(`heavy-light`): among the engines with room for the prompt plus the predicted length's lower
end, draw two at random and take the one whose decodes are the smaller share heavy (ties: the
more room). `predicted-work` draws two and takes the fewer decode tokens predicted still to
come (each request's predicted class's mean length less what it has made), `least-loaded` draws
two and takes the fewer decodes, `random` draws one among those with room, and `worst` takes the
largest heavy share (the imbalance the rule prevents: a bound, not a policy anyone should run).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

RULES = ("heavy-light", "predicted-work", "least-loaded", "random", "worst")


@dataclass(frozen=True)
class DecodeLoad:
    """One decode engine: its free KV room in tokens and the decodes it holds by class."""

    free_tokens: int
    heavy: int
    light: int
    predicted_tokens: float = 0.0  # decode tokens its requests are predicted still to make

    @property
    def heavy_share(self) -> float:
        """The share of its decodes that are heavy (0 for an empty engine)."""
        total = self.heavy + self.light
        return self.heavy / total if total else 0.0


def choose_decode(
    loads: Sequence[DecodeLoad], need_tokens: int, rng: random.Random, rule: str = "heavy-light"
) -> int | None:
    """The index of the engine to place a decode needing `need_tokens` of room on; None when no
    engine has the room (the caller queues it, or takes the roomiest anyway)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    fit = [i for i, load in enumerate(loads) if load.free_tokens >= need_tokens]
    if not fit:
        return None
    if rule == "worst":
        return max(fit, key=lambda i: (loads[i].heavy_share, loads[i].heavy))
    if rule == "random" or len(fit) == 1:
        return rng.choice(fit)
    a, b = rng.sample(fit, 2)
    if rule == "least-loaded":
        return min((a, b), key=lambda i: (loads[i].heavy + loads[i].light, -loads[i].free_tokens))
    if rule == "predicted-work":
        return min((a, b), key=lambda i: (loads[i].predicted_tokens, -loads[i].free_tokens))
    return min((a, b), key=lambda i: (loads[i].heavy_share, -loads[i].free_tokens))
