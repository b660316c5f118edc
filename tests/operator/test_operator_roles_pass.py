"""One roles pass (roles.py) with the Kubernetes writes and the engines' answers recorded: who
is given which role, and an engine that restarted under an old label."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from interlude_operator.pods import ROLE_LABEL, EnginePod
from interlude_operator.roles import roles_pass
from interlude_operator.spec import Roles


class Recorder:
    """Stands in for `Kube` (patches) and `EngineCalls` (loads and role changes)."""

    def __init__(self, roles: dict[str, str]) -> None:
        self.roles = roles  # ip -> the role its engine reports
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.set: list[tuple[str, str]] = []

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((path.rsplit("/", 1)[-1], body))
        return {}

    async def load(self, ip: str, port: int) -> Mapping[str, Any] | None:
        # Busy in either role: stepping all the time, queued prompt tokens, a running request.
        load = {"running": 1, "sessions": {}, "queued_prefill_tokens": 1024, "busy_share": 1.0}
        return {"role": self.roles[ip], **load}

    async def set_role(self, ip: str, port: int, role: str) -> bool:
        self.set.append((ip, role))
        self.roles[ip] = role
        return True


def pod(name: str, ip: str, role: str = "") -> EnginePod:
    return EnginePod(name, ip, True, False, "2026-11-27T00:00:00Z", False, role)


def labels(rec: Recorder) -> dict[str, str]:
    out = {}
    for name, body in rec.patches:
        role = body["metadata"].get("labels", {}).get(ROLE_LABEL)
        if role:
            out[name] = role
    return out


@pytest.mark.asyncio
async def test_new_engines_get_prefill_until_the_pool_has_enough() -> None:
    rec = Recorder({"10.0.0.1": "decode", "10.0.0.2": "decode", "10.0.0.3": "decode"})
    pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2"), pod("c", "10.0.0.3")]
    await roles_pass(rec, "llm", pods, Roles(enabled=True, prefill=2), rec, _post, 0.0, 8100)  # type: ignore[arg-type]
    assert rec.set == [("10.0.0.1", "prefill"), ("10.0.0.2", "prefill")]
    assert labels(rec) == {"a": "prefill", "b": "prefill", "c": "decode"}


@pytest.mark.asyncio
async def test_an_engine_restarted_under_an_old_label_is_given_its_role_again() -> None:
    # "a" was the prefill engine; its process restarted and reports its start role.
    rec = Recorder({"10.0.0.1": "decode", "10.0.0.2": "decode"})
    pods = [pod("a", "10.0.0.1", "prefill"), pod("b", "10.0.0.2", "decode")]
    await roles_pass(rec, "llm", pods, Roles(enabled=True, prefill=1), rec, _post, 0.0, 8100)  # type: ignore[arg-type]
    assert rec.set == [("10.0.0.1", "prefill")] and labels(rec) == {"a": "prefill"}
    # Labels that agree with the engines: nothing to do.
    again = Recorder({"10.0.0.1": "prefill", "10.0.0.2": "decode"})
    await roles_pass(again, "llm", pods, Roles(enabled=True, prefill=1), again, _post, 0.0, 8100)  # type: ignore[arg-type]
    assert again.set == [] and again.patches == []


def _post(kind: str, reason: str, message: str) -> None:
    return


@pytest.mark.asyncio
async def test_new_engines_get_prefill_up_to_what_the_scaler_wants() -> None:
    rec = Recorder({"10.0.0.1": "decode", "10.0.0.2": "decode", "10.0.0.3": "decode"})
    pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2"), pod("c", "10.0.0.3")]
    roles = Roles(enabled=True, prefill=1)
    await roles_pass(rec, "llm", pods, roles, rec, _post, 0.0, 8100, prefill=2)  # type: ignore[arg-type]
    assert labels(rec) == {"a": "prefill", "b": "prefill", "c": "decode"}
