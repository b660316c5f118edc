"""A `Profile` describes one model on one GPU (or TP group): the numbers every policy needs.

Profiles are data files (``profiles/*.json`` beside this module), so that measured ones
(`interlude.profiling`) have the same schema. Every file carries a ``sources``
map saying where each number comes from and marks estimates as estimates.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

PROFILE_DIR = Path(__file__).with_name("profiles")
# The key of an emulated model's config.json (`engine/emulate.py`) that holds the profile it
# stands for. Here, below both the model plugin that writes it and the scheduler that reads it.
EMULATE_KEY = "interlude_emulate"


@dataclass(frozen=True)
class Profile:
    """Cost model and capacities of a model served on a device.

    Invariants (checked in ``__post_init__``): all sizes positive, ``fwd_a_ms >= 0``.
    """

    name: str
    # Bytes of KV cache one token occupies across all layers (K and V), i.e. the paper's `M`.
    kv_bytes_per_token: int
    # Iteration time fit T_fwd(n) = a*n + c for n scheduled tokens, in milliseconds.
    fwd_a_ms: float
    fwd_c_ms: float
    # Saturation point S: tokens per iteration beyond which throughput stops rising.
    saturation_tokens: int
    # Host<->device copy bandwidth for swapping KV, bytes per second (per direction).
    swap_bandwidth_bps: float
    # KV capacity in bytes on the GPU(s) after weights and activations, and in host memory.
    gpu_kv_bytes: int
    cpu_kv_bytes: int
    # Tokens per KV block (vLLM's block_size).
    block_size: int = 16
    # vLLM's max_num_seqs and the token budget of an unchunked (prefill-first) iteration.
    max_num_seqs: int = 256
    max_batched_tokens: int = 4096
    # Where each number comes from; estimates say "estimate".
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        positive = {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "saturation_tokens": self.saturation_tokens,
            "swap_bandwidth_bps": self.swap_bandwidth_bps,
            "gpu_kv_bytes": self.gpu_kv_bytes,
            "cpu_kv_bytes": self.cpu_kv_bytes,
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_batched_tokens": self.max_batched_tokens,
            "fwd_c_ms": self.fwd_c_ms,
        }
        for key, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(
                    f"profile {self.name!r}: {key} must be > 0 and finite, got {value!r}"
                )
        if not (self.fwd_a_ms >= 0 and math.isfinite(self.fwd_a_ms)):
            raise ValueError(
                f"profile {self.name!r}: fwd_a_ms must be >= 0 and finite, got {self.fwd_a_ms}"
            )
        if self.gpu_blocks < 1:
            raise ValueError(f"profile {self.name!r}: GPU KV space holds no block")

    # --- derived quantities -------------------------------------------------------------
    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def gpu_blocks(self) -> int:
        return self.gpu_kv_bytes // (self.kv_bytes_per_token * self.block_size)

    @property
    def cpu_blocks(self) -> int:
        return self.cpu_kv_bytes // (self.kv_bytes_per_token * self.block_size)

    def blocks(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens of KV."""
        return -(-tokens // self.block_size)

    def t_fwd(self, tokens: float) -> float:
        """Seconds for one iteration that schedules `tokens` tokens (0 tokens: no iteration)."""
        if tokens <= 0:
            return 0.0
        return (self.fwd_a_ms * tokens + self.fwd_c_ms) / 1000.0

    def t_swap(self, tokens: float) -> float:
        """Seconds to copy `tokens` tokens of KV one way over the host link."""
        return tokens * self.kv_bytes_per_token / self.swap_bandwidth_bps

    def swap_budget_tokens(self, batch_tokens: int) -> int:
        """Tokens one iteration of `batch_tokens` can swap: the N with T_swap(N) = T_fwd(batch).

        With an empty batch there is no compute to hide the copy behind; we still allow one
        fwd_c_ms worth of copying so that a swapped-out request can always come back.
        """
        t = self.t_fwd(max(batch_tokens, 1))
        return max(
            self.block_size, math.floor(t * self.swap_bandwidth_bps / self.kv_bytes_per_token)
        )

    def dilated(self, k: float) -> Profile:
        """This device run `k` times slower: every iteration and every swap copy takes `k`
        times as long, the capacities stay. An emulated engine (`engine/emulate.py`) on the
        dilated profile, with tool times and arrival gaps also multiplied by `k`, replays the
        same schedule in `k` times the wall time, so the serving path's CPU work weighs `k`
        times less: a host CPU `k` times faster than the one that runs it."""
        if not (k >= 1 and math.isfinite(k)):
            raise ValueError(f"a dilation must be >= 1 and finite, got {k!r}")
        if k == 1:
            return self
        return replace(
            self,
            name=f"{self.name}-x{k:g}",
            fwd_a_ms=self.fwd_a_ms * k,
            fwd_c_ms=self.fwd_c_ms * k,
            swap_bandwidth_bps=self.swap_bandwidth_bps / k,
            sources={**self.sources, "dilation": f"{self.name} run {k:g}x slower"},
        )

    # --- I/O -----------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, object], source: str = "<dict>") -> Profile:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"profile {source}: unknown field(s) {unknown}")
        try:
            return cls(**data)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ValueError(f"profile {source}: {exc}") from exc


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """Load a shipped profile by name, or any profile JSON by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ValueError(
            f"unknown profile {name_or_path!r}; shipped profiles: {', '.join(available_profiles())}"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"profile {path}: expected a JSON object")
    return Profile.from_dict(data, str(path))
