"""The decode side's prefill client: a prefill engine that fails costs a session its remote
prefill, never the session (the prompt is prefilled on the decode engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from interlude.engine.prefill import REMOTE_PREFILLS, PrefillClient


def outcome(name: str) -> float:
    return REMOTE_PREFILLS.labels(name)._value.get()  # type: ignore[attr-defined, no-any-return]


def test_an_unreachable_prefill_engine_means_prefill_here(free_port: Callable[[], int]) -> None:
    async def body() -> None:
        client = PrefillClient("token", min_tokens=4, timeout_s=2.0)
        try:
            before = outcome("failed")
            url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
            assert await client.fetch(url, list(range(10))) is None
            assert outcome("failed") == before + 1
        finally:
            await client.close()

    asyncio.run(body())


def test_a_prompt_under_the_minimum_is_not_sent() -> None:
    async def body() -> None:
        client = PrefillClient("", min_tokens=64)
        try:
            before = outcome("short")
            # No request is made: the URL would fail if one were.
            assert await client.fetch("http://192.0.2.1:1", list(range(63))) is None
            assert outcome("short") == before + 1
        finally:
            await client.close()

    asyncio.run(body())
