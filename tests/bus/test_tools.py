"""The built-in tools and the registry, without Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from interlude.bus import ToolCall
from interlude_tools import (
    Calculator,
    Registry,
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
    registry = default_registry()
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
