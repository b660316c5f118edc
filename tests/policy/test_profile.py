"""`Profile`: derived quantities, the shipped profile files, and validation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from interlude.policy import Profile, available_profiles, load_profile
from interlude.policy.profile import PROFILE_DIR

# Model shapes: layers x 2 (K and V) x KV width x 2 bytes (fp16/bf16).
MODEL_SHAPES = {
    "gptj-6b-a100-40g": 28 * 2 * 4096 * 2,  # 458,752
    "llama3-8b-h100": 32 * 2 * 8 * 128 * 2,  # GQA: 8 KV heads x 128 dims = 131,072
    "llama3-8b-h200": 32 * 2 * 8 * 128 * 2,  # the same model, measured on an H200
    "vicuna-13b-a100-tp2": 40 * 2 * 5120 * 2,  # 819,200
    "llama3-70b-h100-tp4": 80 * 2 * 8 * 128 * 2,  # GQA, whole model over 4 ranks: 327,680
    "tiny-llama-cpu": 2 * 2 * 2 * 64 * 4,  # the test model: 2 layers, 2 KV heads x 64, fp32
}
NUMERIC_FIELDS = tuple(
    f.name for f in dataclasses.fields(Profile) if f.name not in ("name", "sources")
)
POSITIVE_FIELDS = tuple(f for f in NUMERIC_FIELDS if f != "fwd_a_ms")


# --- derived quantities -------------------------------------------------------------------
def test_tiny_profile_derived_values(make_profile: Callable[..., Profile]) -> None:
    p = make_profile()
    assert p.block_bytes == 16_000  # 1000 B/token x 16 tokens
    assert p.gpu_blocks == 200  # 3,200,000 B // 16,000 B
    assert p.cpu_blocks == 100  # 1,600,000 B // 16,000 B
    assert [p.blocks(n) for n in (0, 1, 16, 17, 3200)] == [0, 1, 1, 2, 200]  # ceil(n / 16)
    assert p.t_fwd(100) == pytest.approx(0.015)  # (0.05 ms x 100 + 10 ms) = 15 ms
    assert p.t_fwd(0) == 0.0 and p.t_fwd(-3) == 0.0  # no tokens, no iteration
    assert p.t_swap(500) == pytest.approx(0.05)  # 500 x 1000 B / 1e7 B/s
    # N with T_swap(N) = T_fwd(99): T_fwd(99) = 14.95 ms; 0.01495 s x 1e7 B/s / 1000 B = 149.5
    assert p.swap_budget_tokens(99) == 149
    # An empty batch counts as one token: T_fwd(1) = 10.05 ms -> 100.5 -> 100 tokens.
    assert p.swap_budget_tokens(0) == 100


def test_swap_budget_never_below_one_block(make_profile: Callable[..., Profile]) -> None:
    # 1e5 B/s: T_fwd(1) x 1e5 / 1000 = 1.005 tokens, raised to one block of 16 tokens.
    assert make_profile(swap_bandwidth_bps=1e5).swap_budget_tokens(1) == 16


def test_partial_blocks_do_not_count(make_profile: Callable[..., Profile]) -> None:
    # 16,000 x 200 + 15,999 bytes still hold only 200 whole blocks.
    assert make_profile(gpu_kv_bytes=3_215_999).gpu_blocks == 200


def test_gptj_derived_values() -> None:
    p = load_profile("gptj-6b-a100-40g")
    assert p.block_bytes == 7_340_032  # 458,752 x 16
    # 25,054,705,664 // 7,340,032: 7,340,032 x 3,413 = 25,051,529,216, remainder 3,176,448.
    assert p.gpu_blocks == 3413
    # 17,179,869,184 // 7,340,032: 7,340,032 x 2,340 = 17,175,674,880, remainder 4,194,304.
    assert p.cpu_blocks == 2340
    assert p.t_fwd(384) == pytest.approx(0.0277792)  # 0.0463 x 384 + 10 = 27.7792 ms
    assert p.t_swap(1000) == pytest.approx(0.01835008)  # 1000 x 458,752 / 25e9
    # 0.0277792 s x 25e9 B/s = 694,480,000 B; / 458,752 = 1513.8 -> 1513 tokens.
    assert p.swap_budget_tokens(384) == 1513


# --- shipped profiles ----------------------------------------------------------------------
def test_every_shipped_profile_is_listed() -> None:
    assert available_profiles() == sorted(MODEL_SHAPES)


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_shipped_profile_loads_and_matches_model_shape(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert p.kv_bytes_per_token == MODEL_SHAPES[name]
    assert p.gpu_blocks > 0 and p.cpu_blocks > 0
    # Loading by path gives the same profile as loading by name.
    assert load_profile(str(PROFILE_DIR / f"{name}.json")) == p


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_shipped_profile_sources_cover_every_number(name: str) -> None:
    p = load_profile(name)
    missing = [f for f in NUMERIC_FIELDS if not p.sources.get(f, "").strip()]
    assert missing == []
    # No stray notes for fields that do not exist.
    assert set(p.sources) <= set(NUMERIC_FIELDS)


def test_json_round_trip(tmp_path: Path, make_profile: Callable[..., Profile]) -> None:
    p = make_profile(sources={"fwd_a_ms": "estimate"})
    path = tmp_path / "mine.json"
    path.write_text(p.to_json())
    q = load_profile(str(path))
    assert q == p
    assert q.sources == {"fwd_a_ms": "estimate"}


# --- validation ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("field", POSITIVE_FIELDS)
def test_non_positive_field_rejected(
    make_profile: Callable[..., Profile], field: str, value: int
) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be > 0"):
        make_profile(**{field: value})


def test_negative_fwd_a_rejected_zero_allowed(make_profile: Callable[..., Profile]) -> None:
    with pytest.raises(ValueError, match=r"fwd_a_ms must be >= 0"):
        make_profile(fwd_a_ms=-0.01)
    assert make_profile(fwd_a_ms=0.0).t_fwd(1000) == pytest.approx(0.01)  # c only


def test_nan_fwd_a_rejected(make_profile: Callable[..., Profile]) -> None:
    """The documented invariant is fwd_a_ms >= 0; NaN is not >= 0 and poisons every T_fwd.

    A profile JSON can carry it: Python's json module reads the literal NaN.
    """
    with pytest.raises(ValueError, match=r"fwd_a_ms"):
        make_profile(fwd_a_ms=float("nan"))


def test_gpu_space_smaller_than_a_block_rejected(make_profile: Callable[..., Profile]) -> None:
    with pytest.raises(ValueError, match=r"holds no block"):
        make_profile(gpu_kv_bytes=15_999)  # one block is 16,000 bytes


def test_unknown_field_rejected(make_profile: Callable[..., Profile]) -> None:
    data = json.loads(make_profile().to_json())
    data["warp_factor"] = 9
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['warp_factor'\]"):
        Profile.from_dict(data, "test.json")


def test_missing_field_rejected(make_profile: Callable[..., Profile]) -> None:
    data = json.loads(make_profile().to_json())
    del data["saturation_tokens"]
    with pytest.raises(ValueError, match=r"profile test.json: .*saturation_tokens"):
        Profile.from_dict(data, "test.json")


def test_unknown_name_lists_the_shipped_profiles() -> None:
    with pytest.raises(ValueError, match=r"unknown profile 'nope'") as info:
        load_profile("nope")
    for name in MODEL_SHAPES:
        assert name in str(info.value)


def test_missing_path_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown profile .*absent\.json"):
        load_profile(str(tmp_path / "absent.json"))


def test_invalid_json_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", ')
    with pytest.raises(ValueError, match=r"invalid JSON"):
        load_profile(str(path))


def test_json_that_is_not_an_object_rejected(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"expected a JSON object"):
        load_profile(str(path))


def test_invalid_value_in_file_rejected(tmp_path: Path) -> None:
    data = json.loads(load_profile("gptj-6b-a100-40g").to_json())
    data["block_size"] = 0
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"block_size must be > 0"):
        load_profile(str(path))
