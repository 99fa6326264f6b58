"""`python -m training.entry`, except that the last rank sends itself SIGUSR1 right after step N.

Test helper: an exit signal at a step the test knows (`sbatch --signal` sends it at a time), so that
"10 steps, stop, resume" stops at exactly 10. Only one rank is signalled: the ranks must agree among
themselves to stop. Run as a script under torchrun, with the repository on PYTHONPATH and
RECIPES_TEST_SIGNAL_AT_STEP=N in the environment.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch.distributed as dist

from training import checkpoint, entry

STEP = int(os.environ["RECIPES_TEST_SIGNAL_AT_STEP"])
_after_step = checkpoint.CheckpointHook.after_step


def after_step(self: checkpoint.CheckpointHook, trainer: Any) -> None:
    if trainer.step == STEP and dist.get_rank() == dist.get_world_size() - 1:
        signal.raise_signal(signal.SIGUSR1)
    _after_step(self, trainer)


checkpoint.CheckpointHook.after_step = after_step

if __name__ == "__main__":
    sys.exit(entry.main())
