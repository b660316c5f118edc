"""Prefill and decode roles on the real stack: the shared stack's two engines (both with the host
link) flipped at run time to a prefill and a decode engine (`PUT /v1/role`, no restart), the
gateway routing by the roles their `/v1/load` reports, KV carried between the two vLLM
processes through host shared memory (enginecore/kvlink.py). Flipped back to mixed after.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from .test_stack import WEATHER

pytestmark = pytest.mark.engine

# Long enough to be prefilled remotely (the engines' minimum is 64 tokens).
LONG = " ".join(f"item{i}" for i in range(160))


def counters(engine: str) -> dict[str, float]:
    """The engine's Prometheus counters of prompt tokens by source and of prefills."""
    text = httpx.get(engine + "/metrics", timeout=5).text
    out: dict[str, float] = {}
    for name, labels, value in re.findall(r"^(interlude:\w+_total)(\{[^}]*\})? (\S+)$", text, re.M):
        out[name + (labels or "")] = float(value)
    return out


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


COMPUTED = 'interlude:prompt_tokens_total{source="computed"}'
TRANSFERRED = 'interlude:prompt_tokens_total{source="external_kv_transfer"}'
SERVED = "interlude:prefills_served_total"
REMOTE = 'interlude:remote_prefills_total{outcome="remote"}'
SHORT = 'interlude:remote_prefills_total{outcome="short"}'


def set_roles(stack: Any, roles: tuple[str, str]) -> None:
    for engine, role in zip(stack.engines, roles, strict=True):
        r = httpx.put(engine + "/v1/role", json={"role": role}, timeout=5)
        assert r.status_code == 200 and r.json() == {"role": role}
    end = time.monotonic() + 30  # the gateway reads the engines' loads every 2 s
    while [e["role"] for e in httpx.get(stack.gateway + "/ready").json()["engines"]] != list(roles):
        assert time.monotonic() < end, "the gateway never saw the new roles"
        time.sleep(0.3)


def wait_idle(stack: Any) -> None:
    """No live session on either engine: the modules after this one place sessions by load,
    and a session left paused here would weigh on one engine."""
    end = time.monotonic() + 60
    while any(sum(stack.load(e)["sessions"].values()) for e in stack.engines):
        assert time.monotonic() < end, "sessions were left on the engines"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def pd(stack: Any) -> Iterator[tuple[str, str]]:
    """(prefill engine, decode engine) for the module; both mixed and idle again after."""
    set_roles(stack, ("prefill", "decode"))
    try:
        yield stack.engines[0], stack.engines[1]
    finally:
        set_roles(stack, ("mixed", "mixed"))
        wait_idle(stack)


def ask(base: str, content: str, **kw: Any) -> Any:
    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
        **kw,
    )


def test_a_disaggregated_answer_is_the_mixed_engine_s_with_no_prompt_computed_on_decode(
    stack: Any, pd: tuple[str, str]
) -> None:
    prefill, decode = pd
    content = LONG + " first"
    # The reference: one engine computing everything itself (a role only routes: straight to
    # an engine, any engine serves whole sessions).
    mixed = ask(prefill, content).parse()
    p0, d0 = counters(prefill), counters(decode)
    raw = ask(stack.gateway, content)
    split = raw.parse()
    p1, d1 = counters(prefill), counters(decode)
    assert split.choices[0].message.content == mixed.choices[0].message.content
    assert split.usage.completion_tokens == mixed.usage.completion_tokens == 24
    prompt = split.usage.prompt_tokens
    assert prompt > 64
    # The prefill engine prefilled it once (its prefix cache held it: the reference's); the
    # decode engine computed none of it and took every prompt token's KV from the link.
    assert delta(p0, p1, SERVED) == 1
    assert delta(d0, d1, REMOTE) == 1
    assert delta(d0, d1, TRANSFERRED) == prompt
    assert delta(d0, d1, COMPUTED) == 0
    # A prefill engine takes no session: the answer came from the decode engine.
    assert delta(d0, d1, 'interlude:chat_routes_total{decision="new"}') == 1
    assert delta(p0, p1, 'interlude:chat_routes_total{decision="new"}') == 0


def test_a_role_is_one_of_three_and_its_gauge_follows_flips(
    stack: Any, pd: tuple[str, str]
) -> None:
    prefill, _ = pd
    r = httpx.put(prefill + "/v1/role", json={"role": "both"}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "role"
    text = httpx.get(prefill + "/metrics", timeout=5).text
    assert 'interlude:engine_role{role="prefill"} 1.0' in text
    assert 'interlude:engine_role{role="mixed"} 0.0' in text
    assert counters(prefill)['interlude:role_changes_total{to="prefill"}'] >= 1


def test_a_short_prompt_is_prefilled_on_the_decode_engine(stack: Any, pd: tuple[str, str]) -> None:
    prefill, decode = pd
    p0, d0 = counters(prefill), counters(decode)
    r = ask(stack.gateway, "hi").parse()
    p1, d1 = counters(prefill), counters(decode)
    assert r.usage.prompt_tokens < 64
    assert delta(d0, d1, SHORT) == 1 and delta(p0, p1, SERVED) == 0
    assert (
        delta(d0, d1, COMPUTED)
        + delta(d0, d1, 'interlude:prompt_tokens_total{source="local_cache_hit"}')
        == r.usage.prompt_tokens
    )


def test_a_paused_session_resumes_on_its_decode_engine(stack: Any, pd: tuple[str, str]) -> None:
    prefill, decode = pd
    client = OpenAI(base_url=stack.gateway + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages: list[Any] = [{"role": "user", "content": LONG + " weather?"}]
    p0, d0 = counters(prefill), counters(decode)
    first = client.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    # No second call: the session ends with this answer instead of staying parked for one.
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8
    )
    p1, d1 = counters(prefill), counters(decode)
    assert 'route;desc="resume"' in raw.headers["server-timing"]
    # Prefilled remotely once, for the first turn; the resume prefilled only the tool result,
    # on the decode engine that held the session.
    assert delta(p0, p1, SERVED) == 1
    assert delta(d0, d1, 'interlude:chat_routes_total{decision="resume"}') == 1
    assert delta(p0, p1, 'interlude:chat_routes_total{decision="resume"}') == 0
