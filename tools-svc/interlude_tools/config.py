"""Which tools a worker runs beyond the built-ins: a TOML file, and installed entry points.

The file (`tools.example.toml` shows every key) declares `[[http]]` endpoints, `[[mcp]]` servers,
`[models]` (the image and tts endpoints, or the built-in simulated ones) and `[retrieval]` (the
retrieval tool's corpus or search service). It is read
strictly: an unknown key, a wrong type, a missing field or a name used twice is a ValueError
naming the file and the key, at start, never a tool that quietly is not there. Secrets stay out
of the file: `env_headers` (HTTP) and `pass_env` (MCP) name the worker's environment variables.

Installed packages add tools through the entry point group `interlude.tools`: each entry point
is a `Tool` subclass (made with no arguments) or a factory `(env: ToolEnv) -> Tool | Iterable`.

`ToolSet` owns what the tools hold open (HTTP clients, MCP sessions and their processes, the
simulated model server): a worker opens it before it runs and closes it after it drains.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar, runtime_checkable

from interlude_tools.context import ToolEnv
from interlude_tools.registry import Tool
from interlude_tools.tools.http_tool import HttpTool, HttpToolConfig
from interlude_tools.tools.mcp_bridge import McpBridge, McpServerConfig
from interlude_tools.tools.model_endpoints import ModelEndpointConfig, ModelTool, model_tools
from interlude_tools.tools.retrieval import RetrievalConfig
from interlude_tools.tools.simulated_models import start_simulated_models

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "interlude.tools"
T = TypeVar("T")


@dataclass(frozen=True)
class ModelsConfig:
    """`[models]`: real endpoints (`image`, `tts`), or the simulated ones started in-process."""

    image: ModelEndpointConfig | None = None
    tts: ModelEndpointConfig | None = None
    simulated: bool = False  # serve both from `simulated_models` on a thread of the worker
    seed: int = 0  # simulated only
    time_scale: float = 1.0  # simulated only: multiplies the paper's latencies

    def __post_init__(self) -> None:
        if self.simulated and (self.image or self.tts):
            raise ValueError("simulated = true serves image and tts itself: drop their tables")


@dataclass(frozen=True)
class ToolsConfig:
    """A parsed tools file (`load_config`)."""

    path: Path
    http: tuple[HttpToolConfig, ...] = ()
    mcp: tuple[McpServerConfig, ...] = ()
    models: ModelsConfig = field(default_factory=ModelsConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    entry_points: bool = True  # also run the tools of installed `interlude.tools` entry points


class _Strings:
    """The kind of a key whose value is a list of strings (a tuple once read)."""


class _StringMap:
    """The kind of a key whose value is a table of strings."""


# What a key's value must be: a type, numbers (int or float), or one of the two above.
Kind = type | tuple[type, ...]
_NUMBER = (int, float)
_NAMES = {
    int: "an integer",
    str: "a string",
    bool: "true or false",
    list: "a list",
    dict: "a table",
}

_TOP_KEYS: dict[str, Kind] = {
    "http": list,
    "mcp": list,
    "models": dict,
    "retrieval": dict,
    "entry_points": bool,
}
_RETRIEVAL_KEYS: dict[str, Kind] = {
    "url": str,
    "timeout_s": _NUMBER,
    "corpus_dir": str,
    "max_passage_chars": int,
    "max_answer_chars": int,
}
_HTTP_KEYS: dict[str, Kind] = {
    "name": str,
    "description": str,
    "url": str,
    "allowed_hosts": _Strings,
    "method": str,
    "parameters": dict,
    "timeout_s": _NUMBER,
    "headers": _StringMap,
    "env_headers": _StringMap,  # header -> environment variable, read at load
    "max_response_bytes": int,
    "max_concurrency": int,
    "retries": int,
    "allow_private_networks": bool,
}
_MCP_KEYS: dict[str, Kind] = {
    "name": str,
    "command": str,
    "args": _Strings,
    "env": _StringMap,
    "pass_env": _Strings,
    "cwd": str,
    "url": str,
    "prefix": str,
    "bare": bool,
    "tools": _Strings,
    "connect_timeout_s": _NUMBER,
    "max_concurrency": int,
    "retries": int,
}
_MODELS_KEYS: dict[str, Kind] = {
    "image": dict,
    "tts": dict,
    "simulated": bool,
    "seed": int,
    "time_scale": _NUMBER,
}
_ENDPOINT_KEYS: dict[str, Kind] = {
    "url": str,
    "timeout_s": _NUMBER,
    "allowed_hosts": _Strings,
    "headers": _StringMap,
    "env_headers": _StringMap,
    "max_concurrency": int,
    "retries": int,
}


class _Table:
    """One TOML table, read against the keys it may have; errors name the file and the key.

    Only the keys given are passed on, so every default lives in one place: the dataclass.
    """

    def __init__(self, path: Path, where: str, data: object) -> None:
        self.path, self.where = path, where
        if not isinstance(data, dict):
            raise self.error("", f"must be a table, got {type(data).__name__}")
        self.data: dict[str, Any] = data

    def error(self, key: str, message: str) -> ValueError:
        place = f"{self.where}.{key}" if self.where and key else self.where or key
        return ValueError(f"{self.path}: {place}: {message}")

    def fields(self, cls: type, kinds: Mapping[str, Kind]) -> dict[str, Any]:
        """The keys given, each checked; ValueError for an unknown key or a missing field."""
        unknown = sorted(set(self.data) - set(kinds))
        if unknown:
            raise self.error(unknown[0], "unknown key")
        for f in dataclasses.fields(cls):
            no_default = f.default is MISSING and f.default_factory is MISSING
            if f.name in kinds and no_default and f.name not in self.data:
                raise self.error(f.name, "is required")
        return {k: self._checked(k, kinds[k]) for k in self.data}

    def _checked(self, key: str, kind: Kind) -> Any:
        value = self.data[key]
        if kind is _Strings:
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise self.error(key, "must be a list of strings")
            return tuple(value)
        if kind is _StringMap:
            if not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
                raise self.error(key, "must be a table of strings")
            return dict(value)
        options = kind if isinstance(kind, tuple) else (kind,)
        # TOML's true is a Python int too; a flag given for a number is a mistake.
        right = isinstance(value, options) and (bool in options or not isinstance(value, bool))
        if not right:
            wanted = "a number" if float in options else _NAMES[options[0]]
            raise self.error(key, f"must be {wanted}, got {type(value).__name__} {value!r}"[:200])
        return float(value) if float in options else value

    def headers(self, fields: dict[str, Any]) -> None:
        """Fold `env_headers` (header -> variable) into `headers`, reading the environment."""
        headers = fields.setdefault("headers", {})
        for header, variable in fields.pop("env_headers", {}).items():
            if variable not in os.environ:
                raise self.error(f"env_headers.{header}", f"${variable} is not set")
            headers[header] = os.environ[variable]

    def build(self, cls: type[T], fields: dict[str, Any]) -> T:
        """`cls(**fields)`; its own checks' ValueErrors name the table."""
        try:
            return cls(**fields)
        except ValueError as exc:
            raise self.error("", str(exc)) from exc


def load_config(path: Path) -> ToolsConfig:
    """The tools file at `path`; ValueError naming the file and the key for anything wrong."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read as TOML: {exc}") from exc
    top = _Table(path, "", data)
    fields = top.fields(ToolsConfig, _TOP_KEYS)
    http = fields["http"] = tuple(_http(t) for t in _entries(top, "http", fields.get("http", [])))
    mcp = fields["mcp"] = tuple(_mcp(t) for t in _entries(top, "mcp", fields.get("mcp", [])))
    models = fields["models"] = _models(_Table(path, "models", fields.get("models", {})))
    fields["retrieval"] = _retrieval(_Table(path, "retrieval", fields.get("retrieval", {})))
    config = top.build(ToolsConfig, {"path": path, **fields})
    tools = [(f"http[{i}].name", t.name) for i, t in enumerate(http)]
    endpoints = (("image", models.image), ("tts", models.tts))
    tools += [(f"models.{n}", n) for n, e in endpoints if e or models.simulated]
    _check_unique(path, "tool", tools)
    _check_unique(path, "MCP server", [(f"mcp[{i}].name", s.name) for i, s in enumerate(mcp)])
    return config


def _entries(top: _Table, key: str, items: list[Any]) -> list[_Table]:
    """The tables of an array of tables (`[[key]]`), each named by position and name."""
    tables = []
    for i, data in enumerate(items):
        name = data.get("name") if isinstance(data, dict) else None
        where = f"{key}[{i}]" + (f" ({name!r})" if isinstance(name, str) else "")
        tables.append(_Table(top.path, where, data))
    return tables


def _check_unique(path: Path | str, what: str, named: Iterable[tuple[str, str]]) -> None:
    """ValueError at the first (place, name) whose name an earlier place has."""
    first: dict[str, str] = {}
    for place, name in named:
        if name in first:
            raise ValueError(
                f"{path}: {place}: the {what} name {name!r} is declared twice "
                f"(first by {first[name]})"
            )
        first[name] = place


def _http(table: _Table) -> HttpToolConfig:
    fields = table.fields(HttpToolConfig, _HTTP_KEYS)
    table.headers(fields)
    if "method" in fields:
        fields["method"] = fields["method"].upper()
    return table.build(HttpToolConfig, fields)


def _mcp(table: _Table) -> McpServerConfig:
    fields = table.fields(McpServerConfig, _MCP_KEYS)
    # Relative to the file (by default its folder), so a file and its servers move together.
    if "cwd" in fields or "url" not in fields:
        fields["cwd"] = table.path.parent / fields.get("cwd", ".")
    return table.build(McpServerConfig, fields)


def _models(table: _Table) -> ModelsConfig:
    fields = table.fields(ModelsConfig, _MODELS_KEYS)
    for key in ("image", "tts"):
        if key in fields:
            inner = _Table(table.path, f"models.{key}", fields[key])
            endpoint = inner.fields(ModelEndpointConfig, _ENDPOINT_KEYS)
            inner.headers(endpoint)
            fields[key] = inner.build(ModelEndpointConfig, endpoint)
    return table.build(ModelsConfig, fields)


def _retrieval(table: _Table) -> RetrievalConfig:
    fields = table.fields(RetrievalConfig, _RETRIEVAL_KEYS)
    if "corpus_dir" in fields:  # relative to the file's folder (`ToolEnv.base_dir`)
        fields["corpus_dir"] = Path(fields["corpus_dir"])
    return table.build(RetrievalConfig, fields)


def entry_point_tools(env: ToolEnv, group: str = ENTRY_POINT_GROUP) -> list[Tool]:
    """The tools of every installed entry point in `group`, in entry point name order.

    Each entry point is a `Tool` subclass (made with no arguments) or a factory called with
    `env` that returns a Tool or an iterable of them. ValueError naming the entry point for one
    that cannot be loaded or gives something else.
    """
    tools: list[Tool] = []
    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        where = f"entry point {point.name!r} ({point.value}) in group {group!r}"
        try:
            loaded = point.load()
        except Exception as exc:
            raise ValueError(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from exc
        if isinstance(loaded, type):
            if not issubclass(loaded, Tool):
                raise ValueError(f"{where} is the class {loaded.__name__}, not a Tool subclass")
            tools.append(loaded())
            continue
        if not callable(loaded):
            raise ValueError(f"{where} is neither a Tool subclass nor a factory")
        made = loaded(env)
        batch = [made] if isinstance(made, Tool) else list(made) if _iterable(made) else [made]
        wrong = [t for t in batch if not isinstance(t, Tool)]
        if wrong:
            raise ValueError(f"{where}: the factory gave {type(wrong[0]).__name__}, not a Tool")
        tools.extend(batch)
    return tools


def _iterable(value: object) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


@runtime_checkable
class Closeable(Protocol):
    """Something that holds a resource until closed (an HTTP client, a session)."""

    async def aclose(self) -> None: ...


class ToolSet:
    """The tools of a tools file (None: no file) and of entry points, and what they hold open.

    A worker opens it before it starts taking calls and closes it after it has drained:

        async with ToolSet(config, env) as declared:
            for tool in declared.tools:
                registry.register(tool)
            await worker.run()

    `start` makes the HTTP and model tools (an HTTP client each), starts the simulated model
    server (a thread) if asked for, connects every MCP server in order (a failure closes what
    was opened and is raised: a worker must not run with a declared server missing) and loads
    the entry points. ValueError for a tool name given twice across all of them. `aclose`
    closes everything in reverse order; it may be called twice, and after a failed start.
    """

    def __init__(
        self, config: ToolsConfig | None, env: ToolEnv, *, errlog: TextIO | None = None
    ) -> None:
        self.config = config
        self.env = env
        self.tools: list[Tool] = []
        self._sources: list[tuple[str, str]] = []  # (where from, name) of each tool
        self._errlog = errlog  # MCP servers' stderr (None: the worker's)
        self._closers: list[Callable[[], Awaitable[None]]] = []

    async def start(self) -> list[Tool]:
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        return self.tools

    async def _start(self) -> None:
        config = self.config
        if config is not None:
            self._add("http", [HttpTool.from_config(c) for c in config.http])
            self._add("models", await self._model_tools(config.models))
            for i, server in enumerate(config.mcp):
                bridge = McpBridge(server, errlog=self._errlog)
                self._closers.append(bridge.close)  # close() after a failed start is harmless
                self._add(f"mcp[{i}] ({server.name!r})", await bridge.start())
        if config is None or config.entry_points:
            self._add(f"entry points {ENTRY_POINT_GROUP!r}", entry_point_tools(self.env))
        _check_unique(config.path if config else "tools", "tool", self._sources)

    async def _model_tools(self, models: ModelsConfig) -> list[ModelTool]:
        if not models.simulated:
            return model_tools(models.image, models.tts)
        server = await asyncio.to_thread(start_simulated_models, models.seed, models.time_scale)
        self._closers.append(lambda: asyncio.to_thread(server.stop))
        timeout_s = 120.0 * max(1.0, models.time_scale)  # the paper's latencies, scaled
        return model_tools(
            ModelEndpointConfig(f"{server.url}/v1/image", timeout_s),
            ModelEndpointConfig(f"{server.url}/v1/tts", timeout_s),
        )

    def _add(self, source: str, tools: Iterable[Tool]) -> None:
        for tool in tools:
            self.tools.append(tool)
            self._sources.append((source, tool.name))
            if isinstance(tool, Closeable):
                self._closers.append(tool.aclose)

    async def aclose(self) -> None:
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            try:
                await close()
            except Exception:  # one that fails to close must not keep the others open
                log.exception("closing a tool failed")

    async def __aenter__(self) -> ToolSet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
