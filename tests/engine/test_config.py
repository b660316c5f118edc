"""EngineConfig: validation, and what it hands vLLM (no engine started)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from interlude.engine.config import EngineConfig
from interlude.enginecore.capacities import emulated_bytes_per_token, real_capacities
from interlude.policy import Profile, load_profile

# A model path that exists: only vLLM's arguments are built (no model loads), and offline
# (tests/conftest.py) vLLM resolves a path that does not exist as a Hugging Face repo id.
NO_MODEL = str(Path(__file__).parent)


def test_policy_engine_chunks_prefills_at_the_profiles_saturation_point() -> None:
    config = EngineConfig(model=NO_MODEL, policy="interlude", num_gpu_blocks=40)
    args = config.engine_args()
    s = load_profile("tiny-llama-cpu").saturation_tokens
    assert args.long_prefill_token_threshold == s
    # InferCept's steps: S tokens in all, decodes and prefill chunks (`BatchMode.CHUNKED`).
    assert args.max_num_batched_tokens == s
    assert args.scheduler_cls == "interlude.enginecore.scheduler.InterludeScheduler"
    assert args.max_model_len == 39 * 32  # one request must fit the capped pool


def test_stock_engine_is_stock() -> None:
    args = EngineConfig(model=NO_MODEL, policy=None).engine_args()
    assert args.long_prefill_token_threshold == 0
    assert args.kv_transfer_config is None and args.additional_config == {}


def test_the_host_link_sits_beside_the_host_swap_in_vllm_s_multiconnector() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from interlude.enginecore.kvlink import HostLinkConnector
    from interlude.enginecore.swap import HostSwapConnector, find_swap

    both = EngineConfig(model=NO_MODEL, host_blocks=8, kv_link=True).kv_transfer_config()
    assert both is not None and both["kv_connector"] == "MultiConnector"
    parts = both["kv_connector_extra_config"]["connectors"]
    # The swap first: a parked session's host copy wins over a (spent) remote prefill.
    assert [p["kv_connector"] for p in parts] == ["HostSwapConnector", "HostLinkConnector"]
    assert both["kv_load_failure_policy"] == "recompute"  # a lost segment is a prefill here
    alone = EngineConfig(model=NO_MODEL, policy=None, kv_link=True).kv_transfer_config()
    assert alone is not None and alone["kv_connector"] == "HostLinkConnector"
    swap = EngineConfig(model=NO_MODEL).kv_transfer_config()
    assert swap is not None and swap["kv_connector"] == "HostSwapConnector"
    assert "kv_load_failure_policy" not in swap
    # Registered by name: vLLM's stat loggers look each part of a MultiConnector up there.
    EngineConfig(model=NO_MODEL, kv_link=True).engine_args()
    assert KVConnectorFactory.get_connector_class_by_name("HostLinkConnector") is HostLinkConnector
    # The scheduler finds the swap inside the MultiConnector (host swap is not silently off).
    a, b = object.__new__(HostSwapConnector), object.__new__(HostLinkConnector)
    assert find_swap(SimpleNamespace(sub_connectors=[b, a])) is a
    assert find_swap(a) is a and find_swap(SimpleNamespace(sub_connectors=[b])) is None
    # On GPUs across hosts, vLLM's NIXL connector in our link's place (not run here).
    nixl = EngineConfig(model=NO_MODEL, kv_link=True, kv_link_via="nixl")
    parts = nixl.kv_transfer_config()["kv_connector_extra_config"]["connectors"]  # type: ignore[index]
    assert [p["kv_connector"] for p in parts] == ["HostSwapConnector", "NixlConnector"]
    with pytest.raises(ValueError, match="kv_link_via"):
        EngineConfig(model=NO_MODEL, kv_link=True, kv_link_via="rdma")
    # The arena's size reaches the connector; a size of nothing is refused.
    sized = EngineConfig(model=NO_MODEL, policy=None, kv_link=True, kv_link_arena_gib=0.5)
    assert sized.kv_transfer_config()["kv_connector_extra_config"] == {"arena_gib": 0.5}  # type: ignore[index]
    with pytest.raises(ValueError, match="kv_link_arena_gib"):
        EngineConfig(model=NO_MODEL, kv_link=True, kv_link_arena_gib=0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"policy": "nope"}, "unknown policy"),
        ({"block_size": 0}, "block_size must be >= 1"),
        ({"num_gpu_blocks": 1}, "num_gpu_blocks must be >= 2"),
        ({"host_blocks": -1}, "host_blocks must be >= 0"),
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
        ({"executor": "threads"}, "executor must be"),
        ({"stream_interval": 0}, "stream_interval must be >= 1"),
    ],
)
def test_bad_settings_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=NO_MODEL, **kw)  # type: ignore[arg-type]


def test_cpu_only_choices_apply_on_the_cpu_build_only() -> None:
    config = EngineConfig(model=NO_MODEL, policy="interlude")
    cpu = config.engine_args(cpu=True)
    assert (cpu.dtype, cpu.enforce_eager, cpu.distributed_executor_backend) == (
        "float32",
        True,
        "uni",
    )
    assert (cpu.max_num_seqs, cpu.max_model_len) == (64, 4096)
    stock = EngineConfig(model=NO_MODEL, policy=None).engine_args(cpu=True)
    assert stock.max_num_batched_tokens == 2048
    gpu = config.engine_args(cpu=False)
    # vLLM's own defaults: nothing of ours is passed.
    assert gpu.dtype == "auto" and gpu.enforce_eager is False
    assert gpu.distributed_executor_backend is None
    assert gpu.max_num_seqs is None and gpu.max_model_len is None
    tuned = EngineConfig(
        model=NO_MODEL, dtype="bfloat16", gpu_memory_utilization=0.85, tensor_parallel_size=2
    ).engine_args(cpu=False)
    assert (tuned.dtype, tuned.gpu_memory_utilization, tuned.tensor_parallel_size) == (
        "bfloat16",
        0.85,
        2,
    )


def test_the_stream_interval_reaches_vllm_for_both_kinds_of_engine() -> None:
    for policy in ("interlude", None):
        config = EngineConfig(model=NO_MODEL, policy=policy, stream_interval=4)
        assert config.engine_args(cpu=True).stream_interval == 4
    assert EngineConfig(model=NO_MODEL).engine_args(cpu=True).stream_interval == 1


def test_our_scheduler_turns_async_scheduling_off_and_stock_leaves_it_to_vllm() -> None:
    assert EngineConfig(model=NO_MODEL).engine_args(cpu=False).async_scheduling is False
    assert EngineConfig(model=NO_MODEL, policy=None).engine_args(cpu=False).async_scheduling is None


def test_the_policys_profile_takes_the_loaded_engines_kv(
    make_profile: Callable[..., Profile],
) -> None:
    named = make_profile()
    # Two layer tensors of 100 blocks, 4 KiB per block each: 8 KiB a block, 256 B a token.
    kv = SimpleNamespace(num_blocks=100, kv_cache_tensors=[SimpleNamespace(size=409_600)] * 2)
    real = real_capacities(named, kv, 32)
    assert real.kv_bytes_per_token == 256 and real.gpu_blocks == 100
    assert real.cpu_blocks == named.cpu_blocks  # the host pool keeps its block count
    assert real_capacities(named, SimpleNamespace(num_blocks=0, kv_cache_tensors=[]), 32) is named


def test_an_emulated_engine_plans_with_the_devices_bytes_per_token() -> None:
    """The tiny model's KV stands for the profile's model's: with its own 256 B a token a swap
    copy would look hundreds of times cheaper than on the device it emulates."""
    named = load_profile("gptj-6b-a100-40g")
    kv = SimpleNamespace(num_blocks=100, kv_cache_tensors=[SimpleNamespace(size=409_600)] * 2)
    device = real_capacities(named, kv, 32, device_bytes_per_token=458_752)
    assert device.kv_bytes_per_token == 458_752 and device.gpu_blocks == 100
    tiny = real_capacities(named, kv, 32)
    assert device.swap_budget_tokens(1) == named.swap_budget_tokens(1) == 547
    assert tiny.swap_budget_tokens(1) > 1000 * device.swap_budget_tokens(1)
    hf = SimpleNamespace(interlude_emulate={"fwd_a_ms": 0.05, "kv_bytes_per_token": 458_752})
    assert emulated_bytes_per_token(hf) == 458_752
    assert emulated_bytes_per_token(SimpleNamespace()) is None
