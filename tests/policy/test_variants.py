"""`interlude`'s variants for comparisons (policy/variants.py): the oracle ranks by the trace's
truth where `interlude` ranks by its per-kind estimates, and changes nothing else."""

from __future__ import annotations

from interlude.policy import load_profile, make_policy
from interlude.policy.variants import Oracle
from interlude.sim.request import SimRequest
from interlude_workloads import Segment, TraceCall, TraceRequest


def test_the_oracle_ranks_by_the_true_lengths_and_durations() -> None:
    p = load_profile("gptj-6b-a100-40g")
    trace = TraceRequest("a", "chat", 10, (Segment(500, TraceCall("t", 7.0, 3)), Segment(5, None)))
    r = SimRequest("a", trace, 0.0)
    oracle, means = Oracle(p), make_policy("interlude", p)
    assert oracle.tokens_ahead(r) == 500.0 and oracle.call_duration(r) == 7.0
    # Nothing learned yet: interlude's estimates are its priors, not the truth.
    assert means.tokens_ahead(r) == 100.0 and means.call_duration(r) == 1.0
    r.generated_tokens = 120
    assert oracle.tokens_ahead(r) == 380.0
