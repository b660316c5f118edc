"""Policies by name, or your own by import path ("package.module:Class")."""

from __future__ import annotations

import pytest

from interlude.policy import POLICIES, Policy, make_policy, policy_class
from interlude.policy.baselines import PreservePolicy


def test_a_policy_by_name_or_by_import_path(make_profile) -> None:  # type: ignore[no-untyped-def]
    assert policy_class("preserve") is POLICIES["preserve"]
    assert policy_class("interlude.policy.baselines:PreservePolicy") is PreservePolicy
    policy = make_policy("interlude.policy.baselines:PreservePolicy", make_profile())
    assert isinstance(policy, PreservePolicy) and isinstance(policy, Policy)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("fifo", r"unknown policy 'fifo'; choose from vllm, .* or name your own"),
        ("no.such.module:Policy", r"'no.such.module:Policy' cannot be loaded: No module named"),
        ("interlude.policy.baselines:Nope", r"cannot be loaded: .*has no attribute 'Nope'"),
        ("interlude.policy.baselines:by_arrival", r"is not a subclass of interlude.policy.Policy"),
    ],
)
def test_a_bad_policy_name_says_what_is_wrong(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        policy_class(name)
