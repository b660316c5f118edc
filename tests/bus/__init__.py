"""Tests of the Redis Streams tool bus (interlude.bus) and the tool workers (interlude_tools)."""
