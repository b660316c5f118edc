"""The torch-only forward and swap measurement (`profiling/torch_forward.py`) on the tiny shape,
on this CPU: every family is measured, the fit is valid, and the swap benchmark is the engine's
own copier moving real bytes. On a GPU machine the same module measures llama3-8b."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from interlude.profiling.torch_forward import SHAPES, Decoder, Shape, main, measure_swap


def test_shape_rejects_uneven_gqa() -> None:
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        Shape("bad", 1, 8, 3, 2, 4, 8, 8)


def test_kv_bytes_per_token_matches_the_llama3_8b_profile() -> None:
    assert SHAPES["llama3-8b"].kv_bytes_per_token(2) == 131072  # llama3-8b-h100.json's value


def test_decode_writes_the_new_tokens_kv_into_the_context() -> None:
    s = SHAPES["tiny"]
    model = Decoder(s, torch.device("cpu"), torch.float32)
    ctx = [
        (torch.zeros(3, s.kv_heads, 5, s.head_dim), torch.zeros(3, s.kv_heads, 5, s.head_dim))
        for _ in range(s.layers)
    ]
    logits = model.forward(torch.tensor([[1], [2], [3]]), ctx)
    assert logits.shape == (3, s.vocab)
    for k, v in ctx:
        assert k[:, :, -1].abs().sum() > 0 and v[:, :, -1].abs().sum() > 0
        assert k[:, :, :-1].abs().sum() == 0  # only the last slot is written


def test_swap_bench_moves_and_restores_the_blocks() -> None:
    out = measure_swap(SHAPES["tiny"], torch.float32, num_blocks=16, blocks=4, block=16, reps=2)
    assert out["blocks"] == 4
    assert out["bytes"] == 4 * 16 * SHAPES["tiny"].kv_bytes_per_token(4)
    assert out["save_s"] > 0 and out["load_s"] > 0


def test_main_writes_points_fit_and_swap(tmp_path: Path) -> None:
    path = tmp_path / "fwd.json"
    main(
        ["--shape", "tiny", "--decode", "1,4", "--packed", "2", "--lone", "16,64",
         "--context", "32", "--swap-blocks", "4", "--reps", "2", "--json", str(path)]
    )  # fmt: skip
    out = json.loads(path.read_text())
    assert {(p["family"], p["tokens"]) for p in out["points"]} == {
        ("decode", 1), ("decode", 4), ("packed", 32), ("lone", 16), ("lone", 64)
    }  # fmt: skip
    assert out["fit"]["a_ms"] >= 0 and out["fit"]["c_ms"] >= 0 and out["fit"]["points"] == 5
    assert out["saturation_tokens"] in {p["tokens"] for p in out["points"]}
    assert math.isfinite(out["save_gbps"]) and out["save_gbps"] > 0
