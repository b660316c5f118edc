"""EngineConfig: everything one Interlude engine needs, validated once, turned into vLLM args.

The policy, the profile and the host pool reach the scheduler and connector through vLLM's own
config (`additional_config`, `kv_transfer_config`), because vLLM constructs both itself in the
engine-core process.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from interlude.policy import POLICIES, Profile, load_profile

SCHEDULER_CLS = "interlude.engine.scheduler.InterludeScheduler"
CONNECTOR = ("HostSwapConnector", "interlude.engine.swap")


@dataclass(frozen=True)
class EngineConfig:
    """One engine. `policy=None` is stock vLLM: our scheduler and connector are not loaded."""

    model: str  # a local checkpoint directory (no hub access)
    policy: str | None = "interlude"
    profile: str = "tiny-llama-cpu"  # a shipped profile name or a JSON file path
    num_gpu_blocks: int | None = None  # cap on KV blocks (None: whatever memory allows)
    host_blocks: int = 0  # host swap pool, in blocks (0: no swapping)
    block_size: int = 32
    max_num_seqs: int = 64
    max_model_len: int = 4096
    max_num_batched_tokens: int = 2048
    prefix_caching: bool = True
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from {sorted(POLICIES)}")
        for name in ("block_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError("EngineConfig.num_gpu_blocks must be >= 2")
        if self.host_blocks < 0:
            raise ValueError("EngineConfig.host_blocks must be >= 0")

    def engine_profile(self, kv_bytes_per_token: int | None = None) -> Profile:
        """The named profile with capacities replaced by this engine's real ones."""
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
            max_num_seqs=self.max_num_seqs,
            max_batched_tokens=self.max_num_batched_tokens,
        )

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        kw: dict[str, Any] = dict(
            model=self.model,
            tokenizer=self.model,
            enforce_eager=True,
            distributed_executor_backend="uni",
            block_size=self.block_size,
            num_gpu_blocks_override=self.num_gpu_blocks,
            enable_prefix_caching=self.prefix_caching,
            dtype=self.dtype,
            max_num_seqs=self.max_num_seqs,
            # A capped pool must still hold one whole request (vLLM checks at start-up; one
            # block is its null block).
            max_model_len=min(
                self.max_model_len, ((self.num_gpu_blocks or 1 << 30) - 1) * self.block_size
            ),
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_chunked_prefill=True,
            seed=self.seed,
            disable_log_stats=False,
        )
        if self.policy is not None:
            profile = self.engine_profile()
            kw["scheduler_cls"] = SCHEDULER_CLS
            # A prefill, a discarded request's recompute included, takes at most S tokens a
            # step while others run: the chunk size the policies' waste model assumes.
            kw["long_prefill_token_threshold"] = min(profile.saturation_tokens, kw["max_model_len"])
            kw["additional_config"] = {
                "interlude": {"policy": self.policy, "profile": dataclasses.asdict(profile)}
            }
            kw["kv_transfer_config"] = {
                "kv_connector": CONNECTOR[0],
                "kv_connector_module_path": CONNECTOR[1],
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"host_blocks": self.host_blocks},
            }
        return AsyncEngineArgs(**kw)


def prepare_process_env(scratch: str | None = None) -> None:
    """Settings vLLM reads from the environment; set before `import vllm` (DESIGN section 3)."""
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
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
