"""Prefill and decode roles, the engine's part (docs/disaggregation.md).

* Prefill side, ``POST /v1/prefill`` (`prefill_router`): the prompt's tokens run as a one-token
  request marked `do_remote_decode`; the host link (enginecore/kvlink.py) writes their KV to a
  shared-memory segment before the answer leaves, and the answer carries the
  `kv_transfer_params` that name it. Only callers with the gateway token, when one is set.
* Decode side (`PrefillClient`): a new session whose request names a prefill engine
  (`api.engine.PREFILL_HEADER`, set by the gateway) asks it to prefill the rendered prompt, then
  starts with those params: vLLM loads the KV and computes only the prompt's last token. A
  prompt shorter than `min_tokens` is prefilled here (a hop costs more than it saves: llm-d's
  rule on non-cached tokens), and a prefill engine that fails or does not answer in time costs
  the session its prefill here, never the session.

A role is a routing property: every engine with the host link can do both.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import APIRouter, Request
from prometheus_client import Counter

from interlude.api.engine import (
    GATEWAY_TOKEN_HEADER,
    PrefillAnswer,
    PrefillBody,
    from_gateway,
)
from interlude.engine.request import RequestError
from interlude.engine.session_api import Forbidden

log = logging.getLogger(__name__)

REMOTE_PREFILLS = Counter(
    "interlude:remote_prefills",
    "New sessions by where their prompt was prefilled: remote (a prefill engine), short "
    "(prefilled here, under the minimum), failed (prefilled here after the prefill engine "
    "failed)",
    ["outcome"],
)
PREFILLS_SERVED = Counter("interlude:prefills_served", "Prompts prefilled here for a decode engine")


class NoHostLink(RuntimeError):
    """This engine cannot hand KV to another (started without `--kv-link`)."""


def check_prompt(prompt: list[int], vocab: int, max_model_len: int) -> None:
    """RequestError (a 400) for tokens this model has not, or a prompt that leaves no room."""
    if any(not 0 <= t < vocab for t in prompt):
        raise RequestError(f"token ids must be in [0, {vocab})", "prompt_token_ids")
    if len(prompt) >= max_model_len:
        raise RequestError(
            f"{len(prompt)} tokens; this engine takes fewer than {max_model_len}",
            "prompt_token_ids",
        )


async def prefill_here(llm: Any, prompt: list[int]) -> PrefillAnswer:
    """Prefill `prompt` on this engine and keep its KV for a decode engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=1,
        temperature=0.0,
        output_kind=RequestOutputKind.FINAL_ONLY,
        extra_args={"kv_transfer_params": {"do_remote_decode": True}},
    )
    check_prompt(prompt, llm.model_config.get_vocab_size(), llm.model_config.max_model_len)
    last = None
    rid = f"prefill-{uuid.uuid4().hex[:12]}"
    async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), params, rid):
        last = out
    if last is None or not last.kv_transfer_params:
        raise NoHostLink("this engine has no host link to hand KV over (start it with --kv-link)")
    PREFILLS_SERVED.inc()
    return PrefillAnswer(
        kv_transfer_params=dict(last.kv_transfer_params),
        prompt_tokens=len(prompt),
        cached_tokens=max(0, int(last.num_cached_tokens or 0)),
    )


def prefill_router(llm: Callable[[], Any], gateway_token: str) -> APIRouter:
    """``POST /v1/prefill``; `llm()` gives vLLM's engine once up (it raises while not)."""
    router = APIRouter()

    @router.post("/v1/prefill")
    async def prefill(body: PrefillBody, request: Request) -> PrefillAnswer:
        if not from_gateway(request.headers, gateway_token):
            raise Forbidden("/v1/prefill takes only callers with the gateway token")
        return await prefill_here(llm(), body.prompt_token_ids)

    return router


class PrefillClient:
    """The decode side: has a prompt prefilled on a prefill engine.

    Side effects: one HTTP request per remote prefill; `REMOTE_PREFILLS`. Never raises for the
    prefill engine's faults: None means "prefill here"."""

    def __init__(self, gateway_token: str, min_tokens: int, timeout_s: float = 60.0) -> None:
        if min_tokens < 1 or timeout_s <= 0:
            raise ValueError("PrefillClient: min_tokens must be >= 1 and timeout_s > 0")
        self.min_tokens = min_tokens
        headers = {GATEWAY_TOKEN_HEADER: gateway_token} if gateway_token else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout_s)

    async def fetch(self, base_url: str, prompt: list[int]) -> dict[str, Any] | None:
        """The `kv_transfer_params` of `prompt` prefilled at `base_url`, or None."""
        if len(prompt) < self.min_tokens:
            REMOTE_PREFILLS.labels("short").inc()
            return None
        try:
            r = await self._http.post(
                f"{base_url.rstrip('/')}/v1/prefill", json={"prompt_token_ids": prompt}
            )
            r.raise_for_status()
            answer = PrefillAnswer.model_validate(r.json())
        except (httpx.HTTPError, ValueError) as e:
            log.warning("prefill at %s failed (%s); prefilling here", base_url, e)
            REMOTE_PREFILLS.labels("failed").inc()
            return None
        REMOTE_PREFILLS.labels("remote").inc()
        return answer.kv_transfer_params

    async def close(self) -> None:
        await self._http.aclose()
