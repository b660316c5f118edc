"""The tools file, the tool set it opens (and closes), and tools from installed entry points.

Entry points are real: a distribution written to a temporary folder (`*.dist-info` with its
`entry_points.txt`) and put on sys.path, found by `importlib.metadata` like an installed one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from interlude.api.bus import ToolCall
from interlude_tools import Registry
from interlude_tools.config import ToolSet, entry_point_tools, load_config
from interlude_tools.context import ToolEnv
from interlude_tools.tools.model_endpoints import ModelTool
from interlude_tools.tools.simulated_models import ServerThread

EXAMPLE = Path(__file__).parents[2] / "tools-svc" / "tools.example.toml"
SERVER = Path(__file__).with_name("mcp_server_example.py")
MakeCall = Callable[..., ToolCall]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_example_file_declares_what_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEATHER_API_AUTHORIZATION", "Bearer t0ken")
    config = load_config(EXAMPLE)
    (weather,) = config.http
    assert (weather.name, weather.method, weather.timeout_s) == ("weather", "GET", 5.0)
    assert weather.headers == {"Accept": "application/json", "Authorization": "Bearer t0ken"}
    assert "t0ken" not in repr(config)  # secrets stay out of logs
    assert weather.parameters["properties"]["city"]["type"] == "string"
    files, search = config.mcp
    assert files.cwd == EXAMPLE.parent and files.tool_name("read_file") == "fs.read_file"
    assert search.url.endswith("/mcp") and search.bare and search.cwd is None
    assert config.models.image is not None and config.models.image.max_concurrency == 4
    assert config.models.tts is not None and config.models.tts.hosts == ("tts.models.svc",)
    assert not config.models.simulated and config.entry_points


HTTP = """
    [[http]]
    name = "t"
    description = "d"
    url = "http://api.example/x"
    allowed_hosts = ["api.example"]
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HTTP + 'colour = "red"', r"http\[0\] \('t'\)\.colour: unknown key"),
        (HTTP + 'timeout_s = "ten"', r"http\[0\] \('t'\)\.timeout_s: must be a number, got str"),
        (HTTP + "retries = true", r"\.retries: must be an integer, got bool"),
        (HTTP.replace('url = "http://api.example/x"', ""), r"http\[0\] \('t'\)\.url: is required"),
        (HTTP.replace('"api.example"]', '"other"]'), r"http\[0\] \('t'\): url host 'api.exa"),
        (HTTP + "[http.env_headers]\nX-Key = 'NOT_SET_ANYWHERE'", r"X-Key: \$NOT_SET_ANYWHERE is"),
        (HTTP + HTTP, r"http\[1\]\.name: the tool name 't' is declared twice \(first by http\[0\]"),
        (
            HTTP.replace('"t"', '"image"') + "[models]\nsimulated = true",
            r"models\.image: the tool name 'image' is declared tw",
        ),
        ("[models]\nsimulated = true\n[models.tts]\nurl = 'http://h/'", "drop their tables"),
        ("[models.image]\nurl = 'http://h/'\nsize = 3", r"models\.image\.size: unknown key"),
        ("[[mcp]]\nname = 'm'\ncommand = 'x'\nurl = 'http://h/'", r"mcp\[0\] \('m'\): give exac"),
        (
            "[[mcp]]\nname = 'm'\ncommand = 'x'\n[[mcp]]\nname = 'm'\ncommand = 'y'",
            r"mcp\[1\]\.name: the MCP server name 'm'",
        ),
        ("[[mcp]]\nname = 'm'\nurl = 'http://h/'\ncwd = 'sub'", "for stdio servers only"),
        ("[[mcp]]\nname = 'm'\ncommand = 'x'\nargs = [1]", r"\.args: must be a list of strings"),
        ("plugins = []", "plugins: unknown key"),
        ("http = 3", "http: must be a list"),
        ("[[http]\n", "cannot be read as TOML"),
    ],
)
def test_a_mistake_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_an_empty_file_declares_nothing(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert (config.http, config.mcp, config.models.simulated) == ((), (), False)
    with pytest.raises(ValueError, match="cannot be read"):
        load_config(tmp_path / "missing.toml")


@pytest.fixture
def env(tmp_path: Path) -> ToolEnv:
    return ToolEnv("redis://127.0.0.1:6379/0", base_dir=tmp_path)


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    spec = importlib.util.spec_from_file_location("mcp_server_example", SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with ServerThread(module.build_server().streamable_http_app()) as server:
        yield f"{server.url}/mcp"


def test_a_tool_set_opens_every_declared_tool_and_closes_them(
    tmp_path: Path, env: ToolEnv, mcp_url: str, make_call: MakeCall
) -> None:
    path = write(
        tmp_path,
        f"""
        entry_points = false
        [models]
        simulated = true
        time_scale = 0.0001
        [[mcp]]
        name = "ex"
        url = "{mcp_url}"
        tools = ["add"]
        [[http]]
        name = "health"
        description = "is the simulated server up"
        url = "{mcp_url}"
        allowed_hosts = ["127.0.0.1"]
        """,
    )

    async def scenario() -> str:
        async with ToolSet(load_config(path), env) as declared:
            assert [t.name for t in declared.tools] == ["health", "image", "tts", "ex.add"]
            registry = Registry(declared.tools)
            image = await registry.execute(make_call("c1", "image", {"prompt": "a cat"}))
            assert image.ok and image.content.startswith("image generated: img-"), image.error
            added = await registry.execute(make_call("c2", "ex.add", {"a": 1, "b": 2}))
            assert added.ok and added.content == "3"
            image = declared.tools[1]
            assert isinstance(image, ModelTool)
        return image.config.url

    image_url = asyncio.run(scenario())
    with pytest.raises(httpx.ConnectError):  # the simulated server stopped with the set
        httpx.post(image_url, json={"prompt": "x"}, timeout=1)


def test_a_failed_start_closes_what_was_opened(tmp_path: Path, env: ToolEnv, mcp_url: str) -> None:
    broken = f"""
        entry_points = false
        [models]
        simulated = true
        [[mcp]]
        name = "ex"
        url = "{mcp_url}"
        [[mcp]]
        name = "gone"
        command = "/nonexistent/mcp-server"
    """
    clash = f"""
        entry_points = false
        [[http]]
        name = "ex.add"
        description = "a name the MCP server's tool takes too"
        url = "{mcp_url}"
        allowed_hosts = ["127.0.0.1"]
        [[mcp]]
        name = "ex"
        url = "{mcp_url}"
    """

    async def start(text: str) -> tuple[ToolSet, str]:
        declared = ToolSet(load_config(write(tmp_path, text)), env)
        with pytest.raises((ConnectionError, ValueError)) as caught:
            await declared.start()
        return declared, str(caught.value)

    declared, error = asyncio.run(start(broken))
    assert "MCP server 'gone' failed to connect" in error
    image = declared.tools[0]
    assert isinstance(image, ModelTool)
    with pytest.raises(httpx.ConnectError):  # the simulated server was stopped
        httpx.post(image.config.url, json={"prompt": "x"}, timeout=1)
    _, error = asyncio.run(start(clash))
    assert "the tool name 'ex.add' is declared twice" in error


FAKE_MODULE = """
from typing import Any

from interlude_tools import Tool
from interlude_tools.context import ToolEnv


class Hello(Tool):
    name = "hello"
    description = "says hello"

    async def run(self, arguments: dict[str, Any]) -> str:
        return "hello"


class Where(Tool):
    name = "where"
    description = "the folder the worker's tools file is in"

    def __init__(self, env: ToolEnv) -> None:
        self.env = env

    async def run(self, arguments: dict[str, Any]) -> str:
        return str(self.env.base_dir)


def make(env: ToolEnv) -> list[Tool]:
    return [Where(env)]


def make_wrong(env: ToolEnv) -> list[object]:
    return [Where(env), 42]


class NotATool:
    pass


not_callable = 42
"""


def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: str) -> None:
    """A distribution with these `interlude.tools` entry points, on sys.path."""
    site = tmp_path / "site"
    info = site / "interlude_fake_tools-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: interlude-fake-tools\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(f"[interlude.tools]\n{entries}\n")
    (site / "interlude_fake_tools.py").write_text(FAKE_MODULE)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "interlude_fake_tools", raising=False)


def test_entry_points_give_tool_classes_and_factories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: ToolEnv, make_call: MakeCall
) -> None:
    install(
        tmp_path,
        monkeypatch,
        "hello = interlude_fake_tools:Hello\nwhere = interlude_fake_tools:make",
    )
    tools = entry_point_tools(env)
    assert [t.name for t in tools] == ["hello", "where"]

    async def scenario() -> list[str]:
        # A tool set without a file runs the entry points' tools alone.
        async with ToolSet(None, env) as declared:
            registry = Registry(declared.tools)
            results = [await registry.execute(make_call(n, n, {})) for n in ("hello", "where")]
        return [r.content for r in results]

    assert asyncio.run(scenario()) == ["hello", str(env.base_dir)]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("bad = interlude_fake_tools:NotATool", "is the class NotATool, not a Tool subclass"),
        ("bad = interlude_fake_tools:not_callable", "neither a Tool subclass nor a factory"),
        ("bad = interlude_fake_tools:make_wrong", "the factory gave int, not a Tool"),
        ("bad = interlude_fake_tools_missing:Tool", "cannot be loaded: ModuleNotFoundError"),
    ],
)
def test_a_wrong_entry_point_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: ToolEnv, entry: str, message: str
) -> None:
    install(tmp_path, monkeypatch, entry)
    with pytest.raises(ValueError, match=message) as caught:
        entry_point_tools(env)
    assert "entry point 'bad'" in str(caught.value)
