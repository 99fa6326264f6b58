"""The input check once more, on each node of a Slurm job, before torchrun starts its ranks.

`recipes run` checks every input before the queue (launchers/inputs.py), but from the login node
it cannot see what only the compute nodes have: a path inside the container image, a node-local
filesystem (/raid), a mount the login node lacks. In the job, srun's one task per node runs

    python -m launchers.preflight <torchrun's arguments, among them --config <run dir>/config.yaml>

first (launchers/slurm.py NODE_WRAPPER), where the ranks will run and with their view of the paths (inside the container, from
their working directory). A problem is printed once per node, naming the field, the path and the
node, and the node's task exits 2 before any rank starts: no traceback per rank, no rendezvous
left waiting. Torch-free: it costs the job a second, not a model import.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from config.tree import ConfigError
from launchers.inputs import check_inputs
from launchers.profile import Profile
from training.entry import load_config

EXIT_INVALID = 2  # as `recipes check`: the config cannot run as given


def main(argv: list[str] | None = None) -> int:
    """`--config PATH`; other arguments are ignored, so that the Slurm job can hand over torchrun's
    whole command line (launchers/slurm.py NODE_WRAPPER) and the config checked is the ranks'."""
    parser = argparse.ArgumentParser(prog="python -m launchers.preflight", description=__doc__)
    parser.add_argument("--config", required=True, help="the run's resolved config.yaml")
    args, _ = parser.parse_known_args(argv)
    try:
        cfg = load_config(args.config, [])
        # The ranks run here, with the paths as given: the local executor's view of them.
        check_inputs(cfg, Profile(executor="local"), Path.cwd())
    except ConfigError as err:
        host = socket.gethostname()
        print(f"preflight on {host}: the ranks would fail on these inputs:\n{err}", file=sys.stderr)
        return EXIT_INVALID
    return 0


if __name__ == "__main__":
    sys.exit(main())
