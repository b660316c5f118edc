"""Forward-time and swap measurements of a model *shape* with torch alone, for GPU machines that
have no vLLM (the machines lent to this project have PyTorch and no network).

`interlude profile` measures the real engine; this measures the same quantities on a
random-weight decoder with the shape of a real model, run the way vLLM runs it on a GPU:
fused QKV and gate-up projections, bf16, grouped-query attention through
`scaled_dot_product_attention`, logits only for each sequence's last token, and decode
iterations replayed from CUDA graphs. It leaves out vLLM's fused kernels (RMSNorm+residual,
SiLU-and-mul, rotary in place) and paged attention, so its times are an upper bound of a
well-tuned engine's, close where GEMMs dominate (large batches) and above it where launches do.

The families mirror `interlude profile`'s (`profiling/profiler.py`): `decode` (B sequences of
`context` tokens each add one), `packed` (k prompts of one block each) and `lone` (one prompt
of L tokens). The swap bandwidth is `ProfilerWorkerExtension.interlude_swap_bench` itself, run
on KV tensors in vLLM's flash-attention layout, so it is `HostSwapConnector`'s copy path.

Side effects: allocates the weights (16 GB for llama3-8b), the decode KV and a pinned host
pool on the device; prints one line per family while it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from interlude.profiling.fit import Point, fit_knee, fit_linear, median_points, saturation_point
from interlude.profiling.swap import ProfilerWorkerExtension, device_name

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (K, V)


@dataclass(frozen=True)
class Shape:
    """A decoder's dimensions (Llama-style: RMSNorm, GQA attention, gated MLP)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def __post_init__(self) -> None:
        if min(asdict(self)[k] for k in asdict(self) if k != "name") < 1:
            raise ValueError(f"shape {self.name!r}: every dimension must be >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"shape {self.name!r}: heads must be a multiple of kv_heads")

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


SHAPES = {
    "llama3-8b": Shape("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "tiny": Shape("tiny", 2, 64, 4, 2, 16, 128, 256),  # for tests on a CPU
}


class Decoder:
    """Random weights of `shape` and one forward pass: tokens [B, T] with an optional KV
    context [B, kv_heads, C, head_dim] per layer (attended to, then the new tokens' K/V written
    over its last slot, so shapes stay static for CUDA graphs). Returns last-token logits."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype) -> None:
        s, g = shape, torch.Generator(device=device).manual_seed(0)

        def w(*dims: int) -> torch.Tensor:
            return torch.randn(*dims, generator=g, device=device, dtype=dtype) * 0.02

        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.shape = s
        self.embed = w(s.vocab, s.hidden)
        self.qkv = [w(s.hidden, q + 2 * kv) for _ in range(s.layers)]
        self.o = [w(q, s.hidden) for _ in range(s.layers)]
        self.gate_up = [w(s.hidden, 2 * s.intermediate) for _ in range(s.layers)]
        self.down = [w(s.intermediate, s.hidden) for _ in range(s.layers)]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.hidden, s.vocab)

    def forward(
        self, tokens: torch.Tensor, context: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        s = self.shape
        b, t = tokens.shape
        x = self.embed[tokens]
        for i in range(s.layers):
            h = F.rms_norm(x, (s.hidden,), self.norm)
            q, k, v = torch.split(
                h @ self.qkv[i],
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim],
                -1,
            )
            q = _rotate(q.view(b, t, s.heads, s.head_dim).transpose(1, 2))
            k = _rotate(k.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2))
            v = v.view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            if context:  # decode: one new token attends to the cached context
                kc, vc = context[i]
                kc[:, :, -1:].copy_(k)
                vc[:, :, -1:].copy_(v)
                a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            else:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, t, -1) @ self.o[i]
            gate, up = (F.rms_norm(x, (s.hidden,), self.norm) @ self.gate_up[i]).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ self.down[i]
        return F.rms_norm(x[:, -1], (s.hidden,), self.norm) @ self.lm_head


def _rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding's cost (two halves swapped and scaled), not its exact angles."""
    half = x.shape[-1] // 2
    return x * 0.5 + torch.cat((-x[..., half:], x[..., :half]), -1) * 0.5


def _median_ms(run: Callable[[], Any], reps: int, cuda: bool) -> float:
    """Median wall time of `run` over `reps` calls after one warm-up, synchronised on CUDA."""
    times = []
    for i in range(reps + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _graphed(fn: Callable[[], Any], cuda: bool) -> Callable[[], Any]:
    """`fn` replayed from a CUDA graph (as vLLM runs decode), or `fn` itself off CUDA."""
    if not cuda:
        return fn
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the graph: lazy initialisation must not be captured
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _context(model: Decoder, batch: int, context: int) -> KV:
    """A decode batch's cached KV: [batch, kv_heads, context, head_dim] per layer, K and V."""
    s, dev, dtype = model.shape, model.embed.device, model.embed.dtype
    dims = (batch, s.kv_heads, context, s.head_dim)
    return [
        (torch.zeros(dims, device=dev, dtype=dtype), torch.zeros(dims, device=dev, dtype=dtype))
        for _ in range(s.layers)
    ]


def _point(model: Decoder, family: str, size: int, context: int, block: int, reps: int) -> Point:
    """The median time of `reps` forward passes of one iteration shape."""
    dev = model.embed.device
    cuda = dev.type == "cuda"
    batch, length = {"decode": (size, 1), "packed": (size, block), "lone": (1, size)}[family]
    tokens = torch.randint(0, model.shape.vocab, (batch, length), device=dev)
    ctx = _context(model, batch, context) if family == "decode" else []
    run = _graphed(lambda: model.forward(tokens, ctx), cuda and family == "decode")
    return Point(family, batch * length, _median_ms(run, reps, cuda))


def measure_forward(
    model: Decoder, ladders: dict[str, list[int]], context: int, block: int, reps: int
) -> list[Point]:
    """One `Point` per (family, size): the median iteration time of `reps` forward passes."""
    points: list[Point] = []
    with torch.inference_mode():
        for family, sizes in ladders.items():
            for size in sizes:
                point = _point(model, family, size, context, block, reps)
                points.append(point)
                print(f"  {family:6} {point.tokens:6d} tokens  {point.ms:8.2f} ms", flush=True)
                if model.embed.device.type == "cuda":
                    torch.cuda.empty_cache()  # the graph's pool and the last batch's KV
    return points


def measure_swap(
    shape: Shape, dtype: torch.dtype, num_blocks: int, blocks: int, block: int, reps: int
) -> dict[str, Any]:
    """`interlude_swap_bench` on KV tensors laid out as vLLM's flash-attention backend lays
    them out ([2, blocks, block, kv_heads, head_dim] per layer)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kv = [
        torch.randn(2, num_blocks, block, shape.kv_heads, shape.head_dim, device=dev, dtype=dtype)
        for _ in range(shape.layers)
    ]
    worker: Any = SimpleNamespace(
        model_runner=SimpleNamespace(kv_caches=kv),
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=num_blocks)),
    )
    worker._interlude_kv = ProfilerWorkerExtension._interlude_kv.__get__(worker)
    return ProfilerWorkerExtension.interlude_swap_bench(worker, blocks, reps)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure, fit and return everything as one JSON-ready dict."""
    cuda = torch.cuda.is_available()
    dev, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
    shape = SHAPES[args.shape]
    print(f"{device_name()}: {shape.name} forward, torch {torch.__version__}", flush=True)
    model = Decoder(shape, dev, dtype)
    ladders = {
        "decode": [int(x) for x in args.decode.split(",")],
        "packed": [int(x) for x in args.packed.split(",")],
        "lone": [int(x) for x in args.lone.split(",")],
    }
    points = median_points(measure_forward(model, ladders, args.context, args.block, args.reps))
    del model
    fit = fit_linear(points)
    swap = measure_swap(shape, dtype, args.swap_blocks * 4, args.swap_blocks, args.block, args.reps)
    out = {
        "device": device_name(),
        "shape": asdict(shape),
        "dtype": str(dtype),
        "context": args.context,
        "points": [asdict(p) for p in points],
        "fit": asdict(fit),
        "saturation_tokens": saturation_point(points),
        "knee_tokens": fit_knee(fit) if fit.a_ms else math.inf,
        "kv_bytes_per_token": shape.kv_bytes_per_token(dtype.itemsize),
        "swap": swap,
        "save_gbps": swap["bytes"] / swap["save_s"] / 1e9,
        "load_gbps": swap["bytes"] / swap["load_s"] / 1e9,
    }
    print(
        f"fit T = {fit.a_ms:.5f} ms/token x n + {fit.c_ms:.3f} ms (r2 {fit.r2:.3f}, rms rel err"
        f" {fit.rms_rel_err:.1%}); S = {out['saturation_tokens']}; swap save"
        f" {out['save_gbps']:.1f} GB/s, load {out['load_gbps']:.1f} GB/s",
        flush=True,
    )
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--decode", default="1,8,32,64,128,256", help="decode batch sizes")
    p.add_argument("--packed", default="8,32,128,256", help="prompts of one block each")
    p.add_argument("--lone", default="128,512,1024,2048,4096,8192", help="prompt lengths")
    p.add_argument("--context", type=int, default=1024, help="tokens each decoding sequence holds")
    p.add_argument("--block", type=int, default=16, help="tokens per KV block")
    p.add_argument("--swap-blocks", type=int, default=256, help="blocks per swap copy")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    out = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
