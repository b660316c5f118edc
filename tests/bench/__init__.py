"""Tests of the rate sweep and its command line (interlude.bench, interlude.cli)."""
