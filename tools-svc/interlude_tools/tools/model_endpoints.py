"""The `image` and `tts` tools: a prompt or a text posted to a model endpoint, one line back.

These are InferCept's Image and TTS augmentations (DESIGN section 4): the model asks for an
image or for speech, waits about 20 s (the model runs, a person looks), and resumes with a note
of what was made. The bytes go to the user, not into the context, so the answer is one short
line: what was made, its size or length, and where it is. The endpoint's JSON is the contract,
kept small so a real model server can be put behind it with a thin adapter:

* POST {"prompt": str} to the image URL -> {"id": str, "width": int, "height": int, "url": str}
* POST {"text": str} to the tts URL -> {"id": str, "duration_s": number, "url": str}

`interlude_tools.tools.simulated_models` serves both with the paper's latencies. The HTTP side
(allow-list, redirects, timeouts, which failures are retried) is `http_tool.HttpEndpoint`'s;
unlike an `[[http]]` tool, a model endpoint may be on a private address.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

from interlude_tools.registry import Tool
from interlude_tools.tools.http_tool import HttpEndpoint, check_endpoint, named_tool_class

# An answer is a small JSON object; anything larger is not this protocol.
MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class ModelEndpointConfig:
    """Where one model endpoint is (`[models.image]`, `[models.tts]` in the tools file)."""

    url: str
    # A model takes tens of seconds; the call's own deadline still bounds the whole call.
    timeout_s: float = 120.0
    allowed_hosts: tuple[str, ...] = ()  # empty: only the URL's own host
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets
    max_concurrency: int = 0
    retries: int = 2

    def __post_init__(self) -> None:
        check_endpoint(self.url, self.hosts, self.timeout_s)
        if self.max_concurrency < 0 or self.retries < 0:
            raise ValueError("max_concurrency and retries must be >= 0")

    @property
    def hosts(self) -> tuple[str, ...]:
        """The allow-list in force: the declared one, else the URL's host."""
        return self.allowed_hosts or (urlsplit(self.url).hostname or "",)


class ModelTool(Tool, ABC):
    """One string argument posted to a model endpoint; the JSON answer told in one line.

    Make one with `from_config` (the config's concurrency and retries are class variables, so
    they need a subclass; a direct `ImageTool(config)` runs with the class defaults). Side
    effects: the endpoint makes an image or audio per call, again if the call is retried.
    """

    argument: ClassVar[str]  # the one argument, sent under the same key

    def __init__(self, config: ModelEndpointConfig) -> None:
        self.config = config
        self._endpoint = HttpEndpoint(
            config.url,
            allowed_hosts=config.hosts,
            timeout_s=config.timeout_s,
            headers=config.headers,
            # Model servers are the deployment's own, in the cluster (private addresses) or the
            # simulated one on 127.0.0.1, and the model picks only the prompt, not where it
            # goes. Redirects stay pinned, and link-local (metadata) stays refused.
            allow_private_networks=True,
        )

    @classmethod
    def from_config(cls, config: ModelEndpointConfig) -> ModelTool:
        made = named_tool_class(
            cls,
            cls.name,
            cls.description,
            cls.parameters,
            max_concurrency=config.max_concurrency,
            retries=config.retries,
        )
        return made(config)

    async def run(self, arguments: dict[str, Any]) -> str:
        reply = await self._endpoint.send(
            {self.argument: arguments[self.argument]}, MAX_ANSWER_BYTES
        )
        if reply.cut:
            raise RuntimeError(
                f"the {self.name} endpoint's answer is over {MAX_ANSWER_BYTES} bytes"
            )
        try:
            answer = json.loads(reply.text)
        except json.JSONDecodeError as exc:
            raise RuntimeError(f"the {self.name} endpoint's answer is not JSON: {exc}") from exc
        if not isinstance(answer, dict):
            raise RuntimeError(f"the {self.name} endpoint's answer is not a JSON object")
        return self.describe(answer)

    @abstractmethod
    def describe(self, answer: Mapping[str, Any]) -> str:
        """The line the model sees for the endpoint's `answer`; RuntimeError if malformed."""

    def _field(self, answer: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
        value = answer.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            shown = json.dumps(answer)[:200]
            raise RuntimeError(f"the {self.name} endpoint's answer has no usable {key!r}: {shown}")
        return value

    async def aclose(self) -> None:
        """Close the HTTP client (its pooled connections)."""
        await self._endpoint.aclose()


def _one_string(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "minLength": 1, "description": description}},
        "required": [name],
        "additionalProperties": False,
    }


class ImageTool(ModelTool):
    """{"prompt": ...} -> "image generated: <id>, 512x512, <url>"."""

    name = "image"
    description = "generate an image from a text prompt; answers with its id, size and URL"
    parameters: ClassVar[dict[str, Any]] = _one_string("prompt", "what the image shows")
    argument = "prompt"

    def describe(self, answer: Mapping[str, Any]) -> str:
        ident = self._field(answer, "id", str)
        width, height = self._field(answer, "width", int), self._field(answer, "height", int)
        return f"image generated: {ident}, {width}x{height}, {self._field(answer, 'url', str)}"


class TtsTool(ModelTool):
    """{"text": ...} -> "audio generated: <id>, <seconds> s, <url>"."""

    name = "tts"
    description = "speak a text aloud (text to speech); answers with the audio's id, length and URL"
    parameters: ClassVar[dict[str, Any]] = _one_string("text", "the words to speak")
    argument = "text"

    def describe(self, answer: Mapping[str, Any]) -> str:
        ident = self._field(answer, "id", str)
        seconds = float(self._field(answer, "duration_s", (int, float)))
        return f"audio generated: {ident}, {seconds:.1f} s, {self._field(answer, 'url', str)}"


def model_tools(
    image: ModelEndpointConfig | None, tts: ModelEndpointConfig | None
) -> list[ModelTool]:
    """The `image` and `tts` tools for the endpoints given (none for a None)."""
    tools: list[ModelTool] = []
    if image is not None:
        tools.append(ImageTool.from_config(image))
    if tts is not None:
        tools.append(TtsTool.from_config(tts))
    return tools
