"""Roles in a pool (`spec.roles`): each engine's role as it starts serving, and flips of idle
engines to the other role. `interlude.policy.flips` decides; this module reads the engines and
writes.

Every engine of such a pool starts as a decode engine with the KV link (deployment.py). As an
engine first serves, it gets the prefill role while fewer engines hold it than `roles.prefill`,
or than the scaler wants when prompts queue (`decide.recommend_by_role`),
and the `interlude.dev/role` label either way; so does an engine whose process restarted (it
reports its start role under the label of the role it had). Then, with flips on, each pass
steps every labelled engine through `flips.step` on its `/v1/load`: the flip state goes to the pod's
annotations (so an operator that restarts mid-flip goes on from there), the draining label
follows the step (the gateway sends a draining engine nothing new), and a drained engine gets
its new role by `PUT /v1/role`, then the label, then it serves again.

Side effects: HTTP to the engines (`EngineCalls`), pod patches through `kube`, an event through
`post` for each role given, flip started and flip done.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import aiohttp

from interlude.api.cluster import DRAINING_LABEL
from interlude.policy.flips import FlipRule, FlipState, step
from interlude_operator.flips import annotations_of, load_of
from interlude_operator.kube import Kube, pod_path
from interlude_operator.pods import ROLE_LABEL, EnginePod
from interlude_operator.spec import Roles

GATEWAY_TOKEN_ENV = "INTERLUDE_GATEWAY_TOKEN"
GATEWAY_TOKEN_HEADER = "x-interlude-gateway-token"  # api.engine.GATEWAY_TOKEN_HEADER

Post = Callable[[str, str, str], None]


class EngineCalls(Protocol):
    """What the operator asks an engine. Side effects: HTTP only; failures are None / False."""

    async def load(self, ip: str, port: int) -> Mapping[str, Any] | None: ...

    async def set_role(self, ip: str, port: int, role: str) -> bool: ...


class HttpEngineCalls:
    """`EngineCalls` over HTTP, with the gateway token the engines take a role change with."""

    def __init__(self, token: str | None = None, timeout_s: float = 3.0) -> None:
        self.token = os.environ.get(GATEWAY_TOKEN_ENV, "") if token is None else token
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {GATEWAY_TOKEN_HEADER: self.token} if self.token else {}
            self._session = aiohttp.ClientSession(timeout=self.timeout, headers=headers)
        return self._session

    async def load(self, ip: str, port: int) -> Mapping[str, Any] | None:
        try:
            async with self._http().get(f"http://{ip}:{port}/v1/load") as r:
                return dict(await r.json()) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def set_role(self, ip: str, port: int, role: str) -> bool:
        try:
            async with self._http().put(f"http://{ip}:{port}/v1/role", json={"role": role}) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def roles_pass(
    kube: Kube,
    namespace: str,
    serving: Sequence[EnginePod],
    roles: Roles,
    calls: EngineCalls,
    post: Post,
    now: float,
    port: int,
    prefill: int | None = None,
) -> set[str]:
    """One pass over the serving engines; the names of those draining for a flip (the scaler
    must neither pick them nor take their draining label off). `now`: epoch seconds (kept in
    annotations, so it must survive a restart); `prefill`: how many engines new ones are made
    prefill up to (default `roles.prefill`; the scaler raises it when prompts queue)."""
    target = roles.prefill if prefill is None else prefill
    ready = [p for p in serving if p.ready and p.ip]
    answers = await asyncio.gather(*(calls.load(p.ip, port) for p in ready))
    loads = {p.name: dict(a) for p, a in zip(ready, answers, strict=True) if a is not None}
    roles_now = Counter(str(load.get("role", "mixed")) for load in loads.values())
    assigned: set[str] = set()
    for p in ready:
        # New, or its engine restarted in its start role under an old label: (re)assigned.
        fresh = p.role != str(loads.get(p.name, {}).get("role", p.role))
        if p.name in loads and (not p.role or fresh) and p.flip.flip_to is None:
            role = await _assign(
                kube, namespace, p, loads[p.name], target, roles_now, calls, post, port
            )
            loads[p.name] = {**loads[p.name], "role": role}
            assigned.add(p.name)
    if not roles.flips:
        return set()
    rule = FlipRule(roles.window_s, roles.idle_below, roles.min_per_role)
    counts = Counter(
        str(loads[p.name].get("role")) for p in ready if p.name in loads and p.flip.flip_to is None
    )
    flipping: set[str] = set()
    for p in ready:
        # An engine given its role in this pass is stepped from the next (its pod is stale).
        if p.role and p.name in loads and p.name not in assigned:
            load = load_of(loads[p.name])
            out = step(load, p.flip, counts, now, rule)
            if out.state.flip_to is not None and p.flip.flip_to is None:
                counts[load.role] -= 1  # leaving: the next engine of its role may not
                post("Normal", "RoleFlipStarted", f"engine {p.name} {out.reason}")
            if out.set_role is not None and await calls.set_role(p.ip, port, out.set_role):
                post("Normal", "RoleFlipped", f"engine {p.name} is now {out.set_role}")
            await _record(kube, namespace, p, out.state, out.drain, load.role)
            if out.drain:
                flipping.add(p.name)
    return flipping


async def _assign(
    kube: Kube,
    namespace: str,
    pod: EnginePod,
    load: Mapping[str, Any],
    prefill: int,
    roles_now: Counter[str],
    calls: EngineCalls,
    post: Post,
    port: int,
) -> str:
    """Give a newly serving engine its role: prefill while fewer than `prefill` engines are;
    the role."""
    role = str(load.get("role", "mixed"))
    if role == "decode" and roles_now["prefill"] < prefill:
        if not await calls.set_role(pod.ip, port, "prefill"):
            return role  # unreachable now: the next pass tries again
        roles_now["decode"] -= 1
        roles_now["prefill"] += 1
        role = "prefill"
    await kube.patch(pod_path(namespace, pod.name), {"metadata": {"labels": {ROLE_LABEL: role}}})
    post("Normal", "RoleAssigned", f"engine {pod.name} serves as {role}")
    return role


async def _record(
    kube: Kube, namespace: str, pod: EnginePod, state: FlipState, drain: bool, role: str
) -> None:
    """Write what changed of the flip state, the draining mark and the role label."""
    meta: dict[str, Any] = {}
    if state != pod.flip:
        meta["annotations"] = annotations_of(state)
    if drain != pod.draining:
        # The label only: a flip keeps the engine, so it is not the scale-down's first pick.
        meta["labels"] = {DRAINING_LABEL: "true" if drain else None}
    if role != pod.role and state.flip_to is None:
        meta.setdefault("labels", {})[ROLE_LABEL] = role
    if meta:
        await kube.patch(pod_path(namespace, pod.name), {"metadata": meta})
