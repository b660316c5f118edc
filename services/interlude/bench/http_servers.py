"""The servers `bench http` compares, started as local processes on one machine.

* stock vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`), its engine
  arguments derived from the same `EngineConfig` our engine is built from with `policy=None`
  (block size, KV blocks, batch limits, dtype, eager mode, prefix caching on or off), so both
  get the same model and the same KV space; its log goes to a file;
* the Interlude stack (`interlude up`: embedded Valkey, a tools-svc worker, one engine, the
  gateway; the gateway's rate limit off).

Each is a context manager yielding the server's OpenAI base URL (".../v1"); leaving it stops
every process it started (their whole process groups).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from interlude.engine.config import EngineConfig, prepare_process_env
from interlude.stack.procs import stop_group
from interlude.stack.valkey import free_port

# EngineConfig's vLLM arguments that stock vLLM's server takes as flags of the same name.
_FLAGS = (
    "block_size",
    "num_gpu_blocks_override",
    "dtype",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "seed",
    "distributed_executor_backend",
    "stream_interval",
)


def _import_vllm_quietly() -> None:
    """Import vLLM without its import-time warnings (Triton without a CPU backend, printed
    before vLLM configures its logger): this process's terminal shows the benchmark's progress;
    the servers it starts log to their files as usual."""
    if "vllm" in sys.modules:
        return
    logging.disable(logging.WARNING)
    try:
        import vllm.engine.arg_utils  # noqa: F401
    finally:
        logging.disable(logging.NOTSET)


def stock_vllm_argv(
    model: str,
    port: int,
    prefix_caching: bool,
    blocks: int | None,
    async_scheduling: bool = True,
    tool_parser: str | None = None,
    batch: tuple[int, int] | None = None,
    stream_interval: int = 1,
) -> list[str]:
    """The api_server command line for `model` with what `EngineConfig` would give vLLM.
    `batch`: (max_num_seqs, max_num_batched_tokens) instead of the CPU defaults (an emulated
    accelerator's, as `interlude engine --emulate` takes them).
    `async_scheduling=False` turns off vLLM's default overlap of scheduling with the forward
    pass, which our scheduler does not support yet (docs/engine.md): the like-for-like arm.
    `tool_parser` (e.g. "hermes", the tiny model's markup) lets the model's own calls be parsed
    (`--enable-auto-tool-choice`): needed for `loadgen run --calls model`. `stream_interval`:
    tokens per streamed chunk, as `EngineConfig.stream_interval` gives our engine."""
    _import_vllm_quietly()
    seqs, tokens = batch or (None, None)
    cfg = EngineConfig(
        model=model,
        policy=None,
        prefix_caching=prefix_caching,
        num_gpu_blocks=blocks,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        stream_interval=stream_interval,
    )
    args = cfg.engine_args(cpu=True)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--served-model-name", served_name(model), "--host", "127.0.0.1", "--port", str(port)]
    for name in _FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    argv.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if getattr(args, "enforce_eager", False):
        argv.append("--enforce-eager")
    argv += ["--enable-chunked-prefill", "--disable-uvicorn-access-log"]
    if not async_scheduling:
        argv.append("--no-async-scheduling")
    if tool_parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    return argv


def served_name(model: str) -> str:
    """The model's name in the API: what `interlude engine` serves a model directory as."""
    return os.path.basename(model.rstrip("/"))


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, log: Path, timeout_s: float) -> None:
    """Wait until `url` answers 200; RuntimeError (with the log's tail) if `proc` exits or
    `timeout_s` passes."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode}):\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s:g} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def stock_vllm(
    model: str,
    prefix_caching: bool,
    blocks: int | None,
    log: Path,
    timeout_s: float = 300.0,
    async_scheduling: bool = True,
    tool_parser: str | None = None,
    batch: tuple[int, int] | None = None,
    stream_interval: int = 1,
) -> Iterator[str]:
    """Stock vLLM's OpenAI server on a free port; yields its base URL."""
    prepare_process_env()
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            stock_vllm_argv(
                model,
                port,
                prefix_caching,
                blocks,
                async_scheduling,
                tool_parser,
                batch,
                stream_interval,
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
            start_new_session=True,  # stopping its group stops vLLM's engine-core child too
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", proc, log, timeout_s)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_group(proc.pid)


@contextlib.contextmanager
def interlude_stack(
    model: str,
    blocks: int | None,
    run_dir: Path,
    client_deadline_s: float = 300.0,
    emulate: str | None = None,
    roles: tuple[str, ...] = ("mixed",),
    front: str = "gateway",
    stream_interval: int = 1,
) -> Iterator[str]:
    """`interlude up` with an engine per role (`roles`) of `model`, each capped at `blocks` KV
    blocks, in benchmark mode (the load generator scripts its calls with `interlude_script`);
    yields the base URL of its `front`: the gateway (over its links to the engines, or with
    "gateway-http" a connection per request), or ("envoy") a real Envoy asking `interlude
    picker` for each request, the InferencePool path (`envoy_front`). `emulate`: the
    engines run the tiny model on the emulated accelerator of this profile (a name or JSON
    path), whose capacities replace `model` and `blocks`. `stream_interval`: each engine's
    tokens per streamed chunk."""
    from interlude.stack.up import StackConfig, down, up

    port = free_port()
    cfg = StackConfig(
        run_dir=run_dir,
        model="tiny" if emulate else model,
        blocks=None if emulate else blocks,
        port=port,
        engine_port=port + 1,
        rate_limit="",
        client_deadline_s=client_deadline_s,
        emulate=emulate,
        benchmark_mode=True,
        engines=len(roles),
        roles=roles if set(roles) != {"mixed"} else (),
        gateway_upstream="http" if front == "gateway-http" else "",
        stream_interval=stream_interval,
    )
    try:
        state = up(cfg)
        if front == "envoy":
            with envoy_front(state.engines, run_dir / "logs") as url:
                yield url + "/v1"
        else:
            yield state.gateway + "/v1"
    finally:
        down(run_dir)


@contextlib.contextmanager
def envoy_front(engines: list[str], logs: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """`interlude picker` (no keys, benchmark mode) and a real Envoy (one worker thread) in
    front of `engines`, as a Gateway API implementation runs an InferencePool; yields Envoy's
    base URL once the picker has read every engine."""
    from interlude.bench.envoy import envoy_binary, envoy_config

    grpc, metrics, listen, admin = (free_port() for _ in range(4))
    picker = [sys.executable, "-m", "interlude.cli", "picker", "--no-auth", "--benchmark-mode"]
    picker += ["--host", "127.0.0.1", "--port", str(grpc), "--metrics-port", str(metrics)]
    for e in engines:
        picker += ["--engine", e]
    config = logs / "envoy.json"
    hosts = [e.removeprefix("http://") for e in engines]
    config.write_text(json.dumps(envoy_config(listen, admin, grpc, hosts)))
    envoy = [envoy_binary(), "-c", str(config), "--log-level", "warn", "--concurrency", "1"]
    envoy += ["--base-id", str(listen)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (("picker", picker), ("envoy", envoy)):
            with (logs / f"{name}.log").open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        wait_http(f"http://127.0.0.1:{metrics}/metrics", procs[0], logs / "picker.log", timeout_s)
        wait_http(f"http://127.0.0.1:{admin}/ready", procs[1], logs / "envoy.log", timeout_s)
        seen = f'interlude:picker_engines{{ready="true"}} {float(len(engines))}'
        end = time.monotonic() + timeout_s
        while seen not in httpx.get(f"http://127.0.0.1:{metrics}/metrics").text:
            if time.monotonic() > end:
                raise RuntimeError(
                    f"the picker did not see the engines:\n{_tail(logs / 'picker.log')}"
                )
            time.sleep(0.2)
        yield f"http://127.0.0.1:{listen}"
    finally:
        for p in procs:
            stop_group(p.pid)
