"""Tools a worker can run, the built-in ones, and how a call's outcome becomes a result.

A tool is an async callable from a JSON object of arguments to text; the text becomes the
tool's answer in the model's context. Tools raise `ToolArgumentError` for arguments that do not
fit their schema (the result's error kind is "bad_arguments") and any other exception for a
failure while running (kind "tool_error"). Deadlines are the worker's business, not the tool's:
a tool is cancelled when its call's deadline passes, so it must not swallow CancelledError.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, ClassVar

from interlude import telemetry
from interlude.api.bus import MAX_RESULT_BYTES, ToolCall, ToolResult
from interlude.api.tools import ToolSpec
from interlude_tools.context import answering
from interlude_tools.schema import argument_error, check_schema


class ToolArgumentError(ValueError):
    """The arguments do not fit the tool's schema; the message says which and why."""


class RetriableToolError(RuntimeError):
    """A failure worth trying again (a backend busy or briefly away): the registry runs the
    tool again, with backoff, up to the tool's `retries` and within the call's deadline."""


class Tool(ABC):
    """One tool. Side effects are the tool's own (none for the built-ins).

    Invariant: `run` returns a str or raises; it may be run concurrently with itself, and may
    run more than once for one call (a call reclaimed from a crashed worker is run again), so a
    tool with outside effects must make them idempotent per call.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    # The JSON schema of the arguments, published with the name (`interlude.bus.published`).
    parameters: ClassVar[dict[str, Any]] = {"type": "object"}
    # Calls of this tool a worker runs at once (0: only the worker's own limit); more wait,
    # their deadline running, for a backend that takes only so many.
    max_concurrency: ClassVar[int] = 0
    # Extra attempts after a RetriableToolError (backoff 0.1 s, doubling).
    retries: ClassVar[int] = 2

    @abstractmethod
    async def run(self, arguments: dict[str, Any]) -> str:
        """The tool's answer to `arguments` (a JSON object)."""


def _number(arguments: dict[str, Any], name: str, default: float | None = None) -> float:
    value = arguments.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ToolArgumentError(f"argument {name!r} must be a finite number, got {value!r}")
    return float(value)


def _string(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise ToolArgumentError(f"argument {name!r} must be a string, got {value!r}")
    return value


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class Calculator(Tool):
    """Arithmetic on numbers: + - * / // % ** and parentheses, e.g. {"expression": "2*(3+4)"}.

    Parsed with `ast` and walked by hand (no eval): names, calls and attributes are refused.
    Sizes are capped so that an expression like 9**9**9 is refused instead of eating the pod.
    """

    name = "calculator"
    description = "evaluate an arithmetic expression"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 2*(3+4)"}},
        "required": ["expression"],
    }
    MAX_LENGTH = 1000
    MAX_BITS = 100_000  # the largest integer a power may produce

    async def run(self, arguments: dict[str, Any]) -> str:
        expression = _string(arguments, "expression")
        if len(expression) > self.MAX_LENGTH:
            raise ToolArgumentError(f"expression longer than {self.MAX_LENGTH} characters")
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError as exc:
            raise ToolArgumentError(f"not an arithmetic expression: {exc.msg}") from exc
        return str(self._eval(tree.body))

    def _eval(self, node: ast.expr) -> int | float:
        # True is an int to Python, but not a number a user meant.
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            result: int | float = _UNARY[type(node.op)](self._eval(node.operand))
            return result
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            result = _BINARY[type(node.op)](left, right)
            if isinstance(result, complex):
                raise ValueError("the result is not a real number")
            return result
        raise ToolArgumentError(f"not allowed in an arithmetic expression: {ast.dump(node)[:60]}")

    def _check_power(self, base: int | float, exponent: int | float) -> None:
        if (
            isinstance(base, int)
            and isinstance(exponent, int)
            and exponent > 0
            and max(abs(base), 2).bit_length() * exponent > self.MAX_BITS
        ):
            raise ValueError(f"{base}**{exponent} is too large")


class Echo(Tool):
    """Returns {"text": ...} unchanged; the cheapest possible round trip."""

    name = "echo"
    description = "return the text argument unchanged"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }

    async def run(self, arguments: dict[str, Any]) -> str:
        return _string(arguments, "text")


class Scripted(Tool):
    """Sleeps `delay_s`, then returns exactly `tokens` words " x" (" x x x" for 3).

    For load tests and the simulator-vs-engine checks: the call takes a known time and returns
    a known size. The engine counts the answer as `tokens` tokens (" x" is one token in the
    tokenizers we serve), so a trace's (duration, return tokens) replays exactly.
    """

    name = "scripted"
    description = 'sleep delay_s seconds, then return `tokens` words " x"'
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "delay_s": {"type": "number", "minimum": 0},
            "tokens": {"type": "integer", "minimum": 0},
        },
    }
    MAX_TOKENS = 1_000_000

    async def run(self, arguments: dict[str, Any]) -> str:
        delay = _number(arguments, "delay_s", 0.0)
        tokens = arguments.get("tokens", 0)
        if delay < 0:
            raise ToolArgumentError(f"argument 'delay_s' must be >= 0, got {delay}")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise ToolArgumentError(f"argument 'tokens' must be an integer, got {tokens!r}")
        if not 0 <= tokens <= self.MAX_TOKENS:
            raise ToolArgumentError(f"argument 'tokens' must be in [0, {self.MAX_TOKENS}]")
        await asyncio.sleep(delay)
        return " x" * tokens


class Fail(Tool):
    """Always raises (with {"message": ...} if given): the failure path, for tests."""

    name = "fail"
    description = "always fail"
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"message": {"type": "string"}},
    }

    async def run(self, arguments: dict[str, Any]) -> str:
        message = arguments.get("message", "the fail tool always fails")
        raise RuntimeError(str(message))


class Registry:
    """Tools by name. A tool may be registered under several names (aliases)."""

    def __init__(
        self, tools: Iterable[Tool] = (), max_result_bytes: int = MAX_RESULT_BYTES
    ) -> None:
        """`max_result_bytes`: the most a result may hold (UTF-8); a larger one becomes a
        `tool_error` ("result too large: ...") the model sees, whatever the tool (MCP servers
        included)."""
        if max_result_bytes < 1:
            raise ValueError("max_result_bytes must be >= 1")
        self.max_result_bytes = max_result_bytes
        self._tools: dict[str, Tool] = {}
        self._slots: dict[int, asyncio.Semaphore] = {}  # id(tool) -> its max_concurrency
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool, *aliases: str) -> None:
        """Add `tool` under its name and `aliases`; ValueError if a name is taken."""
        check_schema(tool.name, tool.parameters)
        if tool.max_concurrency < 0 or tool.retries < 0:
            raise ValueError(f"tool {tool.name!r}: max_concurrency and retries must be >= 0")
        if tool.max_concurrency:
            # Per tool, not per name: its aliases share the limit.
            self._slots.setdefault(id(tool), asyncio.Semaphore(tool.max_concurrency))
        for name in (tool.name, *aliases):
            if name in self._tools:
                raise ValueError(f"a tool named {name!r} is already registered")
            self._tools[name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def specs(self) -> list[ToolSpec]:
        """Every name (aliases too) with its tool's description and argument schema."""
        return [
            ToolSpec(name, t.description, t.parameters) for name, t in sorted(self._tools.items())
        ]

    async def execute(self, call: ToolCall, clock: Callable[[], float] = time.time) -> ToolResult:
        """Run `call`'s tool within its deadline; every outcome becomes a `ToolResult`.

        Never raises except CancelledError: unknown tools, bad arguments, exceptions and the
        deadline all become failed results with the matching error kind.
        """
        # The tool's span joins the engine's trace: its `pause` span is the parent.
        with telemetry.tracer().start_as_current_span(
            f"tool {call.tool}", context=telemetry.context_of(call.trace)
        ) as span:
            result = await self._execute(call, clock)
            span.set_attribute("interlude.call_id", call.call_id)
            span.set_attribute("interlude.ok", result.ok)
            # The result names this span (same trace), so the engine's span for it can link
            # here; untraced, that is the call's own context again.
            return replace(result, trace=telemetry.carrier_of(span) or result.trace)

    async def _execute(self, call: ToolCall, clock: Callable[[], float]) -> ToolResult:
        tool = self.get(call.tool)
        if tool is None:
            message = f"no tool named {call.tool!r} (known: {', '.join(self.names())})"
            return ToolResult.failure(call, "unknown_tool", message, clock())
        wrong = argument_error(tool.parameters, call.arguments)
        if wrong is not None:
            message = f"tool {call.tool!r}: arguments do not fit its schema: {wrong}"
            return ToolResult.failure(call, "bad_arguments", message, clock())
        remaining = call.deadline - clock()
        if remaining <= 0:
            message = f"tool {call.tool!r}: deadline passed before the call started"
            return ToolResult.failure(call, "timeout", message, clock())
        try:
            async with asyncio.timeout(remaining) as budget:
                content = await self._run(tool, call)
        except TimeoutError as exc:
            if budget.expired():  # our deadline, not a TimeoutError of the tool's own
                message = f"tool {call.tool!r} passed its deadline ({remaining:.3f} s)"
                return ToolResult.failure(call, "timeout", message, clock())
            return ToolResult.failure(call, "tool_error", _describe(exc), clock())
        except ToolArgumentError as exc:
            return ToolResult.failure(call, "bad_arguments", str(exc), clock())
        except Exception as exc:
            return ToolResult.failure(call, "tool_error", _describe(exc), clock())
        if not isinstance(content, str):
            message = f"tool {call.tool!r} returned {type(content).__name__}, not str"
            return ToolResult.failure(call, "tool_error", message, clock())
        result = ToolResult.success(call, content, clock())
        return result.within(self.max_result_bytes, f"tool {call.tool!r}")

    async def _run(self, tool: Tool, call: ToolCall) -> Any:
        """Run `tool` in its concurrency slot, retrying retriable failures with backoff."""
        slot = self._slots.get(id(tool))
        delay = 0.1
        attempt = 0
        while True:
            try:
                with answering(call):
                    if slot is None:
                        return await tool.run(dict(call.arguments))
                    async with slot:
                        return await tool.run(dict(call.arguments))
            except RetriableToolError as exc:
                attempt += 1
                if attempt > tool.retries:
                    raise RuntimeError(f"{exc} (after {attempt} attempts)") from exc
                await asyncio.sleep(delay)
                delay *= 2


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# The built-ins for tests and benchmarks only (`default_registry(test_tools=True)`, a worker's
# `--test-tools`): `scripted` sleeps as long as a caller asks and returns up to a million words,
# `echo` hands back whatever text it gets and `fail` only fails; none is a tool to publish to
# users, whose models (or scripts) could call them.
TEST_TOOLS = ("echo", "fail", "scripted", "sleep")


def default_registry(*, test_tools: bool = False) -> Registry:
    """calculator; with `test_tools`, also echo, scripted (also as "sleep") and fail."""
    registry = Registry([Calculator()])
    if test_tools:
        for tool in (Echo(), Fail()):
            registry.register(tool)
        registry.register(Scripted(), "sleep")
    return registry
