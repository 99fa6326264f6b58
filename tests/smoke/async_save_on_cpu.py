"""`python -m training.entry` with the GPU's asynchronous checkpoint path switched on, on the CPU.

Test helper: without a GPU the engine saves synchronously, so the async path (Megatron's
AsyncCallsQueue, a forked writer process, publication from its finalize callback) would go untested
here. This points the queue's CUDA calls at the CPU (as training.cpu_mode does for the rest of
Megatron-Core) and builds the checkpointer as if on a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from megatron.core.dist_checkpointing.strategies import async_utils

from config.schema import TrainingConfig
from training import cpu_mode, entry
from training.checkpoint import store as checkpoint

_init = checkpoint.Checkpointer.__init__


def init(
    self: checkpoint.Checkpointer, cfg: TrainingConfig, run_dir: Path, device: str, **given: Any
) -> None:
    async_utils.torch = cpu_mode._CpuTorch()
    _init(self, cfg, run_dir, "cuda", **given)  # async_save takes effect on "cuda" only
    self.device = device
    assert self._async_queue is not None


checkpoint.Checkpointer.__init__ = init

if __name__ == "__main__":
    sys.exit(entry.main())
