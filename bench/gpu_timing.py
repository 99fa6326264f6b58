"""How the GPU benchmarks time a call (bench/gpu_attention.py, bench/gpu_expert_gemm.py): the
median wall seconds of `iters` calls after `warmup` untimed ones, each call between two device
synchronizations, since a CUDA launch returns before its kernels end. On the CPU (the dry runs)
there is nothing to synchronize."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(run: Callable[[], object], device: str, warmup: int, iters: int) -> float:
    """Median seconds of `run()` on `device` ("cuda" or "cpu") over `iters` calls after `warmup`."""
    import torch

    cuda = device == "cuda"
    times = []
    for i in range(warmup + iters):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)
