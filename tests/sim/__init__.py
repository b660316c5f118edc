"""Tests of the discrete-event simulator (interlude.sim)."""
