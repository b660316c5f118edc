"""Interception-handling policies: pure Python, no vLLM, no torch, no I/O beyond profile files."""

from __future__ import annotations

from interlude.policy.base import Policy, PolicyError
from interlude.policy.baselines import (
    ImprovedDiscardPolicy,
    PreservePolicy,
    SwapPolicy,
    VllmPolicy,
)
from interlude.policy.continuum import ContinuumPolicy
from interlude.policy.infercept import InferCeptPolicy
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.lamps import LampsPolicy, LampsPredictedPolicy
from interlude.policy.profile import Profile, available_profiles, load_profile
from interlude.policy.thunderagent import ThunderAgentPolicy
from interlude.policy.types import (
    BatchMode,
    Decision,
    Handling,
    KVAction,
    Phase,
    RequestView,
    SchedulerView,
    SwapMode,
    Traits,
)

# Order matters: it is the order of tables and plots (baselines first, ours last).
POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        VllmPolicy,
        ImprovedDiscardPolicy,
        PreservePolicy,
        SwapPolicy,
        InferCeptPolicy,
        LampsPolicy,
        LampsPredictedPolicy,
        ThunderAgentPolicy,
        ContinuumPolicy,
        InterludePolicy,
    )
}


def make_policy(name: str, profile: Profile) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(profile)


__all__ = [
    "POLICIES",
    "BatchMode",
    "Decision",
    "Handling",
    "KVAction",
    "Phase",
    "Policy",
    "PolicyError",
    "Profile",
    "RequestView",
    "SchedulerView",
    "SwapMode",
    "Traits",
    "available_profiles",
    "load_profile",
    "make_policy",
]
