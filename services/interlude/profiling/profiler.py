"""`interlude profile`: measure a model on this machine and write a `Profile`.

The engine is stock vLLM (`policy=None`) with prefix caching off: what is measured is the
model on the device, not a policy (ours would also read the very profile being measured), and
every prompt is computed, never found in a cache.

How iterations are timed. vLLM's engine-core process stamps every request with its own
monotonic clock: `scheduled_ts` when the scheduler admits it, `first_token_ts` and
`last_token_ts` when the step that produced a token built its outputs (`RequestOutput.metrics`).
We time from those stamps, not from this process: a stopwatch here adds the frontend's IPC and
asyncio turns, ~2.5 ms of a 4 ms iteration on 2 shared cores, and noisily. We do not use
`SchedulerIterationDetails.elapsed_ms` either: it is opt-in, logs every iteration, and starts
its clock after the step was scheduled and dispatched, so it leaves scheduling out.
* prefill (`lone`: one prompt of L tokens; `packed`: k prompts of one block each, n = k x block
  tokens, whose attention stays short): `first_token_ts - scheduled_ts`, one iteration.
* decode: B requests admitted in one iteration each generate `decode_steps` tokens;
  `(last_token_ts - first_token_ts) / (decode_steps - 1)` is the steady-state period of an
  iteration of B tokens (engine loop included).
Batches are admitted together by pausing the scheduler while they are added; a repetition whose
requests were still scheduled apart is discarded and retried. Each point is the median of
`reps` repetitions, taken in sweeps over the whole ladder. A prefill arrives at an idle engine
(its worker threads may have gone to sleep), a decode iteration follows a busy one: prefill
points carry that wake-up (a lone 1-token prefill vs a 1-request decode shows its size).

The swap bandwidth is a micro-benchmark in the worker process on the engine's own KV tensors,
with HostSwapConnector's copy operations (see profiling/swap.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from interlude.engine.config import EngineConfig, prepare_process_env
from interlude.profiling.build import (
    Limits,
    Measurements,
    ProfileRun,
    ProfileSpec,
    build_run,
    ladders,
    tokens_of,
)
from interlude.profiling.fit import Point
from interlude.profiling.swap import EXTENSION

Progress = Callable[[str, int, int], None]  # (what was just measured, steps done, steps total)


def limits_of(llm: Any) -> Limits:
    """The running engine's limits, read from the config vLLM resolved at start-up."""
    vc = llm.vllm_config
    return Limits(
        num_blocks=int(vc.cache_config.num_gpu_blocks),
        block_size=int(vc.cache_config.block_size),
        max_num_seqs=int(vc.scheduler_config.max_num_seqs),
        max_batched_tokens=int(vc.scheduler_config.max_num_batched_tokens),
        max_model_len=int(vc.model_config.max_model_len),
        vocab=int(vc.model_config.get_vocab_size()),
    )


class _Driver:
    """Sends timed batches to one AsyncLLM (all calls on the loop it runs on)."""

    def __init__(self, llm: Any, lim: Limits) -> None:
        self.llm, self.lim = llm, lim
        self._ids = itertools.count()

    def prompt(self, length: int) -> list[int]:
        """Token ids varying from request to request (prefix caching is off anyway), past the
        ids tokenizers tend to reserve for special tokens."""
        seed = next(self._ids)
        span = max(1, self.lim.vocab - 16)
        return [16 + (seed * 7919 + i * 31) % span for i in range(length)]

    async def batch(self, prompts: list[list[int]], max_tokens: int) -> list[Any] | None:
        """Run `prompts` admitted in one iteration; their final stats, or None if they were not.

        Side effects: pauses and resumes the engine's scheduler around the additions.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        together = len(prompts) > 1
        if together:  # requests added while paused are all admitted by the first step after
            await self.llm.pause_generation(mode="keep", clear_cache=False)
        try:
            queues = [
                await self.llm.add_request(
                    f"profile-{next(self._ids)}", TokensPrompt(prompt_token_ids=p), params
                )
                for p in prompts
            ]
        finally:
            if together:
                await self.llm.resume_generation()
        stats = []
        for q in queues:
            while not (out := await q.get()).finished:
                pass
            if out.metrics is None:
                raise RuntimeError("vLLM returned no request stats (is disable_log_stats on?)")
            stats.append(out.metrics)
        same = {s.scheduled_ts for s in stats}, {s.first_token_ts for s in stats}
        return stats if all(len(x) == 1 for x in same) else None

    async def time_ms(self, family: str, size: int, spec: ProfileSpec) -> float | None:
        """One repetition of a point: its iteration time in ms (None: discarded)."""
        if family == "decode":
            prompts = [self.prompt(spec.decode_prompt) for _ in range(size)]
            stats = await self.batch(prompts, spec.decode_steps)
            if stats is None or len({s.last_token_ts for s in stats}) != 1:
                return None
            s = stats[0]
            return float(s.last_token_ts - s.first_token_ts) / (spec.decode_steps - 1) * 1000
        if family == "packed":
            stats = await self.batch([self.prompt(self.lim.block_size) for _ in range(size)], 1)
        else:
            stats = await self.batch([self.prompt(size)], 1)
        if stats is None:
            return None
        return float(stats[0].first_token_ts - stats[0].scheduled_ts) * 1000


async def measure(
    llm: Any,
    spec: ProfileSpec,
    host_blocks: int,
    progress: Progress | None = None,
    note: str = "",
) -> Measurements:
    """Measure every point of `ladders` and the swap copy on a started, idle engine; `note`
    (e.g. "other processes shared the cores") goes into every measured number's source.

    Side effects: sends requests to `llm`; briefly copies KV blocks to a host pool and back
    (see profiling/swap.py). `progress` is called after each step.
    """
    lim = limits_of(llm)
    drv = _Driver(llm, lim)
    plan = [(f, s) for f, sizes in ladders(spec, lim).items() for s in sizes]
    total = spec.warmup + spec.reps * len(plan) + 1
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(label, done, total)

    for _ in range(spec.warmup):
        await drv.batch([drv.prompt(64), drv.prompt(8)], 2)
        tick("warm-up")
    points: list[Point] = []
    discarded = 0
    # Repetitions sweep the whole ladder in turn, so a burst of load from another process
    # lands on one repetition of many points (the median drops it), not on all of one point.
    for rep in range(spec.reps):
        for family, size in plan:
            n = tokens_of(family, size, lim)
            for _ in range(3):  # a batch scheduled apart is retried, twice at most
                ms = await drv.time_ms(family, size, spec)
                if ms is not None and ms > 0:
                    points.append(Point(family, n, ms))
                    break
                discarded += 1
            tick(f"{family} n={n} ({rep + 1}/{spec.reps})")
    blocks = max(1, min(lim.num_blocks, host_blocks))
    swap = (await llm.collective_rpc("interlude_swap_bench", args=(blocks, spec.swap_reps)))[0]
    kv = (await llm.collective_rpc("interlude_kv_info"))[0]
    tick("swap")
    stamp = (
        f"measured by interlude profile on {socket.gethostname()}, {kv['device']}, "
        f"{datetime.now(UTC):%Y-%m-%d}{f' ({note})' if note else ''}"
    )
    return Measurements(
        tuple(points), discarded, lim, kv_bytes_per_token(llm), host_blocks, swap, kv, stamp
    )


def kv_bytes_per_token(llm: Any) -> int:
    """layers x 2 (K and V) x KV heads x head size x bytes per element, from the model config
    (the tiny Llama: 2 x 2 x 2 x 64 x 4 = 2048)."""
    import torch

    mc = llm.vllm_config.model_config
    cache_dtype = str(llm.vllm_config.cache_config.cache_dtype)
    if cache_dtype.startswith("fp8"):  # vLLM's fp8 KV cache: one byte, whatever the model's
        element = 1
    else:
        dtype = mc.dtype if cache_dtype == "auto" else getattr(torch, cache_dtype, mc.dtype)
        element = torch.empty((), dtype=dtype).element_size()
    layers = mc.get_num_layers(llm.vllm_config.parallel_config)
    return int(layers * 2 * mc.get_total_num_kv_heads() * mc.get_head_size() * element)


def run_profile(
    config: EngineConfig,
    spec: ProfileSpec,
    name: str,
    progress: Progress | None = None,
    note: str = "",
) -> tuple[ProfileRun, Measurements]:
    """Start a stock engine for `config` (policy and prefix caching off), measure, shut down,
    and build the profile named `name` (not written anywhere).

    Side effects: starts vLLM's engine-core and worker processes (tens of seconds on CPU).
    Raises ValueError if the measurements cannot make a valid profile.
    """
    prepare_process_env()
    from vllm.v1.engine.async_llm import AsyncLLM

    config = dataclasses.replace(config, policy=None, prefix_caching=False)
    args = dataclasses.replace(config.engine_args(), worker_extension_cls=EXTENSION)
    llm = AsyncLLM.from_engine_args(args)
    try:
        m = asyncio.run(measure(llm, spec, config.host_blocks, progress, note))
    finally:
        llm.shutdown()
        # Collect it now: left to interpreter exit, vLLM's __del__ shuts down again after the
        # modules it needs are gone and prints a TypeError.
        del llm
        gc.collect()
    return build_run(m, spec, name), m
