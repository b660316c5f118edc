"""Tests of the policy library (interlude.policy)."""
