"""Worker-side half of `interlude profile`: KV layout and the swap copy micro-benchmark.

vLLM mixes `ProfilerWorkerExtension` into its worker class when the engine is started with
``worker_extension_cls`` set to `EXTENSION` (profiler.py does), and `collective_rpc` calls its
methods by name. They run in the worker process, next to the engine's real KV tensors, so the
benchmark copies the very tensors (shape, dtype, layout, device) `HostSwapConnector` would,
with its own `BlockCopier` (pinned host memory and a side stream on CUDA, as there).

Arguments and results are plain ints, floats, strings and lists: vLLM's RPC carries nothing
else without pickling.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

EXTENSION = "interlude.profiling.swap.ProfilerWorkerExtension"


def device_name() -> str:
    """The accelerator's name on CUDA, else the CPU model from /proc/cpuinfo (or 'cpu')."""
    import torch

    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name()}"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"CPU {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return "cpu"


class ProfilerWorkerExtension:
    """Methods vLLM adds to its worker for the profiler (names are prefixed to avoid clashes)."""

    # Set by vLLM's worker, the class this one is mixed into (annotations only: no attributes,
    # so vLLM's check for name clashes with the worker sees nothing here but the methods).
    model_runner: Any
    vllm_config: Any

    def _interlude_kv(self) -> tuple[list[Any], int]:
        num_blocks = int(self.vllm_config.cache_config.num_gpu_blocks)
        seen: dict[int, Any] = {}
        for t in self.model_runner.kv_caches:  # shared layers reuse a tensor: count it once
            seen.setdefault(t.data_ptr(), t)
        return list(seen.values()), num_blocks

    def interlude_kv_info(self) -> dict[str, Any]:
        """The engine's KV tensors: total bytes, block count, per-layer shapes, device name."""
        tensors, num_blocks = self._interlude_kv()
        return {
            "bytes": sum(t.numel() * t.element_size() for t in tensors),
            "num_blocks": num_blocks,
            "shapes": [list(t.shape) for t in tensors],
            "dtype": str(tensors[0].dtype) if tensors else "",
            "device": device_name(),
        }

    def interlude_swap_bench(self, blocks: int, reps: int) -> dict[str, Any]:
        """Time copying `blocks` KV blocks of every layer to a host pool and back, `reps` times.

        Side effects: allocates a host pool of `blocks` blocks per layer for the duration, and
        writes into the engine's KV cache, but only the bytes read from it the moment before
        (each load copies back what the save just took), so no cached KV changes. Run it while
        no request is in flight. Returns median seconds per direction and the bytes moved.
        """
        import torch

        from interlude.enginecore.swap_copy import BlockCopier

        tensors, num_blocks = self._interlude_kv()
        if not 1 <= blocks <= num_blocks or reps < 1:
            raise ValueError(f"need 1 <= blocks <= {num_blocks} and reps >= 1")
        copier = BlockCopier(capacity=blocks, num_gpu_blocks=num_blocks)
        copier.register({str(i): t for i, t in enumerate(tensors)})
        # A fixed scattered choice of blocks: a parked request's blocks are rarely adjacent.
        gen = torch.Generator().manual_seed(0)
        gpu_ids = torch.randperm(num_blocks, generator=gen)[:blocks].tolist()
        pairs = list(zip(gpu_ids, range(blocks), strict=True))  # (gpu block, host slot)

        def sync() -> None:
            if copier.cuda:
                torch.cuda.synchronize()

        def save() -> None:  # device -> host, as in HostSwapConnector's step
            copier.mark_step()
            copier.start(loads=[], saves=pairs)
            copier.finish_saves()
            sync()

        def load() -> None:  # host -> device
            copier.mark_step()
            copier.start(loads=pairs, saves=[])
            sync()

        save_s: list[float] = []
        load_s: list[float] = []
        for i in range(reps + 1):  # the first round warms allocators and caches: not timed
            t0 = time.perf_counter()
            save()
            t1 = time.perf_counter()
            load()
            t2 = time.perf_counter()
            if i:
                save_s.append(t1 - t0)
                load_s.append(t2 - t1)
        block_bytes = sum(t.numel() * t.element_size() for t in tensors) // num_blocks
        return {
            "blocks": blocks,
            "bytes": blocks * block_bytes,
            "save_s": statistics.median(save_s),
            "load_s": statistics.median(load_s),
            "device": device_name(),
        }
