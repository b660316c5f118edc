"""`interlude` with its admission changed, for comparisons (docs/policies.md): not among
`POLICIES`, run by import path, e.g.
`interlude bench sim --policies interlude,interlude.policy.variants:ReserveDynamic`."""

from __future__ import annotations

from interlude.policy.interlude_policy import InterludeConfig, InterludePolicy
from interlude.policy.profile import Profile


class ReserveDynamic(InterludePolicy):
    """Admission by TetriInfer's reserve-dynamic rule (`admission.reserve_dynamic_limit`)."""

    name = "interlude-reserve-dynamic"

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile, InterludeConfig(admission="reserve-dynamic"))


class Greedy(InterludePolicy):
    """Admission of whatever fits (headroom 0), as vLLM admits."""

    name = "interlude-greedy"

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile, InterludeConfig(headroom=0.0))
