"""`interlude` with its admission, its ranking or its ranking's lengths changed, and Continuum's
knobs swept, for comparisons (docs/policies.md): not among `POLICIES`, run by import path, e.g.
`interlude bench sim --policies interlude,interlude.policy.variants:ReserveDynamic`."""

from __future__ import annotations

from interlude.policy.continuum import PRIOR_MEAN_S, RELEASED_TTL_S, ContinuumPolicy
from interlude.policy.infercept import InferCeptPolicy
from interlude.policy.interlude_config import InterludeConfig
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.profile import Profile
from interlude.policy.types import BatchMode, Phase, RequestView, SwapMode, Traits


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


class Oracle(InterludePolicy):
    """Ranking by the trace's true segment lengths and call durations instead of the per-kind
    means (the simulator knows them; `RequestView.oracle_*`): the most a length predictor
    (TetriInfer's, `interlude.lengthpred`) could add to the ranking. The handling of paused
    requests keeps its learned estimates."""

    name = "interlude-oracle"

    def tokens_ahead(self, r: RequestView) -> float:
        truth = r.oracle_gen_tokens
        if truth is None:
            return super().tokens_ahead(r)
        return 0.0 if r.phase is Phase.PAUSED else float(max(0, truth - r.generated_tokens))

    def call_duration(self, r: RequestView) -> float:
        truth = r.oracle_call_s
        return super().call_duration(r) if truth is None else truth


class Rekeyed(InterludePolicy):
    """`interlude`'s handling and admission with LAMPS's ranking: every queued request keyed
    again at each iteration from that iteration's batch, the handling in the key the three
    wastes' argmin (`rekeyed.RekeyedKeys`, `lamps`'s code). Same rates in the simulator, a lower
    p99 past each edge; on the engine new conversations waited longer (docs/policies.md,
    "LAMPS's ranking re-keyed")."""

    name = "interlude-rekeyed"
    traits = Traits(batch_mode=BatchMode.CHUNKED, rescore_queued=True)


class InferCeptSyncSwap(InferCeptPolicy):
    """InferCept's handling and batching with the synchronous swap of its paper's Swap baseline
    (the batch stalls for every copy) instead of its budgeted one; it still copies within the
    step's swap budget, so a long context leaves in pieces. The policy whose time is most the
    host link's, for checking the emulated link against the simulator's (`bench sim-check`,
    docs/simulator.md)."""

    name = "infercept-sync-swap"
    traits = Traits(batch_mode=BatchMode.CHUNKED, swap_mode=SwapMode.SYNC)


# Continuum at other settings of its two TTL rules' one knob each (docs/policies.md, "Continuum
# swept"): the released code's fixed TTL (2 s there: `continuum-fixed-ttl`) and the paper's
# estimator's cold-start prior mean (1 s there: `continuum`).
class _FixedTtl(ContinuumPolicy):
    ttl_s = RELEASED_TTL_S

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile, fixed_ttl_s=self.ttl_s)


class FixedTtl05(_FixedTtl):
    name = "continuum-fixed-ttl-0.5"
    ttl_s = 0.5


class FixedTtl1(_FixedTtl):
    name = "continuum-fixed-ttl-1"
    ttl_s = 1.0


class FixedTtl4(_FixedTtl):
    name = "continuum-fixed-ttl-4"
    ttl_s = 4.0


class FixedTtl8(_FixedTtl):
    name = "continuum-fixed-ttl-8"
    ttl_s = 8.0


class _Prior(ContinuumPolicy):
    prior_s = PRIOR_MEAN_S

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile, prior_mean_s=self.prior_s)


class Prior025(_Prior):
    name = "continuum-prior-0.25"
    prior_s = 0.25


class Prior4(_Prior):
    name = "continuum-prior-4"
    prior_s = 4.0
