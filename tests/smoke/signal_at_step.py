"""`python -m training.entry`, except that the last rank sends itself SIGUSR1 right after step N.

Test helper: an exit signal at a step the test knows (`sbatch --signal` sends it at a time), so that
"10 steps, stop, resume" stops at exactly 10. Only one rank is signalled: the ranks must agree among
themselves to stop. Run as a script under torchrun, with the repository on PYTHONPATH and
RECIPES_TEST_SIGNAL_AT_STEP=N in the environment. tests/smoke/run_many.py applies the same patch
when that variable is set, to every config of its launch: each `pretrain` call installs its own
exit-signal handlers and gives them back at its end, so each config sees its own signal.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

ENV = "RECIPES_TEST_SIGNAL_AT_STEP"


def signal_at_step(step: int) -> None:
    """Patch `Trainer._log`: once step `step` is logged, the last rank raises SIGUSR1, and the
    stop decision of that step, which comes next, sees it."""
    import torch.distributed as dist

    from training import engine

    log = engine.Trainer._log

    def _log_then_signal(self: engine.Trainer, *args: Any, **kwargs: Any) -> None:
        log(self, *args, **kwargs)
        if self.step == step and dist.get_rank() == dist.get_world_size() - 1:
            signal.raise_signal(signal.SIGUSR1)

    engine.Trainer._log = _log_then_signal


def signal_at_step_from_env() -> bool:
    """`signal_at_step(N)` when RECIPES_TEST_SIGNAL_AT_STEP=N is set; whether it was."""
    step = os.environ.get(ENV)
    if not step:
        return False
    signal_at_step(int(step))
    return True


if __name__ == "__main__":
    from training import entry

    signal_at_step(int(os.environ[ENV]))
    sys.exit(entry.main())
