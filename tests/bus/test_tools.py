"""The built-in tools and the registry, without Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import pytest

from interlude.api.bus import ToolCall, ToolResult
from interlude_tools import (
    Calculator,
    Registry,
    RetriableToolError,
    Scripted,
    Tool,
    ToolArgumentError,
    default_registry,
)


class Misbehaving(Tool):
    """Raises its own TimeoutError, or returns a non-string, as arguments ask."""

    name = "misbehaving"
    description = "test tool"

    async def run(self, arguments: dict[str, Any]) -> str:
        if arguments.get("raise_timeout"):
            raise TimeoutError("upstream API timed out")
        result: Any = 42
        return result  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1+2*3", "7"),
        ("(1+2)*3", "9"),
        ("-2**2", "-4"),
        ("7//2", "3"),
        ("7/2", "3.5"),
        ("2**0.5", "1.4142135623730951"),
        ("10 % 4", "2"),
    ],
)
def test_calculator(expression: str, value: str) -> None:
    assert asyncio.run(Calculator().run({"expression": expression})) == value


@pytest.mark.parametrize(
    "expression",
    ["x+1", "abs(-1)", "(1).real", "True+1", "'a'*3", "[1][0]", "1 if 1 else 2", "1 +"],
)
def test_calculator_refuses_what_is_not_arithmetic(expression: str) -> None:
    with pytest.raises(ToolArgumentError):
        asyncio.run(Calculator().run({"expression": expression}))


def test_calculator_refuses_huge_powers_and_imaginary_results() -> None:
    with pytest.raises(ValueError, match="too large"):
        asyncio.run(Calculator().run({"expression": "9**9**9"}))
    with pytest.raises(ValueError, match="not a real number"):
        asyncio.run(Calculator().run({"expression": "(-8)**0.5"}))


def test_scripted_returns_exactly_tokens_words() -> None:
    out = asyncio.run(Scripted().run({"delay_s": 0.01, "tokens": 5}))
    assert out == " x x x x x" and len(out.split()) == 5
    assert asyncio.run(Scripted().run({"tokens": 0})) == ""


@pytest.mark.parametrize(
    "arguments", [{"delay_s": -1}, {"delay_s": "1"}, {"tokens": 1.5}, {"tokens": True}]
)
def test_scripted_refuses_bad_arguments(arguments: dict[str, object]) -> None:
    with pytest.raises(ToolArgumentError):
        asyncio.run(Scripted().run(dict(arguments)))


def test_registry_aliases_and_conflicts() -> None:
    registry = default_registry(test_tools=True)
    assert registry.get("sleep") is registry.get("scripted")
    assert registry.get("nope") is None
    assert registry.names() == ["calculator", "echo", "fail", "scripted", "sleep"]
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Calculator())


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        # The tool's own TimeoutError is its failure; "timeout" means our deadline passed.
        ({"raise_timeout": True}, "tool_error: TimeoutError: upstream API timed out"),
        ({}, "tool_error: tool 'misbehaving' returned int, not str"),
    ],
)
def test_execute_maps_misbehaving_tools(arguments: dict[str, Any], error: str) -> None:
    now = time.time()
    call = ToolCall("c", "s", "e", "misbehaving", arguments, now + 5, {}, now)
    result = asyncio.run(Registry([Misbehaving()]).execute(call))
    assert not result.ok and result.error == error


def test_a_result_over_the_cap_is_a_failure_the_model_sees() -> None:
    now = time.time()
    call = ToolCall("c", "s", "e", "scripted", {"tokens": 600}, now + 5, {}, now)  # 1,200 bytes
    capped = Registry([Scripted()], max_result_bytes=1000)
    result = asyncio.run(capped.execute(call))
    assert not result.ok and result.error.startswith(
        "tool_error: result too large: tool 'scripted'"
    )
    assert result.content == ""
    small = ToolCall("c2", "s", "e", "scripted", {"tokens": 10}, now + 5, {}, now)
    assert asyncio.run(capped.execute(small)).ok  # under the cap: as before


class Counted(Tool):
    """Counts its runs; its schema needs an integer `n` >= 1."""

    name = "counted"
    description = "test tool with a schema"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1}},
        "required": ["n"],
        "additionalProperties": False,
    }
    runs: ClassVar[int] = 0

    async def run(self, arguments: dict[str, Any]) -> str:
        Counted.runs += 1
        return str(arguments["n"])


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({}, "'n' is a required property"),
        ({"n": "3"}, "'3' is not of type 'integer' (at 'n')"),
        ({"n": 0}, "0 is less than the minimum of 1 (at 'n')"),
        ({"n": 2, "m": 1}, "Additional properties are not allowed ('m' was unexpected)"),
    ],
)
def test_arguments_that_do_not_fit_the_schema_are_refused_unrun(
    arguments: dict[str, Any], says: str
) -> None:
    Counted.runs = 0
    now = time.time()
    call = ToolCall("c", "s", "e", "counted", arguments, now + 5, {}, now)
    result = asyncio.run(Registry([Counted()]).execute(call))
    assert not result.ok and result.error.startswith("bad_arguments: tool 'counted'")
    assert says in result.error
    assert Counted.runs == 0
    fits = ToolCall("c2", "s", "e", "counted", {"n": 3}, now + 5, {}, now)
    assert asyncio.run(Registry([Counted()]).execute(fits)).content == "3"


def test_a_tool_with_an_invalid_schema_is_refused_at_registration() -> None:
    class Broken(Tool):
        name = "broken"
        description = "its schema is not one"
        parameters: ClassVar[dict[str, Any]] = {"type": "objekt"}

        async def run(self, arguments: dict[str, Any]) -> str:
            return ""

    with pytest.raises(ValueError, match="tool 'broken' has an invalid argument schema"):
        Registry([Broken()])


class OneAtATime(Tool):
    """Sleeps `delay_s`; a backend that takes one call at a time."""

    name = "one"
    description = "test tool with max_concurrency 1"
    max_concurrency = 1
    active: ClassVar[int] = 0
    peak: ClassVar[int] = 0

    async def run(self, arguments: dict[str, Any]) -> str:
        OneAtATime.active += 1
        OneAtATime.peak = max(OneAtATime.peak, OneAtATime.active)
        try:
            await asyncio.sleep(float(arguments.get("delay_s", 0.05)))
        finally:
            OneAtATime.active -= 1
        return "done"


def test_a_tools_concurrency_limit_queues_calls_and_their_deadline_runs() -> None:
    OneAtATime.peak = 0
    registry = Registry([OneAtATime()])

    async def scenario() -> list[ToolResult]:
        now = time.time()
        calls = [ToolCall(f"c{i}", "s", "e", "one", {}, now + 5, {}, now) for i in range(3)]
        # Behind a 0.5 s call with 0.2 s to live: it times out waiting for the slot.
        slow = ToolCall("slow", "s", "e", "one", {"delay_s": 0.5}, now + 5, {}, now)
        late = ToolCall("late", "s", "e", "one", {}, now + 0.2, {}, now)
        first = asyncio.create_task(registry.execute(slow))
        await asyncio.sleep(0.01)
        results = await asyncio.gather(*(registry.execute(c) for c in [*calls, late]))
        return [await first, *results]

    slow, *results, late = asyncio.run(scenario())
    assert slow.ok and all(r.ok for r in results)
    assert OneAtATime.peak == 1
    assert not late.ok and late.error.startswith("timeout")


class Flaky(Tool):
    """Fails retriably `fails` times, then answers."""

    name = "flaky"
    description = "test tool"
    runs: ClassVar[int] = 0
    fails: ClassVar[int] = 2

    async def run(self, arguments: dict[str, Any]) -> str:
        Flaky.runs += 1
        if Flaky.runs <= Flaky.fails:
            raise RetriableToolError("backend busy")
        return "answer"


@pytest.mark.parametrize(("fails", "ok", "runs"), [(2, True, 3), (5, False, 3)])
def test_retriable_failures_are_retried_up_to_the_tools_retries(
    fails: int, ok: bool, runs: int
) -> None:
    Flaky.runs, Flaky.fails = 0, fails
    now = time.time()
    call = ToolCall("c", "s", "e", "flaky", {}, now + 5, {}, now)
    result = asyncio.run(Registry([Flaky()]).execute(call))
    assert result.ok is ok and Flaky.runs == runs
    if not ok:
        assert result.error == "tool_error: RuntimeError: backend busy (after 3 attempts)"
