"""Interception-handling policies: pure Python, no vLLM, no torch, no I/O beyond profile files."""

from __future__ import annotations

import importlib

from interlude.compiled import activate

# Before any submodule: with INTERLUDE_SIM_COMPILED=on they load from a mypyc build.
activate(__name__, __path__)

from interlude.policy.base import Policy, PolicyError
from interlude.policy.baselines import (
    ImprovedDiscardPolicy,
    PreservePolicy,
    SwapPolicy,
    VllmPolicy,
    VllmV0Policy,
)
from interlude.policy.continuum import ContinuumFixedTtlPolicy, ContinuumPolicy
from interlude.policy.infercept import InferCeptPolicy
from interlude.policy.interlude_policy import InterludePolicy
from interlude.policy.lamps import LampsPolicy, LampsPredictedPolicy
from interlude.policy.profile import Profile, available_profiles, load_profile
from interlude.policy.thunderagent import ThunderAgentDecayPolicy, ThunderAgentPolicy
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
        VllmV0Policy,
        ImprovedDiscardPolicy,
        PreservePolicy,
        SwapPolicy,
        InferCeptPolicy,
        LampsPolicy,
        LampsPredictedPolicy,
        ThunderAgentPolicy,
        ThunderAgentDecayPolicy,
        ContinuumPolicy,
        ContinuumFixedTtlPolicy,
        InterludePolicy,
    )
}


def policy_class(name: str) -> type[Policy]:
    """A policy by its name, or your own as ``"package.module:Class"`` (a `Policy` subclass,
    importable where the engine runs); ValueError says what is wrong with `name`."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"policy {name!r} cannot be loaded: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise ValueError(f"policy {name!r} is not a subclass of interlude.policy.Policy")
        return cls
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose from {', '.join(POLICIES)}, or name your own "
            "as 'package.module:Class'"
        ) from None


def make_policy(name: str, profile: Profile) -> Policy:
    return policy_class(name)(profile)


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
    "policy_class",
]
