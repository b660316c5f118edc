"""Roles in a pool, end to end (kopf against kmock, engines that answer `/v1/load` and
`PUT /v1/role`): each engine gets its role as it starts serving, an idle decode engine flips
to prefill while the prefill engine is busy (drained first, its state on the pod), and an
operator restarted in the middle of the flip finishes it.
"""

from __future__ import annotations

import asyncio

import pytest
from operator_fakes import Emulator, FakeEngine, ReplicaSets
from operator_kit import POOLS, Operator, create, events, eventually, get, pool
from operator_prom import Prometheus

from interlude_operator.deployment import engine_args
from interlude_operator.flips import FLIP_TO
from interlude_operator.pods import DRAINING_LABEL, ROLE_LABEL
from interlude_operator.spec import parse

ROLES = {
    "enabled": True,
    "prefill": 1,
    "kvLinkVia": "host",
    "flips": {"windowSeconds": 2, "idleBelow": 0.1, "minPerRole": 1},
}


def labels(api: Emulator, pod: str) -> dict[str, str]:
    return dict((get(api, "v1/pods", pod) or {}).get("metadata", {}).get("labels") or {})


def annotations(api: Emulator, pod: str) -> dict[str, str]:
    return dict((get(api, "v1/pods", pod) or {}).get("metadata", {}).get("annotations") or {})


@pytest.mark.asyncio
async def test_roles_are_given_and_an_idle_engine_flips_across_a_restart(
    api: Emulator, prometheus: Prometheus, operator: Operator, replicasets, port: int
) -> None:
    rs: ReplicaSets = await replicasets("pd-engine")
    # As the Deployment starts them (--role=decode); a session each keeps them from draining.
    rs.load = {"kv": 0.1, "role": "decode", "sessions": {"awaiting_tool": 1}}
    await operator.start()
    spec = {"minReplicas": 3, "maxReplicas": 3, "replicas": 3, "roles": ROLES}
    await create(api, POOLS, pool("pd", port, prometheus.url, **spec))
    dep = await eventually(lambda: get(api, "apps/v1/deployments", "pd-engine"), "the Deployment")
    assert {"--kv-link", "--kv-link-via=host", "--role=decode"} <= set(
        dep["spec"]["template"]["spec"]["containers"][0]["args"]
    )

    # One engine is made prefill, every one is labelled with its role.
    await eventually(
        lambda: len(rs.engines) == 3 and all(labels(api, p).get(ROLE_LABEL) for p in rs.engines),
        "every engine's role label",
        15,
    )
    prefill = [n for n, e in rs.engines.items() if e.role_calls == ["prefill"]]
    assert len(prefill) == 1 and labels(api, prefill[0])[ROLE_LABEL] == "prefill"
    decodes = [n for n in rs.engines if n not in prefill]
    assert all(labels(api, n)[ROLE_LABEL] == "decode" for n in decodes)
    await eventually(lambda: len(events(api, "RoleAssigned")) == 3, "an event per role given")
    rs.engines[prefill[0]].set(queued_prefill_tokens=4096, busy_share=1.0)  # busy

    # The decode engines are idle (nothing running): after the window one starts to drain
    # towards prefill; the other, now the last decode engine, stays.
    flipping = await eventually(
        lambda: [n for n in decodes if annotations(api, n).get(FLIP_TO) == "prefill"],
        "a decode engine draining towards prefill",
        15,
    )
    [leaving] = flipping
    [staying] = [n for n in decodes if n != leaving]
    assert labels(api, leaving).get(DRAINING_LABEL) == "true"
    assert labels(api, leaving)[ROLE_LABEL] == "decode"  # its session still lives there
    for _ in range(12):  # the mark holds pass after pass (the scaler's marks leave it be)
        await asyncio.sleep(0.2)
        assert labels(api, leaving).get(DRAINING_LABEL) == "true"
    assert rs.engines[leaving].role_calls == [] and FLIP_TO not in annotations(api, staying)
    assert len(rs.engines) == 3  # a flip is not a scale-down: the engine stays

    await operator.stop()  # mid-flip: all that is left of it is on the pod
    rs.engines[leaving].set(sessions={"finished": 1})
    await operator.start()
    await eventually(lambda: rs.engines[leaving].role_calls == ["prefill"], "the flip", 15)
    rs.engines[leaving].set(queued_prefill_tokens=4096, busy_share=1.0)  # busy in its new role
    await eventually(
        lambda: (
            labels(api, leaving).get(ROLE_LABEL) == "prefill"
            and DRAINING_LABEL not in labels(api, leaving)
            and FLIP_TO not in annotations(api, leaving)
        ),
        "the flipped engine serving as prefill",
        15,
    )
    await eventually(lambda: len(events(api, "RoleFlipped")) == 1, "the RoleFlipped event")
    assert len(events(api, "RoleFlipStarted")) == 1
    assert rs.engines[staying].role_calls == [] and labels(api, staying)[ROLE_LABEL] == "decode"


@pytest.mark.asyncio
async def test_a_pool_with_roles_scales_each_role_on_its_own_engines(
    api: Emulator, prometheus: Prometheus, operator: Operator, replicasets, port: int
) -> None:
    """The decode engines' KV asks for one more engine though the pool's mean would not (the
    prefill engine's KV is freed as each prompt leaves); it serves as decode. Then prompts
    queue on the prefill engine, and the next engine is made prefill."""
    rs: ReplicaSets = await replicasets("sc-engine")
    rs.load = {"kv": 0.8, "role": "decode", "busy_share": 1.0}  # at target, never idle
    await operator.start()
    roles = {**ROLES, "flips": {"enabled": False}}
    spec = {"minReplicas": 2, "maxReplicas": 4, "replicas": 2, "roles": roles}
    await create(api, POOLS, pool("sc", port, prometheus.url, **spec))
    await eventually(
        lambda: len(rs.engines) == 2 and all(labels(api, p).get(ROLE_LABEL) for p in rs.engines),
        "two engines with their roles",
        15,
    )
    by_role = {labels(api, n)[ROLE_LABEL]: n for n in rs.engines}
    rs.engines[by_role["prefill"]].set(kv=0.0)  # its prompts' KV has left
    rs.engines[by_role["decode"]].set(kv=0.97)  # the pool's mean, 0.485, is under 0.85
    await eventually(
        lambda: len(rs.engines) == 3 and all(labels(api, p).get(ROLE_LABEL) for p in rs.engines),
        "a third engine, labelled",
        20,
    )
    [third] = [n for n in rs.engines if n not in by_role.values()]
    assert labels(api, third)[ROLE_LABEL] == "decode" and rs.engines[third].role_calls == []
    for name in (by_role["decode"], third):
        rs.engines[name].set(kv=0.8)
    rs.engines[by_role["prefill"]].set(waiting=20)  # 20 prompts over a target of 8 per engine
    await eventually(
        lambda: len(rs.engines) == 4 and all(labels(api, p).get(ROLE_LABEL) for p in rs.engines),
        "a fourth engine, labelled",
        20,
    )
    [fourth] = [n for n in rs.engines if n not in (*by_role.values(), third)]
    assert labels(api, fourth)[ROLE_LABEL] == "prefill"
    assert rs.engines[fourth].role_calls == ["prefill"]


def test_roles_need_sound_values_and_put_the_kv_link_on_the_engines() -> None:
    base = {"minReplicas": 1, "maxReplicas": 2, "model": {"source": "tiny"}}
    assert parse(base).roles.enabled is False
    assert "--kv-link" not in engine_args(parse(base))
    args = engine_args(parse(base | {"roles": {"enabled": True}}))
    assert {"--kv-link", "--kv-link-via=nixl", "--role=decode"} <= set(args)
    bad = [
        ({"prefill": 0}, "roles.prefill"),
        ({"kvLinkVia": "rdma"}, "roles.kvLinkVia"),
        ({"flips": {"windowSeconds": 0}}, "windowSeconds"),
        ({"flips": {"idleBelow": 1.5}}, "idleBelow"),
        ({"flips": {"minPerRole": 0}}, "minPerRole"),
    ]
    for roles, field in bad:
        with pytest.raises(ValueError, match=field):
            parse(base | {"roles": {"enabled": True, **roles}})


def test_a_fake_engine_takes_a_role_as_the_engine_does() -> None:
    engine = FakeEngine("127.0.0.40", 18599, "llm", "e", role="decode")
    try:
        engine.take_role("prefill")
        assert engine.load()["role"] == "prefill" and engine.role_calls == ["prefill"]
    finally:
        engine.stop()
