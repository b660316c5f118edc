"""The simulator's cluster (sim/cluster.py): one mixed engine in it is the lone simulator,
requests join an engine no later than an iteration after they arrive, prefill and decode
engines conserve every block and token, a prompt's KV crosses the link once and its first token
is sampled on the decode engine, and a resumed session without KV is prefilled elsewhere only
with TetriInfer's rule."""

from __future__ import annotations

import pytest

from interlude.bench.cluster_pd import capacity_rps, class_pool
from interlude.policy import load_profile, make_policy
from interlude.policy.flips import FlipRule
from interlude.sim.cluster import Cluster, ClusterMetrics, ClusterSpec
from interlude.sim.config import SimConfig
from interlude.sim.request import SimRequest
from interlude.sim.simulator import Simulator
from interlude_workloads import Arrival, Segment, TraceRequest, poisson_arrivals, resolve_workload

P = load_profile("gptj-6b-a100-40g")


def agents(rate: float, duration: float, seed: int = 0) -> list[Arrival]:
    return poisson_arrivals(resolve_workload("generated:mixed", seed), rate, duration, seed)


def cluster(
    arrivals: list[Arrival], roles: tuple[str, ...], policy: str = "interlude", **kw: object
) -> Cluster:
    spec = ClusterSpec(roles, horizon_s=600.0, check_integrity=True, **kw)  # type: ignore[arg-type]
    return Cluster(P, lambda p: make_policy(policy, p), arrivals, spec, rate=1.0)


def test_one_mixed_engine_in_a_cluster_is_the_lone_simulator() -> None:
    arrivals = agents(5.0, 60.0)
    lone = Simulator(P, make_policy("interlude", P), arrivals, SimConfig(horizon_s=600.0), 1.0)
    alone = lone.run()
    together = cluster(arrivals, ("mixed",)).run()
    assert together.run == alone
    assert together.remote_prefills == together.linked_tokens == 0
    assert alone.finished == len(arrivals) > 200


def test_requests_join_an_engine_within_an_iteration_of_arriving() -> None:
    """Engines run ahead of each other only to the next moment anything can reach them."""
    arrivals = poisson_arrivals(class_pool("LPLD", 0), 20.0, 30.0, 0)
    c = cluster(arrivals, ("mixed", "mixed", "prefill", "decode"))
    m = c.run()
    assert m.run.unfinished == 0
    assert all(b > 0 for b in m.busy_fraction)  # every engine got work
    step = P.t_fwd(P.max_batched_tokens)
    # `queue_time` is a request's last entry into a queue: on a mixed engine, when it arrived
    # (none is preempted at this load); on a decode engine, when its KV landed.
    on_mixed = [r for r in c.requests if c.roles[c.home[r.request_id]] == "mixed"]
    assert len(on_mixed) > 0.3 * len(arrivals)
    assert max(r.queue_time - r.arrival for r in on_mixed) <= step
    assert min(r.queue_time - r.arrival for r in on_mixed) >= 0


def test_prefill_and_decode_engines_hand_every_prompt_over_once() -> None:
    pool = class_pool("HPLD", 0)
    arrivals = poisson_arrivals(pool, 4.0, 30.0, 0)
    c = cluster(arrivals, ("prefill", "decode", "decode"))
    land = c._land
    ahead: list[float] = []  # how far the decode engine's clock ran past each landing

    def landing(r: SimRequest, home: int, at: float) -> None:
        ahead.append(c.engines[home].now - at)
        land(r, home, at)

    c._land = landing  # type: ignore[method-assign]
    m = c.run()
    assert len(ahead) == len(arrivals)
    assert max(ahead) <= P.t_fwd(P.max_batched_tokens)  # no engine runs far past a hand-off
    assert m.run.unfinished == 0 and m.run.recomputed_tokens == 0
    # Every prompt is over the remote-prefill minimum: prefilled remotely, its KV less the
    # last token (the decode engine computes it to sample) crossed the link, none swapped.
    assert m.remote_prefills == len(arrivals)
    assert m.linked_tokens == sum(a.request.prompt_tokens - 1 for a in arrivals)
    assert m.run.swapped_tokens == 0
    assert {c.home[r.request_id] for r in c.requests} == {1, 2}


def test_the_first_token_waits_for_the_kv_to_cross() -> None:
    arrivals = poisson_arrivals(class_pool("HPLD", 0), 1.0, 20.0, 0)
    fast = cluster(arrivals, ("prefill", "decode")).run()
    slow = cluster(arrivals, ("prefill", "decode"), link_bytes_per_s=1e9).run()
    # 1,024-4,096 tokens x 0.5 MiB (GPT-J) at 1 GB/s: 0.5-2.1 s more before the first token.
    assert slow.run.ttft_mean > fast.run.ttft_mean + 0.5
    assert slow.run.unfinished == fast.run.unfinished == 0


def test_short_prompts_are_prefilled_on_the_decode_engine() -> None:
    short = TraceRequest("short", "chat", 20, (Segment(5, None),))
    arrivals = [Arrival(0.1 * i, short, f"{i}:short") for i in range(10)]
    m = cluster(arrivals, ("prefill", "decode")).run()
    assert m.remote_prefills == 0 and m.linked_tokens == 0 and m.run.finished == 10
    assert m.busy_fraction[0] == 0.0


@pytest.mark.parametrize("resume_prefill", [False, True])
def test_resumed_sessions_without_kv_go_to_prefill_only_with_the_rule(resume_prefill: bool) -> None:
    # vllm's policy drops every paused session's KV: each resume recomputes its context.
    arrivals = agents(2.0, 60.0)
    c = cluster(arrivals, ("prefill", "decode"), policy="vllm", resume_prefill=resume_prefill)
    m = c.run()
    assert m.run.unfinished == 0
    new = sum(1 for a in arrivals if a.request.prompt_tokens >= 64)
    resumed_long = m.remote_prefills - new
    if resume_prefill:
        assert resumed_long > 0.5 * sum(a.request.num_calls for a in arrivals)
    else:
        assert resumed_long == 0
    assert m.resumes_timed > 0


def test_a_cluster_spec_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="one of"):
        ClusterSpec(("mixed", "decoder"))
    with pytest.raises(ValueError, match="need a decode or mixed"):
        ClusterSpec(("prefill",))
    with pytest.raises(ValueError, match="serve decode engines"):
        ClusterSpec(("prefill", "mixed"))
    with pytest.raises(ValueError, match="decode_rule"):
        ClusterSpec(("mixed", "mixed"), decode_rule="biggest")


def flipping(klass: str, load: float, roles: tuple[str, ...], flips: bool) -> ClusterMetrics:
    p = load_profile("llama3-8b-h100")
    rate = load * capacity_rps(p, klass, len(roles))
    arrivals = poisson_arrivals(class_pool(klass, 0), rate, 90.0, 0)
    rule = FlipRule(window_s=20.0, idle_below=0.1) if flips else None
    spec = ClusterSpec(roles, horizon_s=180.0, check_integrity=True, flips=rule, flip_every_s=5.0)
    return Cluster(p, lambda q: make_policy("interlude", q), arrivals, spec, rate).run()


def test_an_idle_prefill_engine_flips_and_each_role_keeps_an_engine() -> None:
    """The operator's rule on simulated engines: an engine busy under a tenth of the time for
    the window drains and changes role; the last engine of a role stays."""
    roles = ("prefill", "prefill", "decode", "decode")
    m = flipping("LPHD", 0.1, roles, flips=True)
    assert m.run.unfinished == 0
    assert m.flips and m.flips[0][1] in (0, 1) and m.flips[0][2] == "decode"
    now = list(roles)
    for _, engine, role in m.flips:
        now[engine] = role
        assert "prefill" in now and "decode" in now
    assert flipping("LPHD", 0.1, roles, flips=False).flips == ()


def test_engines_that_compute_most_of_the_time_do_not_flip() -> None:
    """Heavy prompts at 60 %: one prefill engine computes without pause and the decode engines
    step through their decodes. Read by queue length or running count, as the operator first
    did, they looked idle and flipped; by busy time they do not."""
    m = flipping("HPLD", 0.6, ("prefill", "decode", "decode", "decode"), flips=True)
    assert m.flips == ()
    assert min(m.busy_fraction) > 0.1
