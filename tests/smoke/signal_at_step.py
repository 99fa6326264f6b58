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

from training import engine, entry

STEP = int(os.environ["RECIPES_TEST_SIGNAL_AT_STEP"])
_log = engine.Trainer._log


def _log_then_signal(self: engine.Trainer, *args: Any, **kwargs: Any) -> None:
    """Step N is logged; the stop decision of that step comes next and sees the signal."""
    _log(self, *args, **kwargs)
    if self.step == STEP and dist.get_rank() == dist.get_world_size() - 1:
        signal.raise_signal(signal.SIGUSR1)


engine.Trainer._log = _log_then_signal

if __name__ == "__main__":
    sys.exit(entry.main())
